"""What every backend does: run one attempt of a step through Dagster Pipes."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import dagster as dg

from shared_resources.catalog.pools import Pool
from shared_resources.catalog.step_spec import StepSpec
from shared_resources.runtime.storage import REPO_ROOT


# A process killed by these signals lost its node (spot reclaim without notice, a node
# failure, the OOM-killer of a shared box) rather than failing on its own: the step is
# resumed from its checkpoint, not failed.
LOST_NODE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM})


def killed_by_lost_node(exit_code: int | None) -> bool:
    """An exit code that means the process was killed from outside (minus the signal number)."""
    return exit_code is not None and exit_code < 0 and -exit_code in LOST_NODE_SIGNALS


class Refusal(str):
    """A qualification answer that is about capacity, not health (a partition not taking jobs,
    a controller not answering): the pool refuses the step and cools down; it is not drained."""


class AttemptOutcome(StrEnum):
    succeeded = "succeeded"
    preempted = "preempted"  # the platform took the capacity back; resume from checkpoint
    refused = "refused"  # the pool had no capacity (or quota) for it; nothing ran: try the next pool
    failed = "failed"  # the workload itself failed; retrying will not help


@dataclass
class AttemptResult:
    outcome: AttemptOutcome
    exit_code: int | None
    messages: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)  # the workload's reported result
    log_uri: str | None = None  # the process's own stdout/stderr
    log_tail: str = ""
    queue_seconds: float = 0.0  # submitted until the engine started it (waiting for capacity)
    running_at: float | None = None  # unix time the workload was first seen running
    ended_at: float | None = None  # unix time the platform saw the attempt end
    # Why it ended, when not plainly: `notice` (SIGTERM, checkpointed), `lost-node` (killed
    # without notice), `straggler`, `unhealthy-node`, `refused`, `failed`; "" on success.
    cause: str = ""
    flags: list[dict[str, Any]] = field(default_factory=list)  # what the attempt monitor flagged, with times

    @property
    def committed_seconds(self) -> float:
        """Training time this attempt saved in a checkpoint (its productive time)."""
        seconds = [float(m.get("committed_seconds", 0.0)) for m in self.messages if m.get("event") == "checkpoint"]
        return max(seconds, default=0.0)

    def first_event_at(self, event: str) -> float | None:
        """When the workload first reported `event` (unix time the workload stamped on it)."""
        times = [float(m["at"]) for m in self.messages if m.get("event") == event and "at" in m]
        return min(times, default=None)

    @property
    def checkpoint_seconds(self) -> float:
        """Time this attempt spent writing checkpoints (reported with each one)."""
        return sum(float(m.get("checkpoint_seconds", 0.0)) for m in self.messages if m.get("event") == "checkpoint")


class StepBackend(Protocol):
    def run_attempt(
        self,
        context: dg.AssetExecutionContext,
        pool: Pool,
        spec: StepSpec,
        extras: dict[str, Any],
    ) -> AttemptResult: ...


def runtime_interpreter(pool: Pool, spec: StepSpec) -> Path | None:
    """The interpreter a pool maps the step's runtime to (a relative path is under the
    repository); None means the interpreter running Dagster."""
    configured = pool.runtimes.get(spec.runtime, "")
    if not isinstance(configured, str):
        raise dg.Failure(
            description=(
                f"pool {pool.name}: runtime `{spec.runtime}` must be an interpreter path for a "
                f"{pool.backend.value} pool, got {configured!r}. Fix `runtimes.{spec.runtime}` in the pool catalog."
            )
        )
    if not configured:
        return None
    return Path(configured) if Path(configured).is_absolute() else REPO_ROOT / configured
