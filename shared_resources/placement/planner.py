"""The capacity plan for a whole job: which pool each step gets, its failover order, the totals.

Greedy, not an integer program, on purpose: each step's choice is "the cheapest pool
that still has room, given the steps placed before it", which a person can check line
by line against the evidence; it is deterministic; and it plans 10,000 steps over 500
pools in seconds (benchmarks/planner.py measures it, and its cost gap to the optimum
HiGHS finds for the same instances). Steps are placed hardest first: the step that
would lose the most by not getting its cheapest pool (its *regret*) goes first, so a
scarce commitment or quota goes where it saves the most.

Shared limits between steps:

- **quota**: a pool's GPUs (`quota_gpus`, else nodes × GPUs per node, standby spares left
  out) held by the steps running on it at the same time, on a 15-minute grid; a gang holds
  whole nodes (nodes × the pool's GPUs per node);
- **commitment**: reserved/block GPU-hours already paid for, used up step by step;
- **budget**: the job's total.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from shared_resources.placement.cost_model import RULES, Assessment, PlanContext, assess, spare_share
from shared_resources.placement.ranking import PlacementPlan, refusal_reasons, step_plan
from shared_resources.catalog.pools import Catalog, Purchasing
from shared_resources.catalog.step_spec import StepSpec

SLOT_HOURS = 0.25


class InfeasiblePlanError(RuntimeError):
    """No plan meets the job's constraints; the message names the constraint and the steps."""


@dataclass
class Assignment:
    """Choices of one policy: pool index per step (-1: none), failover order, true cost terms."""

    choice: np.ndarray
    failover: list[list[int]]
    quota_refusals: dict[int, dict[int, str]]
    compute_usd: np.ndarray
    covered_gpu_hours: np.ndarray
    unplaced: list[int] = field(default_factory=list)
    # Per step, the GPU-hours each commitment still had when the step was placed.
    committed_left: dict[int, dict[str, float]] = field(default_factory=dict)


def assign(a: Assessment, allowed: np.ndarray, order: list[int], score: np.ndarray | None = None) -> Assignment:
    """Place steps in `order`, each on the cheapest allowed pool with quota room, or the one
    with the lowest `score` if given (a naive policy's own idea of cheap).

    Costs are always the true ones (commitment used up in this order), whatever the score.
    """
    S, P = a.feasible.shape
    quota = np.array([p.total_gpus for p in a.pools], dtype=float)
    left = np.array([p.committed_gpu_hours or 0.0 for p in a.pools], dtype=float)
    price = np.array([p.price_per_gpu_hour for p in a.pools])
    marginal = np.array([p.marginal_price_per_gpu_hour for p in a.pools])
    by_name = np.argsort(np.argsort([p.name for p in a.pools], kind="stable"))  # each pool's place in name order
    s0 = np.floor(a.start_hours / SLOT_HOURS).astype(int)
    s1 = np.where(np.isfinite(a.end_hours), np.ceil(a.end_hours / SLOT_HOURS), s0[:, None] + 1).astype(int)
    s0 = np.maximum(s0, 0)
    horizon = int(max(s1[a.feasible].max(initial=1), s0.max(initial=0) + 1)) + 1
    usage = np.zeros((P, horizon))
    held = a.held_gpus  # [S, P]: whole nodes for a gang
    choice = np.full(S, -1)
    failover: list[list[int]] = [[] for _ in range(S)]
    refusals: dict[int, dict[int, str]] = {}
    compute = np.zeros(S)
    covered_out = np.zeros(S)
    unplaced = []
    committed_pools = [j for j, p in enumerate(a.pools) if p.committed_gpu_hours is not None]
    snapshots: dict[int, dict[str, float]] = {}
    for i in order:
        snapshots[i] = {a.pools[j].name: float(left[j]) for j in committed_pools}
        cands = np.flatnonzero(allowed[i])
        if cands.size == 0:
            unplaced.append(i)
            continue
        ends = np.clip(s1[i, cands], s0[i] + 1, horizon)
        window = usage[cands, s0[i] : ends.max()]
        peak = np.maximum.accumulate(window, axis=1)[np.arange(cands.size), ends - s0[i] - 1]
        room = peak + held[i, cands] <= quota[cands]
        covered = np.minimum(a.gpu_hours[i, cands], left[cands])
        true_cost = price[cands] * (a.gpu_hours[i, cands] - covered) + marginal[cands] * covered + a.egress_usd[i, cands]
        fits_budget = true_cost <= (a.steps[i].budget_usd if a.steps[i].budget_usd is not None else math.inf)
        ok = room & fits_budget
        key = true_cost if score is None else score[i, cands]
        rank = np.lexsort((by_name[cands], a.moved_gb[i, cands], np.round(key, 6)))  # ties: less data moved, then the pool's name
        failover[i] = [int(cands[r]) for r in rank if ok[r]]
        refusals[i] = {
            int(cands[r]): (
                f"quota: {peak[r]:.0f} of {quota[cands[r]]:.0f} GPUs already planned on it during "
                f"{_moment(a, s0[i] * SLOT_HOURS)} → {_moment(a, ends[r] * SLOT_HOURS)}; step needs {held[i, cands[r]]:.0f}"
                f"{' (a gang takes whole nodes)' if a.steps[i].gang and held[i, cands[r]] > a.steps[i].gpus else ''}"
                if not room[r]
                else f"expected cost ${true_cost[r]:,.2f} exceeds budget ${a.steps[i].budget_usd:,.2f} once earlier steps used the commitment"
            )
            for r in range(cands.size)
            if not ok[r]
        }
        if not failover[i]:
            unplaced.append(i)
            continue
        j = failover[i][0]
        r = int(np.searchsorted(cands, j))
        choice[i] = j
        usage[j, s0[i] : max(s1[i, j], s0[i] + 1)] += held[i, j]
        left[j] -= covered[r]
        compute[i] = price[j] * (a.gpu_hours[i, j] - covered[r]) + marginal[j] * covered[r]
        covered_out[i] = covered[r]
    return Assignment(choice, failover, refusals, compute, covered_out, unplaced, snapshots)


