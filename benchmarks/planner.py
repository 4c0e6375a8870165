"""Figure 6: the capacity planner: plan cost against the optimum and two naive policies, and
planning time for 10,000 steps over 500 pools.

- **Cost.** On generated jobs with quotas, commitments, spot, blocks and data in several
  regions, the planner's greedy plan is priced against the optimum that an integer program
  finds (HiGHS through `scipy.optimize.milp`, same cost model, same 15-minute quota grid)
  and against two naive policies placed with the same quota bookkeeping: *always
  on-demand* and *cheapest sticker price* (lowest $/GPU-h, blind to egress, rework and
  commitments). Every plan is priced with the full cost model.
- **Time.** `plan_job` on 10,000 steps × 500 pools: the cost model for every pair
  (`assess`), then the greedy placement.
"""

from __future__ import annotations

import datetime as dt
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from shared_resources.placement.cost_model import PlanContext, assess
from shared_resources.placement.planner import SLOT_HOURS, assign, greedy, plan_job
from shared_resources.catalog.pools import Catalog, EgressRates, EgressTable, Pool, Purchasing
from shared_resources.catalog.step_spec import DatasetRef, StepSpec

T0 = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)
REGIONS = [("aws", "us-east-1"), ("aws", "us-west-2"), ("gcp", "us-central1"), ("azure", "eastus")]


