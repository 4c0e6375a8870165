"""Placement: which pools can run a step, ranked by expected cost, with the evidence.

The ranked list is the failover order. Every pool is listed with the reason it was
picked, ranked lower, or refused, in words a person can check. The numbers come from
`cost_model.assess` (compute at the purchasing mode's price, Young/Daly rework on
interruptible capacity, commitments already paid for, egress to move the data);
docs/placement.md writes the model out.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from control_plane.placement.cost_model import (
    Assessment, Limit, PlanContext, assess, expected_waste, limits_of, plan_context, young_daly_interval_hours,
)
from control_plane.catalog.pools import Catalog, Pool, PoolCapacity, Purchasing
from control_plane.catalog.step_spec import StepSpec
from control_plane.placement.shape_words import family_refusal, interconnect_refusal, pace_reasons, porting_refusal


@dataclass(frozen=True)
class PoolVerdict:
    pool: str
    feasible: bool
    reasons: list[str]
    expected_cost_usd: float | None = None
    rework_fraction: float = 0.0
    rank: int | None = None
    # Young/Daly checkpoint interval on this pool for this step, seconds; None where nothing
    # interrupts the pool (checkpoint on the step's own cadence and on the preemption signal).
    checkpoint_interval_seconds: float | None = None
    compute_usd: float | None = None
    egress_usd: float = 0.0
    moved_gb: float = 0.0
    transfer_hours: float = 0.0
    committed_gpu_hours_used: float = 0.0
    # A gang's standby spares on this pool: GPU-hours held while it runs and their part of `compute_usd`.
    spare_gpu_hours: float = 0.0
    spare_usd: float = 0.0
    refused_by: list[str] = field(default_factory=list)  # rule keys (cost_model.RULES)


@dataclass(frozen=True)
class PlacementPlan:
    step: str
    ranked: list[Pool]
    verdicts: list[PoolVerdict] = field(default_factory=list)

    @property
    def first(self) -> Pool:
        if not self.ranked:
            raise NoFeasiblePoolError(self)
        return self.ranked[0]

    def verdict(self, pool: str) -> PoolVerdict:
        return next(v for v in self.verdicts if v.pool == pool)

    def evidence(self) -> list[dict]:
        return [asdict(v) for v in self.verdicts]

    def evidence_markdown(self) -> str:
        lines = ["| rank | pool | expected cost | why |", "|---|---|---|---|"]
        for v in sorted(self.verdicts, key=lambda v: (v.rank is None, v.rank or 0, v.pool)):
            cost = f"${v.expected_cost_usd:,.2f}" if v.expected_cost_usd is not None else "—"
            rank = str(v.rank) if v.rank is not None else "refused"
            lines.append(f"| {rank} | `{v.pool}` | {cost} | {'; '.join(v.reasons)} |")
        return "\n".join(lines)


class NoFeasiblePoolError(RuntimeError):
    """No pool in the catalog can run the step; the message lists every refusal."""

    def __init__(self, plan: PlacementPlan):
        refusals = "\n".join(f"  - {v.pool}: {'; '.join(v.reasons)}" for v in plan.verdicts)
        super().__init__(
            f"No pool can run step `{plan.step}`. Refusals:\n{refusals}\n"
            "Add a pool that fits to the catalog (pools.yaml) or relax the step's needs."
        )
        self.plan = plan


def checkpoint_interval_seconds(interruptions_per_hour: float, checkpoint_seconds: float, nodes: int = 1) -> float | None:
    """Young/Daly interval √(2·δ·M) in seconds, M = 1/(nodes·λ); None when nothing interrupts."""
    if interruptions_per_hour <= 0:
        return None
    return 3600.0 * young_daly_interval_hours(checkpoint_seconds / 3600.0, 1.0 / (interruptions_per_hour * nodes))


def spot_rework_fraction(interruptions_per_hour: float, checkpoint_seconds: float, nodes: int = 1) -> float:
    """Expected share of the run lost to interruptions on interruptible capacity (Young/Daly).

    With the checkpoint interval at its optimum √(2·δ·M) (δ the time to write a checkpoint,
    M = 1/(nodes·λ) the mean time between interruptions), checkpoint writes and redone work
    together cost about √(2·δ/M) of the run.
    """
    interval = checkpoint_interval_seconds(interruptions_per_hour, checkpoint_seconds, nodes)
    if interval is None:
        return 0.0
    mtbi = 1.0 / (interruptions_per_hour * nodes)
    return expected_waste(checkpoint_seconds / 3600.0, mtbi, interval / 3600.0)


# --- words -----------------------------------------------------------------------------------


def _size(gb: float) -> str:
    return f"{gb / 1000:,.1f} TB" if gb >= 1000 else f"{gb:,.0f} GB"


def _duration(hours: float) -> str:
    if math.isinf(hours):
        return "never"
    if hours < 1 / 60:
        return f"{hours * 3600:.0f} s"
    return f"{hours * 60:.0f} min" if hours < 1 else f"{hours:,.1f} h"


def _moment(a: Assessment, hours: float) -> str:
    return (a.context.epoch + dt.timedelta(hours=float(hours))).strftime("%Y-%m-%d %H:%M UTC")


def refusal_reasons(a: Assessment, i: int, j: int) -> list[str]:
    """Why pool j cannot run step i, one sentence per broken rule."""
    step, pool, ctx = a.steps[i], a.pools[j], a.context
    kind = pool.purchasing.value
    words = {
        "tenant": lambda: _tenant_refusal(step, pool, ctx),
        "tenant_limits": lambda: _limits_refusal(pool, limits_of(ctx, step)),
        "capacity": lambda: (
            f"offers no particular kind of capacity (`capacity: unspecified`), step needs {step.capacity.value}"
            if pool.capacity is PoolCapacity.unspecified
            else f"offers {pool.capacity.value} capacity, step needs {step.capacity.value}"
        ),
        "accelerator": lambda: f"accelerator {pool.accelerator} not in {step.accelerators}",
        "family": lambda: family_refusal(step, pool),
        "porting": lambda: porting_refusal(a, i, j),
        "nodes": lambda: _nodes_refusal(step, pool),
        "gpus": lambda: (
            f"a gang takes whole nodes: {step.nodes} × {pool.gpus_per_node} = {a.held_gpus[i, j]:.0f} GPUs, pool has {pool.total_gpus}"
            if step.gang and a.held_gpus[i, j] > step.gpus
            else f"needs {step.gpus} GPUs, pool has {pool.total_gpus}"
        ),
        "gpus_per_node": lambda: f"needs {math.ceil(step.gpus / step.nodes)} GPUs per node, pool has {pool.gpus_per_node}",
        "interconnect": lambda: interconnect_refusal(step, pool),
        "runtime": lambda: f"has no `{step.runtime}` runtime (has: {', '.join(sorted(pool.runtimes))})",
        "spot_checkpoint": lambda: (
            "spot refused: step does not checkpoint (checkpoints: false)"
            if pool.purchasing is Purchasing.spot
            else f"{kind} refused: the pool is interrupted ({pool.interruption_rate_per_hour:g} per node-hour) and the step "
            "does not checkpoint (checkpoints: false)"
        ),
        "spot_rework": lambda: (
            f"{kind} refused: a checkpoint takes {step.checkpoint_seconds:.0f} s and an interruption comes every "
            f"{_duration(a.mtbi_hours[i, j])} on {step.nodes} node(s): expected rework {a.rework[i, j]:.0%} of the run"
        ),
        "window": lambda: (
            f"{kind} refused: its window {pool.window_start:%Y-%m-%d %H:%M}–{pool.window_end:%Y-%m-%d %H:%M} UTC does not hold "
            f"the step ({_moment(a, a.start_hours[i])} → {_moment(a, a.end_hours[i, j])})"
            if pool.window_start and pool.window_end
            else f"{kind} refused: outside its window (step {_moment(a, a.start_hours[i])} → {_moment(a, a.end_hours[i, j])})"
        ),
        "deadline": lambda: (
            f"would finish {_moment(a, a.end_hours[i, j])} ({_duration(a.transfer_hours[i, j])} data transfer + "
            f"{_duration(a.end_hours[i, j] - a.start_hours[i] - a.transfer_hours[i, j])} run), after the deadline "
            f"{_moment(a, a.deadline_hours[i])}"
        ),
        "budget": lambda: f"expected cost ${a.cost_usd[i, j]:,.2f} exceeds budget ${step.budget_usd:,.2f}",
    }
    return [words[rule]() for rule, mask in a.refused.items() if mask[i, j]]


def _tenant_refusal(step: StepSpec, pool: Pool, ctx: PlanContext) -> str:
    lane = ctx.lane_of(step.tenant)
    who = f"tenant `{step.tenant}`" + (f" (lane `{lane}`)" if lane and lane != step.tenant else "")
    return f"{who} not allowed (allowed: {', '.join(pool.tenants or [])})"


def _listed(names: list[str] | None) -> str:
    return "any" if names is None else ", ".join(names) or "none"


def _limits_refusal(pool: Pool, limits: list[Limit]) -> str:
    """Which limits refuse the pool, each named by where it comes from: the pool catalog's `tenants:`,
    the tenants catalog (the tenant's own regions, its agreement's), the job's `limits:`, or the
    agreements of the step's input data (`limits.reason`)."""
    where = f"{pool.provider} {pool.region}"
    said = []
    for lim in (x for x in limits if not x.allows(pool)):
        allowed = f"allowed providers: {_listed(lim.limits.providers)}; regions: {_listed(lim.limits.regions)}"
        if lim.kind == "catalog":
            said.append(f"tenant `{lim.whose}` may not use {where} ({allowed})")
        elif lim.kind == "tenant":
            said.append(f"tenant `{lim.whose}` may not use {where} (tenants catalog: {allowed})")
        elif lim.kind == "agreement":
            said.append(
                f"the data agreement of tenant `{lim.whose}` keeps its data in {_listed(lim.limits.regions)}, not {where} "
                "(tenants catalog `agreement.regions`)"
            )
        elif lim.limits.reason:
            said.append(f"{lim.limits.reason} does not allow {where} ({allowed})")
        else:
            said.append(f"the job's `limits:` do not allow {where} ({allowed})")
    return "; ".join(said)