def regret_order(a: Assessment) -> list[int]:
    """Hardest steps first: largest gap between best and second-best cost, then most GPU-hours."""
    cost = np.where(a.feasible, a.cost_usd, np.inf)
    two = np.sort(cost, axis=1)[:, :2] if cost.shape[1] >= 2 else np.hstack([cost, np.full((cost.shape[0], 1), np.inf)])
    with np.errstate(invalid="ignore"):
        regret = np.where(np.isinf(two[:, 1]), np.inf, two[:, 1] - two[:, 0])
    best_hours = np.where(a.feasible, a.gpu_hours, 0).max(axis=1, initial=0)
    return list(np.lexsort((a.start_hours, -best_hours, -np.nan_to_num(regret, posinf=1e18))))


def size_order(a: Assessment) -> list[int]:
    """Biggest steps first (GPUs, then GPU-hours): packs tight quotas better than cost regret."""
    gpus = np.array([max(s.gpus, 1) for s in a.steps])
    best_hours = np.where(a.feasible, a.gpu_hours, 0).max(axis=1, initial=0)
    return list(np.lexsort((a.start_hours, -best_hours, -gpus)))


def greedy(a: Assessment) -> Assignment:
    """Place every step greedily, hardest first (cost regret); when that leaves a step without
    quota room, try again biggest first and keep whichever places more steps (then the cheaper)."""
    result = assign(a, a.feasible, regret_order(a))
    if result.unplaced:
        other = assign(a, a.feasible, size_order(a))

        def total(r: Assignment) -> float:
            placed = np.flatnonzero(r.choice >= 0)
            return float(r.compute_usd[placed].sum() + a.egress_usd[placed, r.choice[placed]].sum())

        if (len(other.unplaced), total(other)) < (len(result.unplaced), total(result)):
            result = other
    return result


def _moment(a: Assessment, hours: float) -> str:
    return (a.context.epoch + dt.timedelta(hours=float(hours))).strftime("%Y-%m-%d %H:%M UTC")


def explain_infeasible(a: Assessment, i: int, quota: dict[int, str] | None = None) -> str:
    """Which constraint no pool meets for step i, in words."""
    step = a.steps[i]
    refused_by = {rule: int(mask[i].sum()) for rule, mask in a.refused.items()}
    every = [r for r, n in refused_by.items() if n == len(a.pools)]
    lines = [f"step `{step.name}`: no pool meets every constraint."]
    if every:
        lines.append(f"  No pool meets: {', '.join(every)}.")
    elif quota:
        lines.append("  Quota: every pool that fits is fully planned at that time.")
    failing = [(sum(m[i, j] for m in a.refused.values()), j) for j in range(len(a.pools))]
    for _, j in sorted(failing)[:3]:
        reasons = refusal_reasons(a, i, j) + ([quota[j]] if quota and j in quota else [])
        lines.append(f"  closest: {a.pools[j].name}: {'; '.join(reasons)}")
    if not a.pools:
        lines.append("  the catalog holds no pools.")
    return "\n".join(lines)


