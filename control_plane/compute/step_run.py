"""What happened to one step: where it ran, every attempt, its timeline, and what the asset shows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from control_plane.accounting.records import AttemptRecord, ledger_markdown
from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.compute.backends.base import AttemptOutcome, AttemptResult
from control_plane.compute.causes import ADMISSION_CAUSES, Cause
from control_plane.placement.ranking import PlacementPlan
from workload_runtime.messages import CheckpointSaved, Progress, Resumed, Telemetry, of_kind
from workload_runtime.tenant_access import TenantAccess


class StepFailedError(dg.Failure):
    pass


@dataclass
class StepRun:
    """What happened to one step: where it ran, every attempt, and the workload's result."""

    spec: StepSpec
    plan: PlacementPlan
    pool: Pool
    checkpoint_uri: str
    # The tenant whose work this is (tenants catalog), as its workloads are handed it; None: the platform's own step.
    access: TenantAccess | None = None
    attempts: list[AttemptRecord] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)
    logs: list[str | None] = field(default_factory=list)
    # One entry per attempt: when it was submitted, ran, resumed, ended and was contained (unix
    # times), why it ended, the steps it resumed from and reached, what the monitor flagged.
    timeline: list[dict[str, Any]] = field(default_factory=list)

    @property
    def preemptions(self) -> int:
        """Preemptions that count against `max_preemptions`: not those admission made (a team
        taking its quota back, a move to committed capacity), which the queues bound themselves."""
        return sum(1 for a in self.attempts if a.outcome == AttemptOutcome.preempted and a.cause not in ADMISSION_CAUSES)

    @property
    def wall_seconds(self) -> float:
        return sum(a.wall_seconds for a in self.attempts)

    @property
    def productive_seconds(self) -> float:
        return sum(a.productive_seconds for a in self.attempts)

    @property
    def gpu_hours(self) -> float:
        return sum(a.gpu_hours for a in self.attempts)

    @property
    def cost_usd(self) -> float:
        return sum(a.cost_usd for a in self.attempts)

    @property
    def goodput(self) -> float:
        return self.productive_seconds / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def final_checkpoint(self) -> str:
        """The URI of the checkpoint the workload finished with (its result), else the run's folder."""
        value = self.result.get("checkpoint_uri")
        return str(getattr(value, "value", value) or self.checkpoint_uri)

    def metadata(self) -> dict[str, Any]:
        """Materialization metadata: the workload's result plus placement, cost and goodput."""
        return {
            **self.result,
            "pool": self.pool.name,
            "provider": self.pool.provider,
            "purchasing": self.pool.purchasing.value,
            "backend": self.pool.backend,
            "attempts": len(self.attempts),
            "pools_tried": ", ".join(dict.fromkeys(a.pool for a in self.attempts)),
            "preemptions": self.preemptions,
            "wall_seconds": dg.MetadataValue.float(round(self.wall_seconds, 2)),
            "productive_seconds": dg.MetadataValue.float(round(self.productive_seconds, 2)),
            "lost_seconds": dg.MetadataValue.float(round(self.wall_seconds - self.productive_seconds, 2)),
            "goodput": dg.MetadataValue.float(round(self.goodput, 4)),
            "gpu_hours": dg.MetadataValue.float(round(self.gpu_hours, 5)),
            "cost_usd": dg.MetadataValue.float(round(self.cost_usd, 5)),
            "bytes_from_node_cache": dg.MetadataValue.int(sum(a.cache_bytes for a in self.attempts)),
            "bytes_from_store": dg.MetadataValue.int(sum(a.store_bytes for a in self.attempts)),
            "checkpoints": dg.MetadataValue.path(self.checkpoint_uri),
            "placement": dg.MetadataValue.md(self.plan.evidence_markdown()),
            "ledger": dg.MetadataValue.md(ledger_markdown(self.attempts)),
            **({"recovery": dg.MetadataValue.md(timeline_markdown(self.timeline))} if len(self.timeline) > 1 else {}),
            **({"workload_log": dg.MetadataValue.path(self.logs[-1])} if self.logs and self.logs[-1] else {}),
        }


def attempt_timeline(attempt: int, pool: Pool, submitted: float, result: AttemptResult) -> dict[str, Any]:
    """What one attempt did, when (unix times), for recovery measurements and the UI."""
    messages = result.messages
    steps = [m.step for m in messages if isinstance(m, Telemetry | CheckpointSaved | Progress)]
    resumed = of_kind(messages, Resumed)
    saved = [m for m in of_kind(messages, CheckpointSaved) if m.at is not None]
    pace = sorted(m.step_seconds for m in of_kind(messages, Telemetry) if m.step_seconds)
    return {
        "attempt": attempt,
        "pool": pool.name,
        "backend": pool.backend,
        "outcome": result.outcome.value,
        "cause": result.cause,
        "node": result.node,  # the node at fault, when known (a gang's)
        "submitted_at": submitted,
        "running_at": result.running_at,
        "resumed_at": result.first_at(Resumed),
        "resumed_step": resumed[0].step if resumed else None,
        "last_step": max(steps, default=None),
        "ended_at": result.ended_at,
        "contained_at": None,
        "last_checkpoint_step": saved[-1].step if saved else None,
        "last_checkpoint_at": saved[-1].at if saved else None,
        "step_seconds": pace[len(pace) // 2] if pace else None,  # median of the telemetry reports
        "checkpoints": sum(1 for m in of_kind(messages, CheckpointSaved) if m.checkpoint_seconds is not None),
        "checkpoint_seconds": result.checkpoint_seconds,
        "flags": result.flags,
    }


def disqualified_timeline(attempt: int, pool: Pool, at: float, problem: str, node: str = "") -> dict[str, Any]:
    """The timeline entry of a pool that failed qualification: nothing ran, the pool (or, for a
    gang with a spare, only the `node` that failed) was drained."""
    return {
        "attempt": attempt, "pool": pool.name, "backend": pool.backend, "outcome": "disqualified", "cause": Cause.unhealthy_node.value, "node": node,
        "submitted_at": at, "running_at": None, "resumed_at": None, "resumed_step": None, "last_step": None,
        "last_checkpoint_step": None, "last_checkpoint_at": None, "step_seconds": None, "ended_at": at, "contained_at": at,
        "checkpoints": 0, "checkpoint_seconds": 0.0,
        "flags": [{"cause": Cause.unhealthy_node.value, "detail": problem, "action": "replace", "at": at}],
    }


def timeline_markdown(timeline: list[dict[str, Any]]) -> str:
    """The attempts of a step as a table of what happened when (seconds since the first submission)."""
    if not timeline:
        return ""
    t0 = timeline[0]["submitted_at"]

    def since(value: float | None) -> str:
        return f"{value - t0:.2f}" if value is not None else "—"

    lines = ["| attempt | pool | outcome | cause | submitted | running | resumed (step) | ended | contained |", "|---|---|---|---|---|---|---|---|---|"]
    for t in timeline:
        resumed = f"{since(t['resumed_at'])} ({t['resumed_step']})" if t["resumed_at"] is not None else "—"
        lines.append(
            f"| {t['attempt']} | `{t['pool']}` | {t['outcome']} | {t['cause'] or '—'} | {since(t['submitted_at'])} | "
            f"{since(t['running_at'])} | {resumed} | {since(t['ended_at'])} | {since(t['contained_at'])} |"
        )
    return "\n".join(lines)
