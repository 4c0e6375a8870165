"""The capacity plan for a whole job: which pool each step gets, its failover order, the totals.

Exact where it can be: the job is first planned greedily (`greedy.py`: each step, hardest first,
on the cheapest pool that still has room), then as an integer program of the same cost model
(`exact.py`, HiGHS through `scipy.optimize.milp`) within a time budget. If HiGHS proves its plan
optimal, that is the plan; if it proves no plan places every step, the job is refused with the
steps and why. Beyond the budget (or a job too big to build the program for) the greedy plan is
improved by local search (`improve.py`: moves, and moves that first move another step out of the
way) and the plan says so, with a bound on how far from the optimum it can be.

Shared limits between steps:

- **quota**: a pool's GPUs (`quota_gpus`, else nodes × GPUs per node, standby spares left
  out) held by the steps running on it at the same time, on a 15-minute grid; a gang holds
  whole nodes (nodes × the pool's GPUs per node);
- **commitment**: GPU-hours already paid for on a pool, worth the same to every step on it;
- **budget**: each step's, and the job's total.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from control_plane.catalog.pools import Catalog, Purchasing
from control_plane.catalog.step_spec import StepSpec
from control_plane.placement.cost_model import (
    RULES,
    Assessment,
    plan_context,
    assess,
    spare_share,
    young_daly_interval_hours,
)
from control_plane.placement.exact import ExactResult, Relaxation, relaxation, solve
from control_plane.placement.fallback import best_found, rounded
from control_plane.placement.given_rest import GivenRest
from control_plane.placement.greedy import (
    SLOT_HOURS,
    Placed,
    assign,
    commitment_terms,
    greedy,
    plan_cost,
    regret_order,
)
from control_plane.placement.improve import TOL, improve
from control_plane.placement.ranking import PlacementPlan, refusal_reasons, step_plan

DEFAULT_TIME_BUDGET_S = 10.0


class InfeasiblePlanError(RuntimeError):
    """No plan meets the job's constraints; the message names the constraint and the steps.

    `unplaced` lists, per step no plan could place, its name and the reasons (for `--json`)."""

    def __init__(self, message: str, unplaced: list[dict] | None = None):
        super().__init__(message)
        self.unplaced = unplaced or []


@dataclass(frozen=True)
class Method:
    """How a plan was found, and how far from the cheapest plan it can be.

    `name`: `exact` (HiGHS proved it optimal, to `gap_bound`) or `greedy+local-search`.
    `gap_bound`: the plan's cost ÷ the best lower bound known − 1 (None: no bound known).
    `lower_bound_usd`: no plan of this job costs less (HiGHS's dual bound, or each step on its
    cheapest pool with the whole commitment and no quota). `exact_status`: what HiGHS said.
    """

    name: str
    gap_bound: float | None
    lower_bound_usd: float | None
    exact_status: str
    seconds: float

    def words(self) -> str:
        gap = "unknown" if self.gap_bound is None else f"{self.gap_bound:.2%}"
        if self.name == "exact":
            return f"exact (HiGHS integer program, proved optimal; gap ≤ {gap})"
        why = {"time_limit": "HiGHS did not finish within the time budget", "too_big": "too big for the integer program",
               "failed": "HiGHS failed"}.get(self.exact_status, self.exact_status)
        return f"greedy + local search ({why}); at most {gap} above the optimum"


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
    placed: Placed
    catalog: Catalog
    method: Method
    budget_usd: float | None = None

    @property
    def steps(self) -> list[StepSpec]:
        return self.assessment.steps

    @cached_property
    def _rest(self) -> GivenRest:
        return GivenRest(self.assessment, self.placed)

    @cached_property
    def _compute_usd(self) -> np.ndarray:
        a, p = self.assessment, self.placed
        base, saving, _ = commitment_terms(a)
        idx = np.arange(len(a.steps))
        return base[idx, p.choice] - a.egress_usd[idx, p.choice] - saving[p.choice] * p.covered

    def failover(self, i: int) -> list[int]:
        """Step i's pools in failover order (the chosen one first), given the rest of the plan."""
        return self._rest.step(i).failover

    def placement(self, i: int) -> PlacementPlan:
        """Step i's ranked pools (the failover order) and the evidence for every pool, given the rest of the plan."""
        a = self.assessment
        against = self._rest.step(i)
        context = replace(a.context, committed_left=against.committed_left)
        single = assess([a.steps[i]], a.pools, context)
        return step_plan(single, 0, against.failover, against.refusals)

    def iter_rows(self, failover: bool = True):
        """One row per step, as it is worked out: where it runs and why, in numbers (evidence: `placement(i)`)."""
        a, choice, covered = self.assessment, self.placed.choice, self.placed.covered
        compute = self._compute_usd
        for i, step in enumerate(a.steps):
            j = int(choice[i])
            pool = a.pools[j]
            gpu_hours, spare_hours = float(a.gpu_hours[i, j]), float(a.spare_gpu_hours[i, j])
            rate = pool.interruption_rate_per_hour
            interval = young_daly_interval_hours(a.delta_hours[i], 1.0 / (rate * step.nodes)) if rate > 0 else math.inf
            deadline = a.deadline_hours[i]
            yield {
                "step": step.name,
                "pool": pool.name,
                "provider": pool.provider,
                "region": pool.region,
                "purchasing": pool.purchasing.value,
                "failover": [a.pools[k].name for k in self.failover(i)[1:]] if failover else None,
                "gpus": step.gpus,
                "gpus_held": int(a.held_gpus[i, j]),  # what the quota counts: whole nodes for a gang
                "start": _moment(a, a.start_hours[i]),
                "end": _moment(a, a.end_hours[i, j]),
                "start_at": _iso(a, a.start_hours[i]),
                "end_at": _iso(a, a.end_hours[i, j]),
                "deadline_at": None if math.isinf(deadline) else _iso(a, deadline),
                "transfer_hours": float(a.transfer_hours[i, j]),
                "gpu_hours": gpu_hours,
                "spare_gpu_hours": spare_hours,
                "committed_gpu_hours_used": float(covered[i]),
                "compute_usd": float(compute[i]),
                "spare_usd": float(spare_share(compute[i], spare_hours, gpu_hours)),  # the spares' part of compute_usd
                "egress_usd": float(a.egress_usd[i, j]),
                "moved_gb": float(a.moved_gb[i, j]),
                "cost_usd": float(compute[i] + a.egress_usd[i, j]),
                "rework_fraction": float(a.rework[i, j]),
                "checkpoint_interval_seconds": None if math.isinf(interval) else interval * 3600,
                "price_source": self.catalog.price_provenance(pool),
            }

    @cached_property
    def _rows(self) -> list[dict]:
        return list(self.iter_rows())

    def rows(self) -> list[dict]:
        """One row per step: where it runs and why, in numbers (evidence text: `placement(i)`)."""
        return self._rows

    def totals(self) -> dict:
        a, choice = self.assessment, self.placed.choice
        idx = np.arange(len(a.steps))
        compute, egress = self._compute_usd, a.egress_usd[idx, choice]
        cost = compute + egress
        spare = spare_share(compute, a.spare_gpu_hours[idx, choice], a.gpu_hours[idx, choice])
        modes = np.array([a.pools[j].purchasing.value for j in range(len(a.pools))])[choice] if len(a.steps) else np.array([])
        return {
            "steps": len(a.steps),
            "cost_usd": float(cost.sum()),
            "compute_usd": float(compute.sum()),
            "spare_usd": float(spare.sum()),
            "egress_usd": float(egress.sum()),
            "gpu_hours": float(a.gpu_hours[idx, choice].sum()),
            "committed_gpu_hours_used": float(self.placed.covered.sum()),
            "cost_by_purchasing": {m.value: float(cost[modes == m.value].sum()) for m in Purchasing},
            "budget_usd": self.budget_usd,
            "prices_illustrative": self.catalog.prices.illustrative,
            "method": self.method.name,
            "gap_bound": self.method.gap_bound,
            "lower_bound_usd": self.method.lower_bound_usd,
            "exact_status": self.method.exact_status,
        }

    def to_dict(self, evidence: bool = True) -> dict:
        return {
            "job": self.name,
            "catalogs": self.catalog.files,
            "totals": self.totals(),
            "steps": [
                {**row, "evidence": self.placement(i).evidence()} if evidence else row for i, row in enumerate(self.iter_rows())
            ],
        }