@dataclass
class JobPlan:
    """A capacity plan: per step the chosen pool, failover order, cost and checkpoint cadence."""

    name: str
    assessment: Assessment
    assignment: Assignment
    catalog: Catalog
    budget_usd: float | None = None

    @property
    def steps(self) -> list[StepSpec]:
        return self.assessment.steps

    def placement(self, i: int) -> PlacementPlan:
        """Step i's ranked pools (the failover order) and the evidence for every pool."""
        a = self.assessment
        context = replace(a.context, committed_left=self.assignment.committed_left.get(i))
        single = assess([a.steps[i]], a.pools, context)
        return step_plan(single, 0, self.assignment.failover[i], self.assignment.quota_refusals.get(i))

    def rows(self) -> list[dict]:
        """One row per step: where it runs and why, in numbers (evidence text: `placement(i)`)."""
        a, s = self.assessment, self.assignment
        rows = []
        for i, step in enumerate(a.steps):
            j = int(s.choice[i])
            pool = a.pools[j]
            interval = a.interval_hours[i, j]
            spare_usd = spare_share(s.compute_usd[i], a.spare_gpu_hours[i, j], a.gpu_hours[i, j])
            rows.append({
                "step": step.name,
                "pool": pool.name,
                "provider": pool.provider,
                "region": pool.region,
                "purchasing": pool.purchasing.value,
                "failover": [a.pools[k].name for k in s.failover[i][1:]],
                "gpus": step.gpus,
                "gpus_held": int(a.held_gpus[i, j]),  # what the quota counts: whole nodes for a gang
                "start": _moment(a, a.start_hours[i]),
                "end": _moment(a, a.end_hours[i, j]),
                "gpu_hours": float(a.gpu_hours[i, j]),
                "spare_gpu_hours": float(a.spare_gpu_hours[i, j]),
                "committed_gpu_hours_used": float(s.covered_gpu_hours[i]),
                "compute_usd": float(s.compute_usd[i]),
                "spare_usd": float(spare_usd),  # the standby spares' part of compute_usd
                "egress_usd": float(a.egress_usd[i, j]),
                "moved_gb": float(a.moved_gb[i, j]),
                "cost_usd": float(s.compute_usd[i] + a.egress_usd[i, j]),
                "rework_fraction": float(a.rework[i, j]),
                "checkpoint_interval_seconds": None if math.isinf(interval) else float(interval * 3600),
                "price_source": self.catalog.price_provenance(pool),
            })
        return rows

    def totals(self) -> dict:
        rows = self.rows()
        by_mode = Counter()
        for r in rows:
            by_mode[r["purchasing"]] += r["cost_usd"]
        return {
            "steps": len(rows),
            "cost_usd": sum(r["cost_usd"] for r in rows),
            "compute_usd": sum(r["compute_usd"] for r in rows),
            "spare_usd": sum(r["spare_usd"] for r in rows),
            "egress_usd": sum(r["egress_usd"] for r in rows),
            "gpu_hours": sum(r["gpu_hours"] for r in rows),
            "committed_gpu_hours_used": sum(r["committed_gpu_hours_used"] for r in rows),
            "cost_by_purchasing": {m.value: by_mode.get(m.value, 0.0) for m in Purchasing},
            "budget_usd": self.budget_usd,
            "prices_illustrative": self.catalog.prices.illustrative,
        }

    def to_dict(self) -> dict:
        return {
            "job": self.name,
            "catalogs": self.catalog.files,
            "totals": self.totals(),
            "steps": [
                {**row, "evidence": self.placement(i).evidence()} for i, row in enumerate(self.rows())
            ],
        }


def plan_job(
    name: str,
    steps: list[StepSpec],
    catalog: Catalog,
    *,
    epoch: dt.datetime | None = None,
    budget_usd: float | None = None,
) -> JobPlan:
    """Plan every step of a job; raises InfeasiblePlanError naming what no pool meets."""
    if epoch is None:
        starts = [s.start for s in steps if s.start is not None]
        epoch = min(starts) if starts else dt.datetime.now(dt.UTC).replace(microsecond=0)
    steps = [s if s.start is not None else s.model_copy(update={"start": epoch}) for s in steps]
    context = PlanContext(epoch=epoch, egress=catalog.egress, tenant_limits=catalog.tenants)
    a = assess(steps, list(catalog.pools.values()), context)
    result = greedy(a)
    if result.unplaced:
        shown = sorted(result.unplaced)[:5]
        more = f"\n(and {len(result.unplaced) - len(shown)} more steps)" if len(result.unplaced) > len(shown) else ""
        raise InfeasiblePlanError(
            "no plan meets the job's constraints:\n"
            + "\n".join(explain_infeasible(a, i, result.quota_refusals.get(i)) for i in shown)
            + more
        )
    plan = JobPlan(name, a, result, catalog, budget_usd)
    total = plan.totals()["cost_usd"]
    if budget_usd is not None and total > budget_usd:
        raise InfeasiblePlanError(
            f"no plan meets the job's budget: the cheapest plan found costs ${total:,.2f}, over the budget "
            f"${budget_usd:,.2f} by ${total - budget_usd:,.2f}. Raise `budget_usd` or trim the steps."
        )
    return plan


__all__ = ["InfeasiblePlanError", "JobPlan", "RULES", "assign", "plan_job", "regret_order"]
