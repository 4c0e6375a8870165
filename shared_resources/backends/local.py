"""The local backend: the workload runs as a subprocess of this machine, through Pipes."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from subprocess import Popen
from typing import Any

import dagster as dg
from dagster._core.pipes.utils import open_pipes_session

from shared_resources.backends.base import AttemptOutcome, AttemptResult
from shared_resources.pools import Pool
from shared_resources.step_spec import StepSpec
from shared_resources.storage import REPO_ROOT
from shared_resources.workload import PREEMPTED_EXIT_CODE

# A process killed by these signals lost its node (spot reclaim, OOM-killer on a
# shared box) rather than failing on its own: the step is resumed, not failed.
_LOST_NODE_SIGNALS = {signal.SIGKILL, signal.SIGTERM}


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
        on_start: Callable[[Popen], None] | None = None,
    ) -> tuple[int, dg.PipesClientCompletedInvocation]:
        import os

        with open_pipes_session(
            context=context,
            context_injector=self.context_injector,
            message_reader=self.message_reader,
            extras=extras,
        ) as session:
            process = Popen(
                command,
                cwd=cwd or self.cwd,
                env={**os.environ, **self.env, **(env or {}), **session.get_bootstrap_env_vars()},
            )
            if on_start:
                on_start(process)
            try:
                process.wait()
            except dg.DagsterExecutionInterruptedError:
                # The run was cancelled: give the workload its preemption path (checkpoint, exit).
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=self.termination_timeout_seconds)
                raise
        return process.returncode, dg.PipesClientCompletedInvocation(session)


class LocalBackend:
    """Runs the workload with this interpreter on this machine."""

    def __init__(self, on_start: Callable[[Popen], None] | None = None):
        self.client = PreemptiblePipesSubprocessClient(cwd=str(REPO_ROOT))
        self.on_start = on_start

    def run_attempt(
        self,
        context: dg.AssetExecutionContext,
        pool: Pool,
        spec: StepSpec,
        extras: dict[str, Any],
    ) -> AttemptResult:
        command = [sys.executable, "-m", spec.entry_point]
        exit_code, invocation = self.client.launch(
            context=context, command=command, extras=extras, on_start=self.on_start
        )
        messages = [m for m in invocation.get_custom_messages() if isinstance(m, dict)]
        metadata: dict[str, Any] = {}
        if exit_code == 0:
            outcome = AttemptOutcome.succeeded
            results = invocation.get_results()
            for result in results:
                metadata.update(getattr(result, "metadata", None) or {})
        elif exit_code == PREEMPTED_EXIT_CODE or -exit_code in _LOST_NODE_SIGNALS:
            outcome = AttemptOutcome.preempted
        else:
            outcome = AttemptOutcome.failed
        return AttemptResult(outcome, exit_code, messages, metadata)
