"""One protocol for every batch engine: submit, watch, signal, cancel, collect.

A backend for a cluster engine (Slurm, Ray) implements five small methods; the attempt
loop they share lives here:

1. open a Pipes session whose context and message files lie in a folder both sides see
   (the pool's `shared_dir`, or `state/pipes/` under a local storage root);
2. `submit` the workload command with the Pipes bootstrap variables, and record the job
   as in flight (so the watcher sensor can find it if this process dies);
3. `status` it until it ends. A job still pending after the pool's
   `pending_deadline_seconds` is cancelled and the pool counts as having refused it;
4. a cancelled Dagster run `signal`s the job (SIGTERM: the workload checkpoints) and
   `cancel`s it;
5. `collect` the job's own stdout/stderr into the attempt's log, and map the ending to an
   outcome: exit 0 succeeded, exit 75 or an engine preemption preempted, anything else failed.

While the job runs, an `AttemptMonitor` watches its step-time telemetry and asks
`node_problem` about its node; a straggler (by the step's policy) or an unhealthy node gets
SIGTERM, then a cancel, and the attempt ends as preempted with that cause. `qualify` says
whether a pool can take work before anything is submitted to it.
"""

from __future__ import annotations

import abc
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import dagster as dg

from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.compute.backends.base import (
    STOP_GRACE_SECONDS,
    AttemptOutcome,
    AttemptResult,
    Backend,
    JobHandle,
    JobState,
    JobStatus,
    ending_cause,
    outcome_of,
    platform_credentials,
    runtime_interpreter,
)
from control_plane.compute.backends.message_file import WholeLineMessageReader
from control_plane.compute.causes import Cause
from control_plane.compute.inflight import attempt_owner, inflight_of
from control_plane.compute.monitor import AttemptMonitor
from control_plane.settings import REPO_ROOT
from workload_runtime.inputs import WorkloadInputs
from workload_runtime.messages import Preemption, of_kind, parse_messages
from workload_runtime.storage import Storage, write_bytes_atomic
from workload_runtime.workload import PREEMPTED_EXIT_CODE


@dataclass
class Launch:
    """What to run: one command, its environment, where its own output goes."""

    name: str  # a job name the engine shows (e.g. `cell.finetune-a3`)
    command: list[str]
    env: dict[str, str]
    workdir: str
    output_path: str  # the job's stdout+stderr, on the shared folder
    # Whether the workload may hold the platform's storage credentials (`base.platform_credentials`).
    platform_credentials: bool = False


