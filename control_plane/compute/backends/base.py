"""The one contract every backend implements: run one attempt of a step through Dagster Pipes,
and find, signal and cancel a job again from any process (the in-flight watcher).

`LocalBackend` (a subprocess here) and `EngineBackend` (the attempt loop shared by the batch
engines: Slurm, Ray) both subclass `Backend`; Kubernetes launches through `PipesK8sClient`.
"""

from __future__ import annotations

import abc
import signal
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar

import dagster as dg

from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.compute.causes import Cause
from control_plane.compute.monitor import Flag
from control_plane.settings import REPO_ROOT
from workload_runtime.inputs import WorkloadInputs
from workload_runtime.messages import CheckpointSaved, DataRead, Message, of_kind
from workload_runtime.workload import PREEMPTED_EXIT_CODE

# A process killed by these signals lost its node (spot reclaim without notice, a node
# failure, the OOM-killer of a shared box) rather than failing on its own: the step is
# resumed from its checkpoint, not failed.
LOST_NODE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM})
# A gang's rendezvous port when it is derived from the job (a JobSet's name, Slurm's job id): in
# [20000, 32768), below Linux's default ephemeral range (32768-60999), so no outgoing connection
# on a node, which the kernel gives a port from that range, can hold it first.
RENDEZVOUS_PORTS = range(20000, 32768)


def rendezvous_port(n: int) -> int:
    """The rendezvous port for a job numbered (or hashed to) `n`."""
    return RENDEZVOUS_PORTS.start + n % len(RENDEZVOUS_PORTS)

# How long a workload asked to stop (straggler, unhealthy node) has to checkpoint and exit.
STOP_GRACE_SECONDS = 120.0


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
    messages: list[Message] = field(default_factory=list)  # what the workload reported (workload_runtime/messages.py)
    metadata: dict[str, Any] = field(default_factory=dict)  # the workload's reported result
    log_uri: str | None = None  # the process's own stdout/stderr
    log_tail: str = ""
    queue_seconds: float = 0.0  # submitted until the engine started it (waiting for capacity)
    running_at: float | None = None  # unix time the workload was first seen running
    ended_at: float | None = None  # unix time the platform saw the attempt end
    cause: str = ""  # a `Cause`
    flags: list[dict[str, Any]] = field(default_factory=list)  # what the attempt monitor flagged, with times
    node: str = ""  # the node at fault when the backend knows it (a gang's lost node, the monitor's slow or sick one)

    @property
    def committed_seconds(self) -> float:
        """Training time this attempt saved in a checkpoint (its productive time)."""
        return max((m.committed_seconds for m in of_kind(self.messages, CheckpointSaved)), default=0.0)

    @property
    def data_bytes(self) -> tuple[int, int]:
        """Bytes of datasets and checkpoints the attempt read: (from the node cache, from the store)."""
        reads = of_kind(self.messages, DataRead)
        return sum(m.cache_bytes for m in reads), sum(m.store_bytes for m in reads)

    def first_at(self, kind: type) -> float | None:
        """When the workload first reported a message of `kind` (unix time it stamped on it)."""
        return min((m.at for m in of_kind(self.messages, kind) if m.at is not None), default=None)

    @property
    def checkpoint_seconds(self) -> float:
        """Time this attempt spent writing checkpoints (reported with each one)."""
        return sum(m.checkpoint_seconds or 0.0 for m in of_kind(self.messages, CheckpointSaved))


def ending_cause(outcome: AttemptOutcome, exit_code: int | None, acted: Flag | None) -> str:
    """Why an attempt ended, for the ledger: the monitor's flag if it stopped the attempt;
    `notice` (SIGTERM, checkpointed, exit 75), `lost-node` (killed without notice),
    `reclaimed` (the engine took it back), `refused`, `failed`; "" on success (also when the
    monitor acted but the workload finished before the stop reached it: nothing was lost)."""
    if outcome is AttemptOutcome.succeeded:
        return Cause.none
    if acted is not None:
        return acted.cause
    if outcome is AttemptOutcome.refused:
        return Cause.refused
    if outcome is AttemptOutcome.preempted:
        if exit_code == PREEMPTED_EXIT_CODE:
            return Cause.notice
        return Cause.lost_node if killed_by_lost_node(exit_code) else Cause.reclaimed
    return Cause.failed


class JobState(StrEnum):
    pending = "pending"  # accepted, waiting for capacity
    running = "running"
    succeeded = "succeeded"
    failed = "failed"  # ended on its own with a non-zero exit
    preempted = "preempted"  # the engine took the capacity back (requeue, spot reclaim, node lost)
    cancelled = "cancelled"  # someone cancelled it
    gone = "gone"  # the engine no longer knows the job

    @property
    def ended(self) -> bool:
        return self not in (JobState.pending, JobState.running)