def _nodes_refusal(step: StepSpec, pool: Pool) -> str:
    if not pool.spare_nodes:
        return f"needs {step.nodes} nodes, pool has {pool.nodes}"
    return (
        f"needs {step.nodes} nodes, pool offers {pool.offered_nodes}: of its {pool.nodes}, {pool.spare_nodes} "
        f"stand by as spares to replace a gang's failed node"
    )


def cost_reasons(a: Assessment, i: int, j: int) -> list[str]:
    """How the expected cost of step i on pool j is made up."""
    step, pool = a.steps[i], a.pools[j]
    why = [f"{pool.purchasing.value} {pool.capacity.value} capacity at ${pool.price_per_gpu_hour:.2f}/GPU-h"]
    if step.gang and a.held_gpus[i, j] > max(step.gpus, 1):
        why.append(
            f"a gang takes whole nodes: holds and pays for {step.nodes} × {pool.gpus_per_node} = {a.held_gpus[i, j]:.0f} GPUs "
            f"(uses {step.gpus})"
        )
    why += pace_reasons(a, i, j)
    if a.spare_gpu_hours[i, j]:
        why.append(
            f"+{pool.spare_nodes} standby spare node(s) held while the gang runs: {a.spare_gpu_hours[i, j]:,.1f} GPU-h, "
            f"${a.spare_usd[i, j]:,.2f}"
        )
    covered = a.covered_gpu_hours[i, j]
    if pool.committed_gpu_hours is not None:
        why.append(
            f"commitment already paid covers {covered:,.1f} of {a.gpu_hours[i, j]:,.1f} GPU-h at "
            f"${pool.marginal_price_per_gpu_hour:.2f}/GPU-h marginal"
        )
    if a.transfer_hours[i, j]:
        why.append(f"GPUs held {_duration(a.transfer_hours[i, j])} while the data moves in, billed like the run")
    if a.rework[i, j]:
        why.append(
            f"+{a.rework[i, j]:.1%} expected rework from interruptions; checkpoint every "
            f"{_duration(a.interval_hours[i, j])} (Young/Daly: δ={step.checkpoint_seconds:.0f} s, "
            f"M={_duration(a.mtbi_hours[i, j])} on {step.nodes} node(s))"
        )
    for k, (provider, region) in enumerate(a.locations):
        gb = a.gb_by_location[i, k]
        if not gb:
            continue
        if (provider, region) == (pool.provider, pool.region):
            why.append(f"data already in {provider} {region} ({_size(gb)})")
        else:
            hours = gb * 8.0 / a.context.egress.rates(provider).gbps / 3600.0
            why.append(
                f"egress {_size(gb)} {provider} {region} → {pool.provider} {pool.region} adds "
                f"${gb * a.egress_price[k, j]:,.2f} and {_duration(hours)}"
            )
    return why