def make_catalog(n_pools: int, rng: np.random.Generator, horizon_hours: float) -> Catalog:
    pools = {}
    modes = [Purchasing.on_demand, Purchasing.spot, Purchasing.reserved, Purchasing.block]
    for k in range(n_pools):
        provider, region = REGIONS[k % len(REGIONS)]
        mode = modes[(k // len(REGIONS)) % len(modes)]
        nodes = int(rng.choice([2, 4, 8]))
        base = float(rng.uniform(2.0, 4.0))
        fields: dict[str, Any] = dict(
            name=f"p{k:03d}-{mode.value}", provider=provider, region=region, backend="local", purchasing=mode,
            accelerator="h100-80gb", gpus_per_node=8, nodes=nodes,
            interconnect_domain_gpus=8 * nodes if rng.random() < 0.5 else None,
            price_per_gpu_hour=round(base * {"spot": 0.35, "on_demand": 1.0, "reserved": 0.8, "block": 0.7}[mode.value], 2),
        )
        if mode is Purchasing.spot:
            fields["interruption_rate_per_hour"] = float(rng.uniform(0.02, 0.2))
        if mode is Purchasing.reserved:
            fields["committed_gpu_hours"] = float(rng.uniform(100, 600))
            fields["marginal_price_per_gpu_hour"] = 0.3
        if mode is Purchasing.block:
            start = float(rng.uniform(0, horizon_hours / 2))
            fields["window_start"] = T0 + dt.timedelta(hours=start)
            fields["window_end"] = T0 + dt.timedelta(hours=start + horizon_hours / 2)
        pools[fields["name"]] = Pool(**fields)
    egress = EgressTable(default=EgressRates(cross_region=0.02, cross_provider=0.09, gbps=10))
    return Catalog(pools, egress=egress, files=["generated"])


def make_steps(n_steps: int, rng: np.random.Generator, horizon_hours: float) -> list[StepSpec]:
    steps = []
    for i in range(n_steps):
        provider, region = REGIONS[int(rng.integers(len(REGIONS)))]
        gpus = int(rng.choice([1, 2, 4, 8, 16, 32]))
        steps.append(StepSpec(
            name=f"s{i:05d}", entry_point="x", tenant="t", gpus=gpus, nodes=max(1, gpus // 8),
            tightly_coupled=bool(gpus >= 16 and rng.random() < 0.5), checkpoints=bool(rng.random() < 0.7),
            checkpoint_seconds=float(rng.uniform(10, 600)), expected_hours=float(rng.uniform(1, 12)),
            start=T0 + dt.timedelta(hours=float(rng.uniform(0, horizon_hours))),
            datasets=[DatasetRef(name="d", size_gb=float(rng.uniform(10, 3000)), provider=provider, region=region)],
        ))
    return steps


def optimum(a) -> tuple[float, str]:
    """The cheapest plan under the same model, by HiGHS (scipy.optimize.milp)."""
    S, P = a.feasible.shape
    pairs = np.argwhere(a.feasible)
    n = len(pairs)
    price = np.array([p.price_per_gpu_hour for p in a.pools])
    marginal = np.array([p.marginal_price_per_gpu_hour for p in a.pools])
    committed = [j for j, p in enumerate(a.pools) if p.committed_gpu_hours is not None]
    cov_pairs = [k for k, (i, j) in enumerate(pairs) if j in committed]
    m = len(cov_pairs)
    h = a.gpu_hours[pairs[:, 0], pairs[:, 1]]
    c = np.concatenate([price[pairs[:, 1]] * h + a.egress_usd[pairs[:, 0], pairs[:, 1]],
                        -(price - marginal)[pairs[cov_pairs, 1]]])
    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0

    def add(entries, lower, upper):
        nonlocal r
        for col, val in entries:
            rows.append(r), cols.append(col), vals.append(val)
        lo.append(lower), hi.append(upper)
        r += 1

    by_step: dict[int, list[int]] = {}
    for k, (i, _) in enumerate(pairs):
        by_step.setdefault(int(i), []).append(k)
    for i in range(S):
        add([(k, 1.0) for k in by_step.get(i, [])], 1, 1)  # every step on exactly one pool
    for q, k in enumerate(cov_pairs):
        add([(n + q, 1.0), (k, -h[k])], -np.inf, 0)  # covered hours only on the chosen pool
    for j in committed:
        add([(n + q, 1.0) for q, k in enumerate(cov_pairs) if pairs[k, 1] == j], -np.inf, a.pools[j].committed_gpu_hours)
    s0 = np.floor(a.start_hours / SLOT_HOURS).astype(int)
    s1 = np.ceil(a.end_hours / SLOT_HOURS).astype(int)
    gpus = np.array([max(s.gpus, 1) for s in a.steps], dtype=float)
    for j in range(P):
        on_j = [k for k in range(n) if pairs[k, 1] == j]
        for t in sorted({int(s0[pairs[k, 0]]) for k in on_j}):
            active = [(k, gpus[pairs[k, 0]]) for k in on_j if s0[pairs[k, 0]] <= t < max(s1[pairs[k, 0], j], s0[pairs[k, 0]] + 1)]
            add(active, -np.inf, a.pools[j].total_gpus)
    A = coo_matrix((vals, (rows, cols)), shape=(r, n + m)).tocsr()
    integrality = np.concatenate([np.ones(n), np.zeros(m)])
    upper = np.concatenate([np.ones(n), np.full(m, np.inf)])
    res = milp(c, constraints=LinearConstraint(A, lo, hi), integrality=integrality, bounds=Bounds(0, upper),
               options={"time_limit": 60})
    return (float(res.fun) if res.x is not None else float("nan")), res.message


@dataclass
class CostCase:
    seed: int
    steps: int
    pools: int
    planner_usd: float
    planner_unplaced: int
    optimum_usd: float
    optimum_status: str
    on_demand_usd: float
    on_demand_unplaced: int
    sticker_usd: float
    sticker_unplaced: int
    milp_s: float
    planner_s: float

    @property
    def gap(self) -> float | None:
        """Planner ÷ optimum − 1; None when the planner left a step without room (not comparable)."""
        return None if self.planner_unplaced else self.planner_usd / self.optimum_usd - 1.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gap_to_optimum": self.gap}


def _policy_cost(a, result) -> tuple[float, int]:
    placed = result.choice >= 0
    cost = float(result.compute_usd[placed].sum() + a.egress_usd[np.flatnonzero(placed), result.choice[placed]].sum())
    return cost, len(result.unplaced)  # cost of the steps it could place


def cost_case(seed: int, n_steps: int = 60, n_pools: int = 16, horizon_hours: float = 48.0) -> CostCase:
    rng = np.random.default_rng(seed)
    catalog = make_catalog(n_pools, rng, horizon_hours)
    steps = make_steps(n_steps, rng, horizon_hours)
    a = assess(steps, list(catalog.pools.values()), PlanContext(epoch=T0, egress=catalog.egress))
    started = time.perf_counter()
    # what plan_job does after `assess`; called directly so a step left without room is counted, not raised
    planned = _policy_cost(a, greedy(a))
    planner_s = time.perf_counter() - started
    started = time.perf_counter()
    best, status = optimum(a)
    milp_s = time.perf_counter() - started
    by_start = list(np.argsort(a.start_hours, kind="stable"))
    on_demand = np.array([p.purchasing is Purchasing.on_demand for p in a.pools])[None, :]
    od = _policy_cost(a, assign(a, a.feasible & on_demand, by_start))
    sticker_score = np.broadcast_to(np.array([p.price_per_gpu_hour for p in a.pools])[None, :], a.feasible.shape)
    st = _policy_cost(a, assign(a, a.feasible, by_start, score=sticker_score))
    return CostCase(seed, n_steps, n_pools, planned[0], planned[1], best, status, od[0], od[1], st[0], st[1], milp_s, planner_s)


@dataclass
class TimeCase:
    steps: int
    pools: int
    assess_s: list[float]
    plan_s: list[float]
    evidence_one_step_s: float
    cost_usd: float

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "assess_median_s": statistics.median(self.assess_s), "plan_median_s": statistics.median(self.plan_s)}


def time_case(n_steps: int = 10_000, n_pools: int = 500, repeats: int = 3, horizon_hours: float = 24 * 14) -> TimeCase:
    rng = np.random.default_rng(7)
    catalog = make_catalog(n_pools, rng, horizon_hours)
    steps = make_steps(n_steps, rng, horizon_hours)
    pools = list(catalog.pools.values())
    assess_s, plan_s = [], []
    plan = None
    for _ in range(repeats):
        started = time.perf_counter()
        assess(steps, pools, PlanContext(epoch=T0, egress=catalog.egress))
        assess_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        plan = plan_job("bench", steps, catalog, epoch=T0)
        plan_s.append(time.perf_counter() - started)
    started = time.perf_counter()
    plan.placement(0).evidence()
    evidence_s = time.perf_counter() - started
    return TimeCase(n_steps, n_pools, assess_s, plan_s, evidence_s, plan.totals()["cost_usd"])


def run(repeats: int = 3, seeds: tuple[int, ...] = (1, 2, 3, 4, 5)) -> tuple[list[CostCase], TimeCase]:
    return [cost_case(seed) for seed in seeds], time_case(repeats=repeats)


if __name__ == "__main__":
    cases, timing = run()
    for c in cases:
        print(c.to_dict())
    print(timing.to_dict())
