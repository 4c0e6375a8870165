"""The local backend: the workload runs as a subprocess of this machine, through Pipes."""

from __future__ import annotations

import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from subprocess import TimeoutExpired
from typing import IO, Any

import dagster as dg
import psutil

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
    killed_by_lost_node,
    platform_credentials,
    runtime_interpreter,
)
from control_plane.compute.backends.gang import GangProcess, gang_starter, kill_node, local_nodes
from control_plane.compute.backends.message_file import WholeLineTempFileMessageReader
from control_plane.compute.backends.warm_start import Process, start_process
from control_plane.compute.causes import Cause
from control_plane.compute.cooldowns import pool_slot
from control_plane.compute.health import run_health_check
from control_plane.compute.inflight import attempt_owner, inflight_of
from control_plane.compute.monitor import AttemptMonitor
from control_plane.settings import REPO_ROOT, workload_env
from workload_runtime.inputs import WorkloadInputs
from workload_runtime.messages import Preemption, of_kind, parse_messages
from workload_runtime.storage import write_bytes_atomic
from workload_runtime.workload import PREEMPTED_EXIT_CODE


class PreemptiblePipesSubprocessClient(dg.PipesSubprocessClient):
    """`PipesSubprocessClient` that hands back the exit code instead of raising on it.

    The stock client turns any non-zero exit into an exception whose only trace of the
    code is its message; the platform needs the code itself to tell a preemption (resume)
    from a crash (fail), and the process handle to pass on termination.
    """

    def launch(
        self,
        *,
        context: dg.AssetExecutionContext,
        command: Sequence[str],
        extras: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output: IO[bytes] | None = None,
        on_started: Callable[[Process], None] | None = None,
        on_ended: Callable[[Process], None] | None = None,
        on_poll: Callable[[Process, Any], None] | None = None,
        imports: Sequence[str] = (),
        start: Callable[..., Process] | None = None,
        with_platform_credentials: bool = False,
    ) -> tuple[int, dg.PipesClientCompletedInvocation]:
        """Run `command` in a Pipes session; return its exit code and what it reported.

        `output`, if given, receives the process's stdout and stderr (the workload's own
        reports travel through Pipes either way). `on_started`/`on_ended` see the process
        (the backend records it as in flight between the two); `on_poll` sees it and the
        Pipes session a few times a second while it runs (the attempt monitor). `imports`: the
        libraries the workload needs, imported ahead when it starts warm (`warm_start.py`).
        `start`: how to start it (`start_process` unless given; a gang's `GangProcess.start`).
        Its environment is an allow-list (`workload_runtime/allowed_env.py`), never this process's
        whole one: the platform's storage credentials only `with_platform_credentials`.
        """
        with dg.open_pipes_session(
            context=context,
            context_injector=self.context_injector,
            message_reader=self.message_reader,
            extras=extras,
        ) as session:
            process = (start or start_process)(
                command,
                cwd=cwd or self.cwd,
                env=workload_env(platform_credentials=with_platform_credentials, extra={**self.env, **(env or {}), **session.get_bootstrap_env_vars()}),
                output=output,
                imports=imports,
            )
            if on_started:
                on_started(process)
            try:
                while True:
                    try:
                        process.wait(timeout=0.25)
                        break
                    except TimeoutExpired:
                        if on_poll:
                            on_poll(process, session)
            except dg.DagsterExecutionInterruptedError:
                # The run was cancelled: give the workload its preemption path (checkpoint, exit).
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=self.termination_timeout_seconds)
                raise
            finally:
                if on_ended:
                    on_ended(process)
        return process.returncode, dg.PipesClientCompletedInvocation(session)