def verdict(a: Assessment, i: int, j: int, rank: int | None, extra: list[str] | None = None) -> PoolVerdict:
    """One pool's verdict for one step; `extra` adds refusals found beyond the cost model (quota)."""
    refusals = refusal_reasons(a, i, j) + list(extra or [])
    interval = a.interval_hours[i, j]
    common = dict(
        expected_cost_usd=float(a.cost_usd[i, j]),
        rework_fraction=float(a.rework[i, j]),
        checkpoint_interval_seconds=None if math.isinf(interval) else float(interval * 3600.0),
        compute_usd=float(a.compute_usd[i, j]),
        egress_usd=float(a.egress_usd[i, j]),
        moved_gb=float(a.moved_gb[i, j]),
        transfer_hours=float(a.transfer_hours[i, j]),
        committed_gpu_hours_used=float(a.covered_gpu_hours[i, j]),
        spare_gpu_hours=float(a.spare_gpu_hours[i, j]),
        spare_usd=float(a.spare_usd[i, j]),
    )
    if refusals:
        rules = [r for r, m in a.refused.items() if m[i, j]] + (["quota"] if extra else [])
        return PoolVerdict(a.pools[j].name, False, refusals, refused_by=rules, **common)
    why = cost_reasons(a, i, j)
    why.append("picked: cheapest feasible" if rank == 1 else f"failover #{rank - 1}")
    return PoolVerdict(a.pools[j].name, True, why, rank=rank, **common)