def _iso(a: Assessment, hours: float) -> str:
    return (a.context.epoch + dt.timedelta(hours=float(hours))).isoformat()


def plan_job(
    name: str,
    steps: list[StepSpec],
    catalog: Catalog,
    *,
    epoch: dt.datetime | None = None,
    budget_usd: float | None = None,
    time_budget_s: float = DEFAULT_TIME_BUDGET_S,
) -> JobPlan:
    """Plan every step of a job: exactly (HiGHS) when it solves within `time_budget_s`, else the
    greedy plan improved by local search. Raises InfeasiblePlanError naming what no pool meets."""
    started = time.perf_counter()
    if epoch is None:
        starts = [s.start for s in steps if s.start is not None]
        epoch = min(starts) if starts else dt.datetime.now(dt.UTC).replace(microsecond=0)
    steps = [s if s.start is not None else s.model_copy(update={"start": epoch}) for s in steps]
    context = plan_context(epoch, catalog)
    a = assess(steps, list(catalog.pools.values()), context)
    first = greedy(a)
    left = lambda: max(time_budget_s - (time.perf_counter() - started), 0.0)  # noqa: E731
    relaxed = relaxation(a, left())
    # HiGHS gets most of the budget; if it does not prove a plan optimal, search gets the rest.
    exact = solve(a, max(EXACT_SHARE * left(), 0.1))
    if exact.status == "optimal":
        placed = _polished(a, _topped_up(a, exact.choice, exact.covered), started, time_budget_s)
    elif exact.status == "too_big":
        placed = improve(a, first, min(left(), SEARCH_BIG_S))
    else:
        starts = [first] + [p for p in (rounded(a, relaxed),) if p is not None]
        if exact.choice is not None:
            starts.append(_topped_up(a, exact.choice, exact.covered))
        placed = best_found(a, starts, max(left(), MIN_SEARCH_S))
    if not _within_budgets(a, placed):
        placed = first
    if placed.unplaced:
        _refuse(a, placed, exact)
    method = _method(a, placed, exact, relaxed, time.perf_counter() - started)
    plan = JobPlan(name, a, placed, catalog, method, budget_usd)
    total = plan.totals()["cost_usd"]
    if budget_usd is not None and total > budget_usd:
        cheapest = "the cheapest plan" if method.name == "exact" else "the cheapest plan found"
        raise InfeasiblePlanError(
            f"no plan meets the job's budget: {cheapest} costs ${total:,.2f}, over the budget "
            f"${budget_usd:,.2f} by ${total - budget_usd:,.2f}. Raise `budget_usd` or trim the steps."
        )
    return plan


