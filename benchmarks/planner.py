"""Figure 6: the capacity planner: plan cost against the optimum and two naive policies, planning
time for 10,000 steps over 500 pools, and the memory of `sinewgrid plan --json --no-evidence` there.

- **Cost.** On 40 generated jobs (10–200 steps, 5–40 pools, quotas from tight to loose) with
  commitments, spot, blocks and data in several regions, the planner's plan (`plan_job`: exact
  by HiGHS within its time budget, else greedy + local search) is priced against the optimum of
  this benchmark's own integer program (`optimum` below: written apart from the planner's
  `placement/exact.py`, so the figure is not the planner checking itself), and against two naive
  policies placed with the same quota bookkeeping: *always on-demand* and *cheapest sticker
  price*. A job the planner refuses while the reference places it counts as wrongly refused.
- **Time.** `plan_job` on 10,000 steps × 500 pools, beside its cost model alone (`assess`).
- **Memory.** `sinewgrid plan JOB --pools CATALOG --json --no-evidence` on the same job written as
  files, in a child process (peak RSS from `resource.getrusage(RUSAGE_CHILDREN)`), beside a child
  that only reads the same files (Python, the libraries, the job and the catalog).
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

from control_plane.placement.cost_model import PlanContext, assess
from control_plane.placement.exact import solver_output_to_stderr
from control_plane.placement.greedy import SLOT_HOURS, assign, plan_cost
from control_plane.placement.planner import InfeasiblePlanError, plan_job
from control_plane.catalog.egress import EgressRates, EgressTable
from control_plane.catalog.pools import Catalog, Pool, Purchasing
from control_plane.catalog.step_spec import DatasetRef, StepSpec

T0 = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)
REGIONS = [("aws", "us-east-1"), ("aws", "us-west-2"), ("gcp", "us-central1"), ("azure", "eastus")]


# Every third pool is not 8-GPU H100 nodes: GB200 NVL72 racks (4 of 18 nodes), AMD MI300X, TPU v5p
# slices (2x2x2: 8 chips on 2 hosts, held whole), or Trainium2 UltraServers (4 nodes of 16 chips).
SHAPES: list[dict[str, Any]] = [
    {"accelerator": "gb200", "gpus_per_node": 4, "nodes_per_domain": 18, "topology": {"domain": "nvlink"}},
    {"accelerator": "mi300x", "gpus_per_node": 8},
    {"accelerator": "tpu-v5p", "gpus_per_node": 4, "topology": {"domain": "tpu_slice", "slice": "2x2x2", "cross_domain_gb_per_s": 25}},
    {"accelerator": "trn2", "gpus_per_node": 16, "nodes_per_domain": 4, "topology": {"domain": "ultraserver"}},
]
# What the generated steps' code runs on: CUDA only (half of them), CUDA or ROCm, JAX on TPU or
# CUDA, and CUDA with a Trainium port not yet done.
RUNS_ON: list[dict[str, Any] | None] = [
    None, None, {"nvidia": 1.0, "amd": 0.85}, {"nvidia": 1.0, "tpu": 1.3},
    {"nvidia": 1.0, "trainium": {"throughput": 1.1, "needs_porting": True, "porting_usd": 2000}},
]


def _shape(k: int, rng: np.random.Generator) -> tuple[dict[str, Any], int]:
    """Pool k's accelerator and shape, and its nodes."""
    if k % 3 != 2:
        nodes = int(rng.choice([2, 4, 8]))
        return {"accelerator": "h100-80gb", "gpus_per_node": 8, "interconnect_domain_gpus": 8 * nodes if rng.random() < 0.5 else None}, nodes
    shape = SHAPES[(k // 3) % len(SHAPES)]
    nodes = {"gb200": 72, "trn2": 8}.get(shape["accelerator"], int(rng.choice([2, 4, 8])))
    return shape, nodes


def make_catalog(n_pools: int, rng: np.random.Generator, horizon_hours: float, quota_scale: float = 1.0) -> Catalog:
    pools = {}
    modes = [Purchasing.on_demand, Purchasing.spot, Purchasing.reserved, Purchasing.block]
    for k in range(n_pools):
        provider, region = REGIONS[k % len(REGIONS)]
        mode = modes[(k // len(REGIONS)) % len(modes)]
        shape, nodes = _shape(k, rng)
        base = float(rng.uniform(2.0, 4.0))
        fields: dict[str, Any] = dict(
            name=f"p{k:03d}-{mode.value}", provider=provider, region=region, backend="local", purchasing=mode, nodes=nodes,
            price_per_gpu_hour=round(base * {"spot": 0.35, "on_demand": 1.0, "reserved": 0.8, "block": 0.7}[mode.value], 2),
            **shape,
        )
        if quota_scale < 1.0:
            fields["quota_gpus"] = max(8, int(fields["gpus_per_node"] * nodes * quota_scale))
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
        gpus = int(rng.choice([1, 2, 4, 8, 16, 32, 96], p=[0.16] * 6 + [0.04]))
        coupled = bool(gpus >= 16 and rng.random() < 0.5)
        # A big coupled gang may be split across fast domains, the slower links costed.
        span = {"span_domains": True, "allreduce_gb": float(rng.uniform(2, 140)), "compute_seconds_per_step": float(rng.uniform(0.5, 4))} if coupled and gpus >= 96 else {}
        steps.append(StepSpec(
            name=f"s{i:05d}", entry_point="x", tenant="t", gpus=gpus, nodes=gpus // 4 if gpus >= 96 else max(1, gpus // 8),
            runs_on=RUNS_ON[i % len(RUNS_ON)], **span,
            tightly_coupled=coupled, checkpoints=bool(rng.random() < 0.7),
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
    gpus = np.asarray(a.held_gpus)  # GPUs held: whole nodes for a gang
    for j in range(P):
        on_j = [k for k in range(n) if pairs[k, 1] == j]
        for t in sorted({int(s0[pairs[k, 0]]) for k in on_j}):
            active = [(k, gpus[pairs[k, 0], j]) for k in on_j if s0[pairs[k, 0]] <= t < max(s1[pairs[k, 0], j], s0[pairs[k, 0]] + 1)]
            add(active, -np.inf, a.pools[j].total_gpus)
    A = coo_matrix((vals, (rows, cols)), shape=(r, n + m)).tocsr()
    integrality = np.concatenate([np.ones(n), np.zeros(m)])
    upper = np.concatenate([np.ones(n), np.full(m, np.inf)])
    with solver_output_to_stderr():
        res = milp(c, constraints=LinearConstraint(A, lo, hi), integrality=integrality, bounds=Bounds(0, upper),
                   options={"time_limit": 120, "mip_rel_gap": 1e-6})
    status = {0: "optimal", 1: "time limit", 2: "infeasible"}.get(res.status, str(res.message))
    return (float(res.fun) if res.x is not None else float("nan")), status


@dataclass
class CostCase:
    seed: int
    steps: int
    pools: int
    quota_scale: float
    planner_usd: float | None  # None: the planner refused the job
    planner_unplaced: int
    method: str
    gap_bound: float | None  # what the planner says of its own plan
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
        """Planner ÷ optimum − 1; None when either has no plan."""
        if self.planner_usd is None or self.optimum_status != "optimal":
            return None
        return self.planner_usd / self.optimum_usd - 1.0 if self.optimum_usd else 0.0

    @property
    def wrongly_refused(self) -> bool:
        return self.planner_usd is None and self.optimum_status == "optimal"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gap_to_optimum": self.gap, "wrongly_refused": self.wrongly_refused}


def cost_case(seed: int, horizon_hours: float = 48.0) -> CostCase:
    """Job `seed` of 40: its size grows with the seed (10–200 steps, 5–40 pools), its quotas cycle
    from tight (a quarter of each pool's GPUs) to loose (all of them)."""
    rng = np.random.default_rng(seed)
    n_steps = int(np.interp(seed, (1, 40), (10, 200)))
    n_pools = int(np.interp(seed, (1, 40), (5, 40)))
    quota_scale = (0.5, 0.65, 0.8, 1.0)[seed % 4]
    catalog = make_catalog(n_pools, rng, horizon_hours, quota_scale)
    steps = make_steps(n_steps, rng, horizon_hours)
    a = assess(steps, list(catalog.pools.values()), PlanContext(epoch=T0, egress=catalog.egress))
    started = time.perf_counter()
    try:
        plan = plan_job("bench", steps, catalog, epoch=T0)
        planned: tuple[float | None, int, str, float | None] = (plan.totals()["cost_usd"], 0, plan.method.name, plan.method.gap_bound)
    except InfeasiblePlanError as refused:
        planned = (None, len(refused.unplaced), "refused", None)
    planner_s = time.perf_counter() - started
    started = time.perf_counter()
    best, status = optimum(a)
    milp_s = time.perf_counter() - started
    by_start = list(np.argsort(a.start_hours, kind="stable"))
    on_demand = np.array([p.purchasing is Purchasing.on_demand for p in a.pools])[None, :]
    od = assign(a, a.feasible & on_demand, by_start)
    sticker_score = np.broadcast_to(np.array([p.price_per_gpu_hour for p in a.pools])[None, :], a.feasible.shape)
    st = assign(a, a.feasible, by_start, score=sticker_score)
    return CostCase(seed, n_steps, n_pools, quota_scale, *planned, best, status, plan_cost(a, od), len(od.unplaced),
                    plan_cost(a, st), len(st.unplaced), milp_s, planner_s)


@dataclass
class TimeCase:
    steps: int
    pools: int
    assess_s: list[float]
    plan_s: list[float]
    plan_cpu_s: list[float]
    method: str
    gap_bound: float | None
    evidence_one_step_s: float
    cost_usd: float
    cli_peak_mb: float
    cli_read_only_peak_mb: float
    cli_s: float

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "assess_median_s": statistics.median(self.assess_s), "plan_median_s": statistics.median(self.plan_s)}


def time_case(n_steps: int = 10_000, n_pools: int = 500, repeats: int = 3, horizon_hours: float = 24 * 14) -> TimeCase:
    rng = np.random.default_rng(7)
    catalog = make_catalog(n_pools, rng, horizon_hours)
    steps = make_steps(n_steps, rng, horizon_hours)
    pools = list(catalog.pools.values())
    assess_s, plan_s, plan_cpu_s = [], [], []
    plan = None
    for _ in range(repeats):
        started = time.perf_counter()
        assess(steps, pools, PlanContext(epoch=T0, egress=catalog.egress))
        assess_s.append(time.perf_counter() - started)
        plan = None  # the previous plan's arrays are freed before the next is made
        started, cpu = time.perf_counter(), time.process_time()
        plan = plan_job("bench", steps, catalog, epoch=T0)
        plan_s.append(time.perf_counter() - started)
        plan_cpu_s.append(time.process_time() - cpu)
    started = time.perf_counter()
    plan.placement(0).evidence()
    evidence_s = time.perf_counter() - started
    peak, read_only, cli_s = cli_memory(steps, catalog)
    return TimeCase(n_steps, n_pools, assess_s, plan_s, plan_cpu_s, plan.method.name, plan.method.gap_bound, evidence_s,
                    plan.totals()["cost_usd"], peak, read_only, cli_s)


def _job_yaml(steps: list[StepSpec]) -> dict[str, Any]:
    datasets, job_steps = {}, {}
    for s in steps:
        d = s.datasets[0]
        datasets[f"d-{s.name}"] = {"size_gb": d.size_gb, "provider": d.provider, "region": d.region}
        job_steps[s.name] = {
            "gpus": s.gpus, "nodes": s.nodes, "tightly_coupled": s.tightly_coupled, "checkpoints": s.checkpoints,
            **s.model_dump(mode="json", include={"runs_on", "span_domains", "allreduce_gb", "compute_seconds_per_step"}, exclude_defaults=True),
            "checkpoint_seconds": s.checkpoint_seconds, "expected_hours": s.expected_hours,
            "start_hours": (s.start - T0).total_seconds() / 3600, "datasets": [f"d-{s.name}"],
        }
    return {"job": "bench", "tenant": "t", "start": T0.isoformat(), "datasets": datasets, "steps": job_steps}


def cli_memory(steps: list[StepSpec], catalog: Catalog) -> tuple[float, float, float]:
    """Peak RSS (MB) of `sinewgrid plan --json --no-evidence` on the job as files, in a child process,
    and of a child that only reads the same files; and the plan command's wall time."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    import yaml

    with tempfile.TemporaryDirectory(prefix="sinewgrid-plan-bench-") as folder:
        job, pools = Path(folder) / "job.yaml", Path(folder) / "pools.yaml"
        job.write_text(yaml.safe_dump(_job_yaml(steps), sort_keys=False))
        pools.write_text(yaml.safe_dump({"pools": {
            name: p.model_dump(mode="json", exclude={"name"}, exclude_defaults=True) for name, p in catalog.pools.items()
        }, "egress": catalog.egress.model_dump(mode="json")}, sort_keys=False))
        probe = (
            "import resource, subprocess, sys, time\n"
            "started = time.perf_counter()\n"
            "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, time.perf_counter() - started)\n"
        )
        plan = [sys.executable, "-m", "sinewgrid.cli", "plan", str(job), "--pools", str(pools), "--json", "--no-evidence"]
        read = [sys.executable, "-c", (
            "import sys; from control_plane.placement.job_files import load_job; "
            "from control_plane.catalog.pools import load_catalog; import sinewgrid.cli; "
            "load_job(sys.argv[1]).step_specs(); load_catalog(sys.argv[2])"
        ), str(job), str(pools)]
        peak, seconds = map(float, subprocess.run([sys.executable, "-c", probe, *plan], check=True, capture_output=True, text=True).stdout.split())
        read_only, _ = map(float, subprocess.run([sys.executable, "-c", probe, *read], check=True, capture_output=True, text=True).stdout.split())
    return peak, read_only, seconds


SEEDS = tuple(range(1, 41))


def run(repeats: int = 3, seeds: tuple[int, ...] = SEEDS) -> tuple[list[CostCase], TimeCase]:
    return [cost_case(seed) for seed in seeds], time_case(repeats=repeats)


def tables(cases: list[CostCase], timing: TimeCase):
    """Figure 6's tables: the 40 jobs against the optimum, and planning time and memory at 10,000 × 500."""
    from rich.table import Table

    gaps = [c.gap for c in cases if c.gap is not None]
    refused = sum(c.wrongly_refused for c in cases)
    cost = Table(
        title=(f"6a. Plan cost against the optimum on {len(cases)} generated jobs: worst {max(gaps, default=0):+.2%}, "
               f"median {statistics.median(gaps) if gaps else 0:+.2%}; wrongly refused {refused}"),
        caption=(
            "Jobs of 10–200 steps over 48 h on 5–40 pools (on-demand, spot, reserved with a commitment, blocks with windows; "
            "quota = quota scale × the pool's GPUs), each step reading a dataset in one of 4 regions. Optimum: this benchmark's "
            "own integer program (HiGHS via scipy.optimize.milp). Gap = planner ÷ optimum − 1; 'gap bound' is what the plan "
            "says of itself. Naive policies: same quota bookkeeping, steps in start order; (n) = steps they could not place."
        ),
        title_justify="left",
        caption_justify="left",
    )
    for column in ("Seed", "Steps × pools", "Quota", "Method", "Planner $", "Optimum $", "Gap", "Gap bound", "On-demand $ (n)", "Sticker $ (n)", "Planner s", "Ref. MILP s"):
        cost.add_column(column, justify="right", style="bold" if column == "Gap" else None)
    for c in cases:
        cost.add_row(
            str(c.seed), f"{c.steps} × {c.pools}", f"{c.quota_scale:.2f}", c.method,
            "refused" if c.planner_usd is None else f"{c.planner_usd:,.0f}",
            f"{c.optimum_usd:,.0f}" if c.optimum_status == "optimal" else c.optimum_status,
            "—" if c.gap is None else f"{c.gap:+.2%}", "—" if c.gap_bound is None else f"≤ {c.gap_bound:.2%}",
            f"{c.on_demand_usd:,.0f} ({c.on_demand_unplaced})", f"{c.sticker_usd:,.0f} ({c.sticker_unplaced})",
            f"{c.planner_s:.2f}", f"{c.milp_s:.2f}",
        )
    speed = Table(
        title=f"6b. Planning {timing.steps:,} steps × {timing.pools} pools: time through the Python API, memory through the CLI",
        caption=(
            f"{len(timing.plan_s)} repeats (time.perf_counter; CPU = time.process_time), median. Baseline: the cost model alone "
            "(assess() for every pair). CLI: `sinewgrid plan --json --no-evidence` in a child process, peak RSS, beside a child "
            "that only reads the same job and catalog files."
        ),
        title_justify="left",
        caption_justify="left",
    )
    for column in ("Cost model s", "Plan s", "Plan CPU s", "Plan ÷ cost model", "Method", "Gap bound", "CLI peak MB", "Read-only peak MB", "CLI s"):
        speed.add_column(column, justify="right")
    plan_s, assess_s = statistics.median(timing.plan_s), statistics.median(timing.assess_s)
    speed.add_row(f"{assess_s:.2f}", f"{plan_s:.2f}", f"{statistics.median(timing.plan_cpu_s):.2f}", f"{plan_s / assess_s:.1f}×",
                  timing.method, "—" if timing.gap_bound is None else f"≤ {timing.gap_bound:.1%}",
                  f"{timing.cli_peak_mb:,.0f}", f"{timing.cli_read_only_peak_mb:,.0f}", f"{timing.cli_s:.1f}")
    return cost, speed


if __name__ == "__main__":
    cases, timing = run()
    for c in cases:
        print(c.to_dict())
    print(timing.to_dict())