def ranking(a: Assessment, i: int) -> list[int]:
    """Feasible pools for step i: cheapest first; on equal cost, less data moved, then name."""
    feasible = np.flatnonzero(a.feasible[i])
    return sorted(feasible, key=lambda j: (round(float(a.cost_usd[i, j]), 6), float(a.moved_gb[i, j]), a.pools[j].name))


def step_plan(a: Assessment, i: int, order: list[int] | None = None, extra: dict[int, str] | None = None) -> PlacementPlan:
    """The plan for step i: `order` (default: the cost ranking) is the failover order; pools in
    `extra` are refused for the reasons given there (e.g. no quota left at the planned time)."""
    extra = extra or {}
    order = [j for j in (ranking(a, i) if order is None else order) if j not in extra]
    verdicts = [verdict(a, i, j, rank) for rank, j in enumerate(order, start=1)]
    ranked_set = set(order)
    verdicts += [verdict(a, i, j, None, [extra[j]] if j in extra else None) for j in range(len(a.pools)) if j not in ranked_set]
    return PlacementPlan(step=a.steps[i].name, ranked=[a.pools[j] for j in order], verdicts=verdicts)


def plan_placement(
    step: StepSpec,
    pools: dict[str, Pool] | Catalog,
    *,
    at: dt.datetime | None = None,
    context: PlanContext | None = None,
) -> PlacementPlan:
    """Rank the pools that can run `step` by expected cost (cheapest first), with the evidence.

    `pools` may be a `Catalog` (then its egress prices and tenant limits apply); the tenants
    catalog (`load_tenants`: lanes, regions, agreements) applies either way. The step
    starts at `step.start`, else `at`, else now; that places it against block windows and
    its deadline.
    """
    if isinstance(pools, Catalog):
        catalog = pools
        context = context or plan_context(_now(at), catalog)
        pools = catalog.pools
    context = context or plan_context(_now(at))
    if step.start is None:
        step = step.model_copy(update={"start": context.epoch})
    return step_plan(assess([step], list(pools.values()), context), 0)


def _now(at: dt.datetime | None) -> dt.datetime:
    return at if at is not None else dt.datetime.now(dt.UTC).replace(microsecond=0)


__all__ = [
    "NoFeasiblePoolError", "PlacementPlan", "PoolVerdict", "checkpoint_interval_seconds", "plan_placement",
    "spot_rework_fraction", "step_plan", "Purchasing",
]