@dataclass
class JobStatus:
    state: JobState
    exit_code: int | None = None
    reason: str = ""  # the engine's own words (e.g. Slurm's pending reason)


@dataclass
class JobHandle:
    """Enough to find a job again from any process: written to `state/inflight/`."""

    backend: str
    pool: str
    job_id: str
    submitted_at: float
    info: dict[str, Any] = field(default_factory=dict)  # backend-specific (log path, address...)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobHandle:
        return cls(**data)


def outcome_of(status: JobStatus) -> AttemptOutcome:
    """How an engine job's ending maps to the attempt's outcome."""
    if status.state is JobState.succeeded:
        return AttemptOutcome.succeeded
    if status.state is JobState.cancelled and status.exit_code is None:
        return AttemptOutcome.refused  # never ran (pending deadline): capacity, not code
    if status.state is JobState.preempted or status.exit_code == PREEMPTED_EXIT_CODE:
        return AttemptOutcome.preempted
    if status.state is JobState.gone and status.exit_code is None:
        return AttemptOutcome.preempted  # the engine lost it (node gone): resume elsewhere
    if killed_by_lost_node(status.exit_code):
        return AttemptOutcome.preempted  # killed from outside without notice (node lost, spot reclaim)
    return AttemptOutcome.failed


class Backend(abc.ABC):
    """What the compute resource and the watcher need of a backend.

    A backend is registered by kind in `control_plane/catalog/backends.py` (its settings
    model and this class's import path) and reads its pool's settings with `settings_for(pool)`.
    """

    kind: ClassVar[str]
    # Whether the backend starts a gang's ranks together (`StepSpec.gang`). One that does not
    # refuses a gang, so that it moves to a pool that can run all of its ranks, never part of them.
    runs_gangs: ClassVar[bool] = False

    def gang_refusal(self, pool: Pool, spec: StepSpec) -> AttemptResult | None:
        """A refusal for a gang this backend cannot start whole; None when it can (or no gang)."""
        if not spec.gang or self.runs_gangs:
            return None
        return AttemptResult(
            AttemptOutcome.refused, None, cause=Cause.refused, ended_at=time.time(),
            log_tail=(
                f"{pool.name} ({self.kind}) does not start gangs yet: {spec.name} needs {spec.nodes} node(s) × "
                f"{spec.ranks_per_node or 1} rank(s) started together (local, Slurm and Ray pools do; docs/gangs.md)"
            ),
        )  # fmt: skip

    @abc.abstractmethod
    def run_attempt(self, context: dg.AssetExecutionContext, pool: Pool, spec: StepSpec, inputs: WorkloadInputs) -> AttemptResult:
        """Run one attempt of `spec` on `pool`, with `inputs` in the Pipes extras, and say how it ended."""

    def qualify(self, pool: Pool) -> str | None:
        """Can this pool take work now, from the engine's point of view? None: yes; else the
        problem in words (a `Refusal` when it is about capacity, not health)."""
        return None

    def drain_node(self, pool: Pool, node: str, reason: str) -> bool:
        """Take one node of the pool out of service (a gang's failed node), where the engine has
        nodes to drain; True if it did. Local nodes are this machine: nothing to drain."""
        return False

    @abc.abstractmethod
    def status(self, handle: JobHandle) -> JobStatus: ...

    @abc.abstractmethod
    def signal(self, handle: JobHandle, signum: int = signal.SIGTERM) -> None: ...

    @abc.abstractmethod
    def cancel(self, handle: JobHandle) -> None:
        """Stop the job: SIGTERM first where the engine allows (the workload checkpoints)."""


def runtime_interpreter(pool: Pool, spec: StepSpec) -> Path | None:
    """The interpreter a pool maps the step's runtime to (a relative path is under the
    repository); None means the interpreter running Dagster."""
    configured = pool.runtimes.get(spec.runtime, "")
    if not isinstance(configured, str):
        raise dg.Failure(
            description=(
                f"pool {pool.name}: runtime `{spec.runtime}` must be an interpreter path for a "
                f"{pool.backend} pool, got {configured!r}. Fix `runtimes.{spec.runtime}` in the pool catalog."
            )
        )
    if not configured:
        return None
    return Path(configured) if Path(configured).is_absolute() else REPO_ROOT / configured


def platform_credentials(inputs: WorkloadInputs) -> bool:
    """Whether a step's workload may hold the platform's storage credentials: only when its tenant
    has none of its own (the platform's own steps, a tenant on the platform's storage). A tenant
    with credentials gets only its own, through its inputs (`workload_runtime/allowed_env.py`)."""
    return inputs.tenant is None or inputs.tenant.credentials is None