class LocalBackend(Backend):
    """Runs the workload with this interpreter on this machine, forked from a warm interpreter
    that has imported the step's libraries (`warm_start.py`; `SINEWGRID_WARM_START=0`: cold).

    While it runs, the process is recorded in flight (pid and start time, so a reused pid
    is never mistaken for it) and the watcher sensor can stop it if the run that owns it
    is gone.
    """

    kind = "local"
    runs_gangs = True  # one torchrun per node (gang.py)

    def __init__(self) -> None:
        # Dagster's default reader can parse half a line the workload is still writing (message_file.py).
        self.client = PreemptiblePipesSubprocessClient(cwd=str(REPO_ROOT), message_reader=WholeLineTempFileMessageReader())

    @staticmethod
    def interpreter(pool: Pool, spec: StepSpec) -> str:
        """The Python that runs this step's runtime on this machine (the pool's mapping)."""
        path = runtime_interpreter(pool, spec)
        if path is None:
            return sys.executable
        if not path.exists():
            raise dg.Failure(
                description=(
                    f"{spec.name} needs the `{spec.runtime}` runtime, which pool {pool.name} maps to {path}, "
                    f"but that interpreter does not exist. Build it (for Isaac Lab: `make isaaclab-runtime`)."
                )
            )
        return str(path)

    def run_attempt(
        self,
        context: dg.AssetExecutionContext,
        pool: Pool,
        spec: StepSpec,
        inputs: WorkloadInputs,
    ) -> AttemptResult:
        command = [self.interpreter(pool, spec), "-m", spec.entry_point]
        start = gang_starter(self.interpreter(pool, spec), pool, spec) if spec.gang else None
        if spec.gang and len(local_nodes(pool, spec)) < spec.nodes:
            return AttemptResult(
                AttemptOutcome.refused, None, cause=Cause.refused, ended_at=time.time(),
                log_tail=f"{pool.name} has {pool.nodes} nodes, {len(spec.exclude_nodes)} of them replaced; the gang needs {spec.nodes}",
            )  # fmt: skip
        with pool_slot(pool) as slot:
            if slot is None:
                return AttemptResult(
                    AttemptOutcome.refused, None, log_tail=f"all {pool.max_concurrent_steps} slots of {pool.name} are busy", cause=Cause.refused, ended_at=time.time()
                )
            # The process's own output (library banners, warnings) goes to a log file per attempt,
            # kept in the object store beside the run; what the workload reports comes through Pipes.
            inflight = inflight_of(inputs) if inputs.storage_root else None
            handles: list[JobHandle] = []

            def started(process: Process) -> None:
                if isinstance(process, GangProcess):
                    gang.append(process)
                    handles.append(self.handle_for_gang(pool, process.pids))
                else:
                    handles.append(self.handle_for(pool, process.pid, getattr(process, "create_time", None)))
                if inflight:
                    inflight.add(handles[0], **attempt_owner(context, spec, inputs))

            times: dict[str, float] = {}
            gang: list[GangProcess] = []
            monitor: list[AttemptMonitor] = []
            stop_by: list[float] = []

            def ended(process: Process) -> None:
                times["ended"] = time.time()
                if inflight and handles:
                    inflight.remove(handles[0])

            def poll(process: Process, session) -> None:
                if not monitor:
                    times["running"] = time.time()
                    monitor.append(
                        AttemptMonitor(
                            pool, spec, messages=session.get_custom_messages, node_problem=lambda: run_health_check(pool), log=context.log.warning
                        )
                    )
                if monitor[0].poll() is not None:
                    process.send_signal(signal.SIGTERM)  # checkpoint and exit 75: the step moves
                    stop_by.append(time.time() + STOP_GRACE_SECONDS)
                elif stop_by and time.time() > stop_by[0]:
                    context.log.warning(f"{spec.name} did not stop within {STOP_GRACE_SECONDS:g}s of SIGTERM; killing it")
                    process.kill()

            started_at = time.time()
            with tempfile.TemporaryFile() as output:
                exit_code, invocation = self.client.launch(
                    context=context, command=command, extras=inputs.to_extras(), output=output, on_started=started, on_ended=ended, on_poll=poll,
                    imports=spec.imports, start=start, with_platform_credentials=platform_credentials(inputs),
                )
                output.seek(0)
                log = output.read()
        log_uri = inputs.log_uri
        if log_uri:
            write_bytes_atomic(log_uri, log)
        tail = "\n".join(log.decode("utf-8", errors="replace").rstrip().splitlines()[-25:])
        messages = parse_messages(invocation.get_custom_messages())
        if spec.gang and exit_code not in (0, None) and not killed_by_lost_node(exit_code) and of_kind(messages, Preemption):
            exit_code = PREEMPTED_EXIT_CODE  # torchrun exits 1 whatever its ranks' codes; rank 0 said they checkpointed
        metadata: dict[str, Any] = {}
        if exit_code == 0:
            outcome = AttemptOutcome.succeeded
            results = invocation.get_results()
            for result in results:
                metadata.update(getattr(result, "metadata", None) or {})
        elif exit_code == PREEMPTED_EXIT_CODE or killed_by_lost_node(exit_code):
            outcome = AttemptOutcome.preempted
        else:
            outcome = AttemptOutcome.failed
        acted = monitor[0].acted if monitor else None
        cause = ending_cause(outcome, exit_code, acted)
        node = acted.node if acted is not None else ""
        if gang and cause == Cause.lost_node and gang[0].failed_node:
            node = gang[0].failed_node  # the node whose agent was killed: its ranks went with it
        return AttemptResult(
            outcome,
            exit_code,
            messages,
            metadata,
            log_uri=log_uri,
            log_tail=tail,
            running_at=started_at,
            ended_at=times.get("ended", time.time()),
            cause=cause,
            flags=[f.to_json() for f in monitor[0].flags] if monitor else [],
            node=node,
        )

    # Health ---------------------------------------------------------------------------
    @staticmethod
    def qualify(pool: Pool) -> str | None:
        """A local pool can take work when its node (this machine) passes its health check."""
        return run_health_check(pool)

    # Handles, for the watcher ---------------------------------------------------------
    @staticmethod
    def handle_for(pool: Pool, pid: int, create_time: float | None = None) -> JobHandle:
        """A handle on process `pid`. `create_time`: its start time when already known (a forked
        workload that ended at once is reaped by its forkserver before it could be looked up)."""
        created = create_time if create_time is not None else psutil.Process(pid).create_time()
        return JobHandle("local", pool.name, str(pid), time.time(), {"create_time": created})

    @staticmethod
    def handle_for_gang(pool: Pool, pids: list[int]) -> JobHandle:
        """A handle on a gang's node agents (`gang.py`): the first is the job id."""
        created = [psutil.Process(pid).create_time() for pid in pids]
        return JobHandle("local", pool.name, str(pids[0]), time.time(), {"create_time": created[0], "nodes": [list(n) for n in zip(pids, created)]})

    @classmethod
    def _processes(cls, handle: JobHandle) -> list[psutil.Process]:
        """The handle's processes still alive: the one workload, or each node of a gang."""
        nodes = handle.info.get("nodes") or [[int(handle.job_id), handle.info["create_time"]]]
        return [p for pid, created in nodes if (p := cls._alive(int(pid), float(created)))]

    @staticmethod
    def _process(handle: JobHandle) -> psutil.Process | None:
        """The handle's process while it lives: None once it has ended (a zombie, exited but
        not yet reaped by its parent, has ended too) or when its pid now names another process."""
        return LocalBackend._alive(int(handle.job_id), float(handle.info["create_time"]))

    @staticmethod
    def _alive(pid: int, create_time: float) -> psutil.Process | None:
        try:
            process = psutil.Process(pid)
            if abs(process.create_time() - create_time) > 0.01:
                return None  # the pid was reused by another process
            if process.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                return None
            return process
        except psutil.NoSuchProcess:  # ZombieProcess included
            return None

    def status(self, handle: JobHandle) -> JobStatus:
        # Only a look: reaping a zombie here would take its exit code from the parent that waits
        # for it (a `Popen` reaped by someone else reports exit 0, a crash read as a success).
        alive = self._processes(handle)
        return JobStatus(JobState.running) if alive else JobStatus(JobState.gone, reason="process not found or ended")

    def signal(self, handle: JobHandle, signum: int = signal.SIGTERM) -> None:
        for process in self._processes(handle):
            process.send_signal(signum)

    def cancel(self, handle: JobHandle, grace_seconds: float = 10.0) -> None:
        """SIGTERM (the workload checkpoints and exits), SIGKILL after `grace_seconds`; returns
        once the process has ended, reaped if it is this process's child (psutil's `wait` reaps
        its own children), so its status reads `gone` from then on. A gang's nodes are stopped
        together, each with the ranks in its process group."""
        processes = self._processes(handle)
        for process in processes:
            try:
                process.terminate()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(processes, timeout=grace_seconds)
        for process in alive:
            if "nodes" in handle.info:
                kill_node(process.pid)  # the node's ranks too
            else:
                try:
                    process.kill()
                except psutil.NoSuchProcess:
                    pass
        # SIGKILL cannot be caught: only a stuck kernel call delays it, and then no signal can help.
        psutil.wait_procs(alive, timeout=STOP_GRACE_SECONDS)