class EngineBackend(Backend):
    """Base for backends that hand the workload to a batch engine."""

    poll_seconds: ClassVar[float] = 0.5

    # The five engine calls ---------------------------------------------------------
    @abc.abstractmethod
    def submit(self, pool: Pool, spec: StepSpec, launch: Launch) -> JobHandle: ...

    def lost_node(self, handle: JobHandle, log: str) -> str | None:
        """The node a gang lost, read from the job's output, when the engine says (Slurm's `srun` does)."""
        return None

    def exit_code_hidden(self, handle: JobHandle) -> bool:
        """Whether the engine may report a signalled job without the workload's own exit code (a
        launcher in between: `srun` for a gang or a container), so the workload's Pipes message
        that it checkpointed is what says it was a preemption."""
        return False

    @abc.abstractmethod
    def collect(self, handle: JobHandle) -> bytes:
        """The job's own stdout/stderr (what `Launch.output_path` received, or the engine's logs)."""

    # Health --------------------------------------------------------------------------------
    def node_problem(self, handle: JobHandle) -> str | None:
        """Is the node a running job sits on unhealthy? None: fine; else the problem, in words."""
        return None

    # Runtimes ------------------------------------------------------------------------
    def interpreter(self, pool: Pool, spec: StepSpec) -> str:
        """The Python the pool runs this step's runtime with (a path on the pool's nodes)."""
        path = runtime_interpreter(pool, spec)
        return str(path) if path else sys.executable

    def command(self, pool: Pool, spec: StepSpec) -> list[str]:
        return [self.interpreter(pool, spec), "-m", spec.entry_point]

    # The attempt loop ------------------------------------------------------------------
    def shared_dir(self, pool: Pool, inputs: WorkloadInputs) -> Path:
        """Where the Pipes files and the job output go: a folder the orchestrator and the
        pool's nodes both mount."""
        configured = pool.backend_settings.get("shared_dir")
        if configured:
            return Path(str(configured))
        storage = Storage.at(str(inputs.storage_root))
        if storage.is_local:
            return Path(storage.root.removeprefix("file://")) / "state" / "pipes"
        root = storage.root
        raise dg.Failure(
            description=(
                f"pool {pool.name} ({self.kind}) needs `backend_settings.shared_dir`: a folder both Dagster "
                f"and the pool's nodes mount, for Pipes messages. The storage root {root} is not a local path."
            )
        )

    def run_attempt(
        self, context: dg.AssetExecutionContext, pool: Pool, spec: StepSpec, inputs: WorkloadInputs
    ) -> AttemptResult:
        if (refused := self.gang_refusal(pool, spec)) is not None:
            return refused
        attempt_id = f"{spec.name}-a{inputs.attempt}-{uuid.uuid4().hex[:8]}"
        folder = self.shared_dir(pool, inputs) / context.run_id / attempt_id
        folder.mkdir(parents=True, exist_ok=True)
        inflight = inflight_of(inputs)
        launch_base = dict(name=attempt_id, command=self.command(pool, spec), workdir=str(REPO_ROOT), output_path=str(folder / "output.log"))
        status = JobStatus(JobState.gone)
        handle: JobHandle | None = None
        started_at: float | None = None
        with dg.open_pipes_session(
            context=context,
            context_injector=dg.PipesFileContextInjector(str(folder / "context.json")),
            message_reader=WholeLineMessageReader(str(folder / "messages.jsonl")),
            extras=inputs.to_extras(),
        ) as session:
            env = {**session.get_bootstrap_env_vars(), "SINEWGRID_POOL": pool.name}
            handle = self.submit(pool, spec, Launch(env=env, platform_credentials=platform_credentials(inputs), **launch_base))
            inflight.add(handle, **attempt_owner(context, spec, inputs))
            context.log.info(f"{spec.name}: submitted to {pool.name} as {self.kind} job {handle.job_id}")
            monitor = AttemptMonitor(
                pool, spec, messages=session.get_custom_messages, node_problem=lambda: self.node_problem(handle), log=context.log.warning
            )
            try:
                status, started_at = self._watch(context, pool, handle, monitor)
            except dg.DagsterExecutionInterruptedError:
                context.log.warning(f"run cancelled: stopping {self.kind} job {handle.job_id} (SIGTERM, then cancel)")
                self._stop(handle)
                inflight.remove(handle)
                raise
        ended_at = time.time()
        inflight.remove(handle)
        log = self.collect(handle)
        log_uri = inputs.log_uri
        if log_uri:
            write_bytes_atomic(log_uri, log)
        tail = "\n".join(log.decode("utf-8", errors="replace").rstrip().splitlines()[-25:])
        messages = parse_messages(session.get_custom_messages())
        outcome, metadata = outcome_of(status), {}
        cause = ending_cause(outcome, status.exit_code, monitor.acted)
        node = monitor.acted.node if monitor.acted is not None else ""
        if (spec.gang or self.exit_code_hidden(handle)) and outcome is AttemptOutcome.failed and of_kind(messages, Preemption):
            outcome = AttemptOutcome.preempted  # the workload checkpointed and exited 75; the launcher's own code says less
            cause = ending_cause(outcome, PREEMPTED_EXIT_CODE, monitor.acted)
        elif spec.gang and outcome is AttemptOutcome.failed and (lost := self.lost_node(handle, log.decode("utf-8", errors="replace"))):
            outcome, cause, node = AttemptOutcome.preempted, Cause.lost_node, lost  # a node died: resume, without it if there is a spare
        if outcome is AttemptOutcome.succeeded:
            for result in session.get_results():
                metadata.update(getattr(result, "metadata", None) or {})
        if outcome is AttemptOutcome.refused:
            tail = status.reason
        elif status.reason:
            tail = f"[{self.kind}: {status.reason}]\n{tail}"
        queued = (started_at or time.time()) - handle.submitted_at
        return AttemptResult(
            outcome,
            status.exit_code,
            messages,
            metadata,
            log_uri=log_uri,
            log_tail=tail,
            queue_seconds=max(queued, 0.0),
            running_at=started_at,
            ended_at=ended_at,
            cause=cause,
            flags=[f.to_json() for f in monitor.flags],
            node=node,
        )

    def _watch(
        self, context: dg.AssetExecutionContext, pool: Pool, handle: JobHandle, monitor: AttemptMonitor | None = None
    ) -> tuple[JobStatus, float | None]:
        """Poll until the job ends; return how it ended and when it was first seen running.

        While it runs, the monitor may ask for it to be stopped (straggler, unhealthy node):
        SIGTERM first (the workload checkpoints and exits 75), a cancel after the grace period."""
        deadline = handle.submitted_at + pool.pending_deadline_seconds
        last_state: JobState | None = None
        started_at: float | None = None
        stop_by: float | None = None
        while True:
            status = self.status(handle)
            if status.state != last_state:
                context.log.debug(f"{self.kind} job {handle.job_id}: {status.state.value} {status.reason}".rstrip())
                last_state = status.state
            if status.state is not JobState.pending and started_at is None:
                started_at = time.time()
            if status.state.ended:
                if stop_by is not None and status.state is not JobState.succeeded:
                    # We stopped it: however the engine words the ending, the step moves on.
                    status = JobStatus(JobState.preempted, status.exit_code, f"stopped by Sinewgrid: {monitor.acted.detail}")
                return status, started_at
            if status.state is JobState.running and monitor is not None:
                if stop_by is None and monitor.poll() is not None:
                    self.signal(handle, signal.SIGTERM)
                    stop_by = time.time() + STOP_GRACE_SECONDS
                elif stop_by is not None and time.time() > stop_by:
                    context.log.warning(f"{self.kind} job {handle.job_id} did not stop within {STOP_GRACE_SECONDS:g}s of SIGTERM; cancelling it")
                    self.cancel(handle)
            if status.state is JobState.pending and time.time() > deadline:
                self.cancel(handle)
                return JobStatus(
                    JobState.cancelled,
                    reason=(
                        f"still pending after {pool.pending_deadline_seconds:g}s (the pool's `pending_deadline_seconds`)"
                        f"{': ' + status.reason if status.reason else ''}; cancelled it"
                    ),
                    exit_code=None,
                ), None
            time.sleep(self.poll_seconds)

    def _stop(self, handle: JobHandle) -> None:
        try:
            self.signal(handle, signal.SIGTERM)
        finally:
            self.cancel(handle)