# On a job too big for the integer program, the local search gets at most this long.
SEARCH_BIG_S = 0.2
EXACT_SHARE = 0.75  # of the time budget left after the relaxation, for HiGHS to prove a plan optimal
MIN_SEARCH_S = 0.5  # search after HiGHS ran out of time gets at least this long


def _polished(a: Assessment, placed: Placed, started: float, budget_s: float) -> Placed:
    """An optimal plan with equal-cost ties resolved by the planner's rule (less data moved, then name)."""
    better = improve(a, placed, max(min(budget_s - (time.perf_counter() - started), 1.0), 0.05), ejects=False)
    if better.unplaced or not _within_budgets(a, better) or plan_cost(a, better) > plan_cost(a, placed) + TOL:
        return placed
    return better


def _topped_up(a: Assessment, choice: np.ndarray, covered: np.ndarray) -> Placed:
    """HiGHS's use of each commitment, with any of it left over given to steps it does not cover in full."""
    _, _, committed = commitment_terms(a)
    covered = covered.copy()
    idx = np.arange(len(a.steps))
    hours = a.gpu_hours[idx, choice]
    for j in np.flatnonzero(committed > 0):
        left = committed[j] - covered[choice == j].sum()
        for i in np.flatnonzero(choice == j):
            if left <= 1e-9:
                break
            extra = min(hours[i] - covered[i], left)
            covered[i] += extra
            left -= extra
    return Placed(choice.copy(), covered, list(range(len(a.steps))))


