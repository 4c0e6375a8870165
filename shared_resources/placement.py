"""Placement v1: which pools can run a step, ranked by expected cost, with the evidence.

The ranked list is the failover order. Every pool is listed with the reason it was
picked, ranked lower, or refused, so a person can read why a step ran where it did.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from shared_resources.pools import Capacity, Pool, Purchasing
from shared_resources.step_spec import StepSpec


@dataclass(frozen=True)
class PoolVerdict:
    pool: str
    feasible: bool
    reasons: list[str]
    expected_cost_usd: float | None = None
    rework_fraction: float = 0.0
    rank: int | None = None


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


def spot_rework_fraction(interruptions_per_hour: float, checkpoint_seconds: float) -> float:
    """Expected share of work redone on interruptible capacity (Young/Daly).

    With the checkpoint interval at its optimum sqrt(2·δ·M) (δ the time to write a
    checkpoint, M the mean time between interruptions), the expected waste is about
    sqrt(2·δ/M) of the run.
    """
    if interruptions_per_hour <= 0:
        return 0.0
    delta_hours = checkpoint_seconds / 3600.0
    return math.sqrt(2.0 * delta_hours * interruptions_per_hour)


def _refusals(step: StepSpec, pool: Pool) -> list[str]:
    reasons = []
    if pool.tenants is not None and step.tenant not in pool.tenants:
        reasons.append(f"tenant `{step.tenant}` not allowed (allowed: {', '.join(pool.tenants)})")
    if step.capacity is not Capacity.any and pool.capacity is not step.capacity:
        reasons.append(f"offers {pool.capacity.value} capacity, step needs {step.capacity.value}")
    if step.accelerators and pool.accelerator not in step.accelerators:
        reasons.append(f"accelerator {pool.accelerator} not in {step.accelerators}")
    if step.nodes > pool.nodes:
        reasons.append(f"needs {step.nodes} nodes, pool has {pool.nodes}")
    if step.gpus > pool.total_gpus:
        reasons.append(f"needs {step.gpus} GPUs, pool has {pool.total_gpus}")
    elif math.ceil(step.gpus / step.nodes) > pool.gpus_per_node:
        reasons.append(f"needs {math.ceil(step.gpus / step.nodes)} GPUs per node, pool has {pool.gpus_per_node}")
    if step.tightly_coupled and (pool.interconnect_domain_gpus or 0) < max(step.gpus, 1):
        reasons.append(f"tightly coupled across {step.gpus} GPUs, but the pool's fast-interconnect domain holds {pool.interconnect_domain_gpus or 'none'}")
    if step.runtime not in pool.runtimes:
        reasons.append(f"has no `{step.runtime}` runtime (has: {', '.join(sorted(pool.runtimes))})")
    if pool.purchasing is Purchasing.spot and not step.checkpoints:
        reasons.append("spot capacity needs a step that checkpoints")
    return reasons


def plan_placement(step: StepSpec, pools: dict[str, Pool]) -> PlacementPlan:
    """Rank the pools that can run `step` by expected cost (cheapest first)."""
    feasible: list[tuple[float, Pool, float]] = []
    refused: list[PoolVerdict] = []
    for pool in pools.values():
        reasons = _refusals(step, pool)
        rework = spot_rework_fraction(pool.interruption_rate_per_hour, step.checkpoint_seconds)
        cost = pool.price_per_gpu_hour * max(step.gpus, 1) * step.expected_hours * (1.0 + rework)
        if not reasons and step.budget_usd is not None and cost > step.budget_usd:
            reasons.append(f"expected cost ${cost:,.2f} exceeds budget ${step.budget_usd:,.2f}")
        if reasons:
            refused.append(PoolVerdict(pool.name, False, reasons, cost, rework))
        else:
            feasible.append((cost, pool, rework))
    feasible.sort(key=lambda item: (item[0], item[1].name))
    verdicts = []
    for rank, (cost, pool, rework) in enumerate(feasible, start=1):
        why = [f"{pool.purchasing.value} {pool.capacity.value} capacity at ${pool.price_per_gpu_hour:.2f}/GPU-h"]
        if rework:
            why.append(f"+{rework:.1%} expected rework from interruptions")
        why.append("picked: cheapest feasible" if rank == 1 else f"failover #{rank - 1}")
        verdicts.append(PoolVerdict(pool.name, True, why, cost, rework, rank))
    return PlacementPlan(step=step.name, ranked=[p for _, p, _ in feasible], verdicts=verdicts + refused)