def _within_budgets(a: Assessment, placed: Placed) -> bool:
    budget = np.array([s.budget_usd if s.budget_usd is not None else np.inf for s in a.steps])
    if np.isinf(budget).all():
        return True
    base, saving, _ = commitment_terms(a)
    on = np.flatnonzero(placed.choice >= 0)
    cost = base[on, placed.choice[on]] - saving[placed.choice[on]] * placed.covered[on]
    return bool((cost <= budget[on] + 1e-9).all())


def _method(a: Assessment, placed: Placed, exact: ExactResult, relaxed: Relaxation, seconds: float) -> Method:
    cost = plan_cost(a, placed)
    # Two bounds no plan can beat: every step on its cheapest pool as if the whole commitment were its
    # own; or without any commitment, less every commitment's whole worth once.
    base, saving, committed = commitment_terms(a)
    simple = float(np.min(a.cost_usd, axis=1, where=a.feasible, initial=np.inf).sum()) if len(a.steps) else 0.0
    shared = float(np.min(base, axis=1, where=a.feasible, initial=np.inf).sum() - (saving * committed).clip(min=0).sum()) if len(a.steps) else 0.0
    bounds = [b for b in (exact.dual_bound_usd, relaxed.bound_usd, simple, shared) if b is not None and np.isfinite(b)]
    lower = max(bounds) if bounds else None
    if exact.status == "optimal" and exact.cost_usd is not None:
        lower = min(exact.dual_bound_usd if exact.dual_bound_usd is not None else exact.cost_usd, cost)
    gap = None if lower is None or lower <= 0 else max(cost / lower - 1.0, 0.0)
    if lower is not None and lower <= 0 and cost <= 1e-9:
        gap = 0.0
    name = "exact" if exact.status == "optimal" else "greedy+local-search"
    return Method(name, gap, lower, exact.status, seconds)


def _refuse(a: Assessment, placed: Placed, exact: ExactResult) -> None:
    unplaced = placed.unplaced
    proof = (
        "HiGHS proved that no plan places every step" if exact.status == "infeasible"
        else "no plan found places every step"
    )
    why = {i: explain_infeasible(a, i, _quota_words(a, placed, i)) for i in unplaced[:50]}
    shown = unplaced[:5]
    more = f"\n(and {len(unplaced) - len(shown)} more steps)" if len(unplaced) > len(shown) else ""
    raise InfeasiblePlanError(
        f"no plan meets the job's constraints ({proof}):\n" + "\n".join(why[i] for i in shown) + more,
        [{"step": a.steps[i].name, "why": why[i].splitlines()[1:] if i in why else []} for i in unplaced],
    )


def _quota_words(a: Assessment, placed: Placed, i: int) -> dict[int, str]:
    """For an unplaced step: why each pool that fits it has no room, given the placed steps."""
    return GivenRest(a, placed).step_refusals(i)


__all__ = ["RULES", "SLOT_HOURS", "InfeasiblePlanError", "JobPlan", "Method", "assign", "plan_job", "regret_order"]
