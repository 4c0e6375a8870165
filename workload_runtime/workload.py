"""The workload-side helper: the same life for every workload on every backend.

A workload is a plain entry point (`python -m cell_lane.workloads.pretrain`). It talks
back only through Dagster Pipes and the object store, so it runs unchanged on the
local machine, in a Slurm job, a Kubernetes pod or a Ray job::

    with WorkloadRun() as run:
        cfg = run.config_as(MyConfig)             # the workload's config model, validated
        state = run.resume()                      # newest valid checkpoint, or None (a final one ends the run)
        for step in range(state.step if state else 0, cfg.steps):
            ...train one step...
            run.step_done(step + 1, lambda: {"model": model.state_dict()}, loss=loss)
        run.finish(cfg.steps, files, metadata={...})

`step_done` checkpoints on the cadence the platform passed in and, when SIGTERM
arrives (preemption on every backend here), checkpoints at once and exits with
PREEMPTED_EXIT_CODE so the platform relaunches it instead of calling it a failure.

Started as one rank of a gang (`torchrun`, `srun`, the Ray and Kubernetes launchers: see
`workload_runtime/gang.py`), the same loop runs on every rank: `run.gang` is this rank's membership
(None alone), the ranks agree at every `step_done` on checkpoints and preemption, checkpoints
returned as `ShardedState` are written by all ranks together (`workload_runtime/sharded.py`), and only
rank 0 talks to Dagster Pipes (it reports every rank's step time).

What the platform passes besides the config is one typed model, `WorkloadInputs`
(`workload_runtime/inputs.py`); what the workload reports back are the typed messages of
`workload_runtime/messages.py`. Outside Dagster (by hand, in a test) the inputs come from
`--extras FILE.json` or the `SINEWGRID_WORKLOAD_EXTRAS` variable, and reports go to stderr.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from dagster_pipes import PipesContext, PipesEnvVarParamsLoader, open_dagster_pipes
from pydantic import BaseModel, ValidationError

from workload_runtime.checkpoints import Checkpoint, CheckpointStore, Framework
from workload_runtime.failpoints import hold
from workload_runtime.inputs import WorkloadInputs, field_problems
from workload_runtime.messages import BaseMessage, CheckpointSaved, DataRead, Preemption, Progress, Resumed, Telemetry
from workload_runtime.node_cache import NodeCache
from workload_runtime.node_env import EXTRAS_ENV, node_env  # noqa: F401 - EXTRAS_ENV: imported from here too
from workload_runtime.standalone import StandaloneReporter, standalone_inputs

if TYPE_CHECKING:
    from workload_runtime.gang import Gang
    from workload_runtime.sharded import PendingSave

# EX_TEMPFAIL: "temporary failure; the user is invited to retry". Distinct from a
# crash (1) and from death by signal (128 + n), so the platform can tell them apart.
PREEMPTED_EXIT_CODE = 75

Files = Mapping[str, Mapping[str, Any]]
C = TypeVar("C", bound=BaseModel)


class ShardedState(dict):
    """A checkpoint's state as a `torch.distributed.checkpoint` state dict (nested mappings of
    tensors, e.g. `torch_state.sharded_state(...)`): `WorkloadRun` writes it with every rank of
    the gang (`workload_runtime/sharded.py`) instead of as safetensors files from one process."""


class WorkloadConfigError(SystemExit):
    """The workload's config does not fit its model: exits 1 with every bad field named."""


class Preempted(Exception):
    """Raised inside the workload once its preemption checkpoint is safe."""


class AlreadyComplete(Exception):
    """Raised by `resume` on a final checkpoint, its result reported again: the run ends, successfully."""


class WorkloadRun:
    """Pipes session, resume, checkpoint cadence, preemption and productive-time accounting.

    `framework` is what `resume` hands back the checkpoint's tensors as: torch (the default)
    or numpy, for a workload that does without torch and its seconds of start-up.
    """

    def __init__(self, argv: list[str] | None = None, framework: Framework = "torch"):
        self._argv = sys.argv[1:] if argv is None else argv
        self._framework: Framework = framework
        self.preempt_requested = False
        self._pipes: PipesContext | StandaloneReporter | None = None
        self._started = time.monotonic()
        self._work_seconds = 0.0  # training time since this attempt resumed
        self._work_mark: float | None = None
        self._last_saved_step: int | None = None
        self._last_save_at = time.monotonic()
        # Step-time telemetry: mean seconds per step since the last report, every `telemetry_seconds`.
        self._telemetry_mark: tuple[float, int] | None = None
        self._telemetry_reports = 0
        self._rank_busy: list[float] = []  # gang leader: each rank's busy seconds since the last report
        self.gang: Gang | None = None
        self._pending: PendingSave | None = None  # a gang's checkpoint being written in the background

    # Life cycle ---------------------------------------------------------------
    def __enter__(self) -> WorkloadRun:
        member = None
        if node_env().in_gang:
            from workload_runtime.gang import member_from_env

            member = member_from_env()
        if PipesEnvVarParamsLoader().is_dagster_pipes_process() and (member is None or member.leader):
            self._pipes = open_dagster_pipes()
            self.inputs = WorkloadInputs.from_extras(self._pipes.extras)
        elif member is not None and not member.leader:
            # The other ranks stay off Pipes (rank 0 speaks for the gang); they read the same inputs.
            self._pipes = StandaloneReporter({}, rank=member.rank, level=logging.WARNING)
            self.inputs = self._rank_inputs()
        else:
            self.inputs = standalone_inputs(self._argv)
            self._pipes = StandaloneReporter(self.inputs.to_extras())
        if not self.inputs.checkpoint_uri:
            raise SystemExit("This workload needs `checkpoint_uri` in its inputs: where its checkpoints live.")
        self.config: dict[str, Any] = dict(self.inputs.config)
        self.checkpoint_every = self.inputs.checkpoint_every_steps
        self.checkpoint_interval = self.inputs.checkpoint_interval_seconds
        self.attempt = self.inputs.attempt
        self.telemetry_seconds = self.inputs.telemetry_seconds
        if self.inputs.tenant is not None:
            self.inputs.tenant.apply()  # its credentials replace inherited ones; its key seals what it writes
        self.cache = NodeCache.from_env(warn=self.warning)
        self.checkpoints = CheckpointStore(
            self.inputs.checkpoint_uri, warn=self.warning, failpoint=self.inputs.failpoint, framework=self._framework, cache=self.cache
        )
        signal.signal(signal.SIGTERM, self._on_sigterm)
        if member is not None:
            from workload_runtime.gang import Gang

            self.gang = Gang.join(member)
            self.info(f"rank 0 of a gang of {member.world_size} ranks on {member.nodes} node(s): {', '.join(sorted(set(self.gang.nodes_by_rank)))}")
        return self

    def _rank_inputs(self) -> WorkloadInputs:
        """A non-leader rank's inputs: the Pipes extras read without opening the session, or
        the standalone sources when started by hand."""
        return WorkloadInputs.from_pipes_env() or standalone_inputs(self._argv)

    def config_as(self, model: type[C]) -> C:
        """The workload's config as its model; exits with every bad field named otherwise."""
        try:
            return model.model_validate(self.config)
        except ValidationError as exc:
            problems = field_problems(exc, model.__name__)
            self.log.error(f"{model.__name__}: {problems}")
            raise WorkloadConfigError(f"this workload's config does not fit {model.__name__}: {problems}") from None

    def __exit__(self, exc_type, exc, tb) -> bool:
        finished_before = isinstance(exc, AlreadyComplete)  # the run ends here as it ended before
        exc_type, exc, tb = (None, None, None) if finished_before else (exc_type, exc, tb)
        if self.gang is not None and exc is None:
            self.gang.leave()
        if isinstance(exc, Preempted):
            self.report(Preemption(step=self._last_saved_step))
            self.info(f"preempted: checkpoint at step {self._last_saved_step} is safe; exiting {PREEMPTED_EXIT_CODE}")
            if self.gang is not None:
                self.gang.leave()
            if isinstance(self._pipes, PipesContext):
                self._pipes.close()
            sys.exit(PREEMPTED_EXIT_CODE)
        # Close the Pipes session either way; with an exception, Pipes reports it to Dagster.
        if isinstance(self._pipes, PipesContext):
            self._pipes.__exit__(exc_type, exc, tb)
        return finished_before

    def _on_sigterm(self, signum, frame) -> None:
        # Only set a flag: the training loop checkpoints at the end of the current step.
        self.preempt_requested = True

    # Reporting ------------------------------------------------------------------
    @property
    def log(self) -> logging.Logger:
        return self._pipes.log  # type: ignore[union-attr]

    def info(self, msg: str) -> None:
        self.log.info(msg)

    def warning(self, msg: str) -> None:
        self.log.warning(msg)

    def report(self, message: BaseMessage) -> None:
        """A typed event for the platform (`workload_runtime/messages.py`: checkpoints, progress,
        telemetry, preemption), stamped with the wall-clock time (`at`, unix seconds)."""
        if self.gang is not None and not self.gang.leader:
            return  # rank 0 speaks for the gang
        stamped = message.model_copy(update={"at": round(time.time(), 4)})
        self._pipes.report_custom_message(stamped.payload())  # type: ignore[union-attr]

    def _telemetry(self, step: int) -> None:
        """Report the mean time per step since the last report (the straggler detector reads it)."""
        now = time.monotonic()
        if self._telemetry_mark is None:
            self._telemetry_mark = (now, step)
            return
        since, first = self._telemetry_mark
        if now - since >= self.telemetry_seconds and step > first:
            self.report(Telemetry(step=step, step_seconds=round((now - since) / (step - first), 6)))
            self._telemetry_mark = (now, step)
            self._telemetry_reports += 1

    def _hold(self, step: int) -> float:
        """A drill's `hold` failpoint (see `Failpoint`): wait here, between units, for its fault.
        The wait is neither work, nor step time, nor time towards a time-based checkpoint.
        Returns the seconds held (0 when it did not fire)."""
        began = time.monotonic()
        if self._pending is not None and self.inputs.failpoint is not None and self.inputs.failpoint.at_step == step:
            self.settle_checkpoint()  # a drill's fault lands after the checkpoints before it are safe
        if not hold(self.inputs.failpoint, step, reports=self._telemetry_reports, stop=lambda: self.preempt_requested):
            return 0.0
        held = time.monotonic() - began
        self._last_save_at += held
        if self._work_mark is not None:
            self._work_mark += held
        if self._telemetry_mark is not None:
            self._telemetry_mark = (self._telemetry_mark[0] + held, self._telemetry_mark[1])
        return held

    # Resume and checkpoint -------------------------------------------------------
    def resume(self, *, final_ends_run: bool = True) -> Checkpoint | None:
        """The newest valid checkpoint (torn or corrupt ones are skipped with a warning), or None.
        A final one ends the run, its result reported again (unless not `final_ends_run`)."""
        checkpoint = self.checkpoints.latest_valid()
        if any(self.checkpoints.read_bytes):
            from_cache, from_store = self.checkpoints.read_bytes
            self.report(DataRead(kind="checkpoint", uri=self.checkpoints.uri, cache_bytes=from_cache, store_bytes=from_store))
        if checkpoint is None:
            self.info(f"no checkpoint under {self.checkpoints.uri}; starting from step 0")
        else:
            self.info(f"resuming from {checkpoint.uri} (step {checkpoint.step})")
            self._last_saved_step = checkpoint.step
        self.report(Resumed(step=checkpoint.step if checkpoint else 0))
        self._work_mark = time.monotonic()
        if checkpoint is not None and checkpoint.final and final_ends_run:
            self.report_already_complete(checkpoint)
            raise AlreadyComplete()
        return checkpoint

    def cached(self, uri: str) -> str:
        """Where to read the dataset at `uri` on this node: a verified local copy from the node
        cache (`workload_runtime/node_cache.py`), fetched from the store only where it is missing or
        changed; `uri` itself when it is a local path or the cache is off. Reports the bytes."""
        if self.cache is None:
            return uri
        fetched = self.cache.fetch(uri)
        self.report(DataRead(kind="dataset", uri=uri, cache_bytes=fetched.cache_bytes, store_bytes=fetched.store_bytes))
        self.info(f"{uri}: {fetched.cache_bytes / 1e6:.1f} MB from the node cache, {fetched.store_bytes / 1e6:.1f} MB from the store")
        return fetched.path

    def _committed_seconds(self) -> float:
        if self._work_mark is not None:
            now = time.monotonic()
            self._work_seconds += now - self._work_mark
            self._work_mark = now
        return self._work_seconds

    def save(self, step: int, files: Files, *, meta: Mapping[str, Any] | None = None, final: bool = False) -> str:
        committed = self._committed_seconds()  # work up to here; the write itself is not work
        began = time.monotonic()
        lineage = self.inputs.lineage.model_dump() if self.inputs.lineage else {}
        if isinstance(files, ShardedState):
            from workload_runtime.sharded import save_sharded, start_sharded_save

            self.settle_checkpoint()  # one write in flight at a time, and in step order
            leader = self.gang is None or self.gang.leader
            if self.gang is not None and not self.preempt_requested:  # in the background: training goes on
                self._pending = start_sharded_save(
                    self.checkpoints, step, files, group=self.gang.checkpoint_group, leader=leader, committed_seconds=committed, meta=meta, lineage=lineage
                )
                self._last_save_at = time.monotonic()
                if self._work_mark is not None:
                    self._work_mark = time.monotonic()
                return self._pending.where
            where = save_sharded(self.checkpoints, step, files, leader=leader, meta=meta, lineage=lineage)
        else:
            where = self.checkpoints.save(step, files, meta=meta, lineage=lineage, final=final)
        written = time.monotonic() - began
        if self._work_mark is not None:
            self._work_mark = time.monotonic()
        self._last_saved_step = step
        self._last_save_at = time.monotonic()
        self.report(
            CheckpointSaved(step=step, uri=where, final=final, committed_seconds=round(committed, 3), checkpoint_seconds=round(written, 3))
        )
        return where

    def settle_checkpoint(self, block: bool = True) -> None:
        """Finish the checkpoint written in the background, if any (without `block`: only if its
        files are all written), publish it and report it."""
        pending = self._pending
        if pending is None or not (block or pending.done()):
            return
        self._pending = None
        pending.wait()
        self._last_saved_step = pending.step
        self.report(CheckpointSaved(step=pending.step, uri=pending.where, committed_seconds=pending.committed_seconds, checkpoint_seconds=pending.blocked_seconds))

    def commit(self, step: int, **info: Any) -> None:
        """Report work made durable by the workload itself (e.g. an episode file written
        atomically), for workloads whose progress is their output rather than a model."""
        self._last_saved_step = step
        self.report(CheckpointSaved(step=step, committed_seconds=round(self._committed_seconds(), 3), **info))
        self._telemetry(step)
        self._hold(step)

    def start_work(self, step: int = 0) -> None:
        """Start counting productive time (for workloads that do not call `resume`), from `step`
        units already done (e.g. episodes a previous attempt committed)."""
        self._work_mark = time.monotonic()
        self.report(Resumed(step=step))

    def step_done(
        self,
        step: int,
        files: Callable[[], Files],
        *,
        meta: Callable[[], Mapping[str, Any]] | None = None,
        **metrics: float,
    ) -> None:
        """Call after each training step with the number of steps now done.

        Checkpoints every `checkpoint_every_steps` steps, and also once `checkpoint_interval_seconds`
        (the Young/Daly interval placement worked out for the pool, if it is interruptible) have
        passed since the last checkpoint, and at once when SIGTERM has arrived. A drill's `hold`
        failpoint may make it wait here, after any checkpoint due at `step` (in a gang: before it,
        so that its peers wait for it in the step's agreement).
        """
        if self.gang is not None:
            self._gang_step_done(step, files, meta, metrics)
            return
        self._telemetry(step)
        on_cadence = step % self.checkpoint_every == 0
        if self.checkpoint_interval and time.monotonic() - self._last_save_at >= self.checkpoint_interval:
            on_cadence = True
        if on_cadence or self.preempt_requested:
            self._checkpoint(step, files, meta, metrics)
        self._hold(step)
        if self.preempt_requested:
            if self._last_saved_step != step:  # SIGTERM arrived after the check above (or while held)
                self._checkpoint(step, files, meta, metrics)
            raise Preempted()

    def _gang_step_done(self, step: int, files: Callable[[], Files], meta: Callable[[], Mapping[str, Any]] | None, metrics: Mapping[str, float]) -> None:
        """`step_done` for one rank of a gang: every rank takes the same decision at the same step."""
        assert self.gang is not None
        self.settle_checkpoint(block=False)
        held = self._hold(step)
        interval_due = bool(self.checkpoint_interval and time.monotonic() - self._last_save_at >= self.checkpoint_interval)
        agreed = self.gang.agree(preempt=self.preempt_requested, checkpoint_due=interval_due, idle_seconds=held)
        if self.gang.leader:
            self._gang_telemetry(step, agreed.busy_seconds)
        if agreed.preempt:  # a peer's notice is this rank's too: its checkpoint is written at once
            self.preempt_requested = True
        if step % self.checkpoint_every == 0 or agreed.checkpoint_due or agreed.preempt:
            self._checkpoint(step, files, meta, metrics)
            self.gang.restart_step_clock()
        if agreed.preempt:
            raise Preempted()

    def _gang_telemetry(self, step: int, busy: list[float]) -> None:
        """The gang leader's step-time report: the gang's pace and each rank's busy time per step."""
        self._rank_busy = [a + b for a, b in zip(self._rank_busy, busy, strict=True)] if self._rank_busy else list(busy)
        now = time.monotonic()
        if self._telemetry_mark is None:
            self._telemetry_mark, self._rank_busy = (now, step), []
            return
        since, first = self._telemetry_mark
        if now - since >= self.telemetry_seconds and step > first:
            steps = step - first
            assert self.gang is not None
            self.report(
                Telemetry(
                    step=step,
                    step_seconds=round((now - since) / steps, 6),
                    rank_seconds=[round(b / steps, 6) for b in self._rank_busy],
                    nodes=self.gang.nodes_by_rank,
                )
            )
            self._telemetry_mark, self._rank_busy = (now, step), []
            self._telemetry_reports += 1

    def _checkpoint(self, step: int, files: Callable[[], Files], meta: Callable[[], Mapping[str, Any]] | None, metrics: Mapping[str, float]) -> None:
        self.save(step, files(), meta=meta() if meta else None)
        self.report(Progress(step=step, **{k: float(v) for k, v in metrics.items()}))

    def finish(self, step: int, files: Files, *, meta: Mapping[str, Any] | None = None, metadata: Mapping[str, Any] | None = None) -> None:
        """Publish the final checkpoint and report the result's metadata (in a gang: rank 0
        writes it, from its copy of the weights, which every rank holds alike)."""
        self.settle_checkpoint()
        if self.gang is not None and not self.gang.leader:
            return
        metadata = dict(metadata or {})
        where = self.save(step, files, meta={**dict(meta or {}), "result": metadata}, final=True)
        self.checkpoints.drop_shards(step)
        self._report_result(where, step, metadata, resumed_complete=False)

    def report_already_complete(self, checkpoint: Checkpoint) -> None:
        """The run finished before (its final checkpoint exists): report that result again."""
        self.info(f"{checkpoint.uri} is final: nothing left to train")
        if self.gang is not None and not self.gang.leader:
            return
        self._report_result(checkpoint.uri, checkpoint.step, checkpoint.meta.get("result", {}), resumed_complete=True)

    def _report_result(self, where: str, step: int, metadata: Mapping[str, Any], *, resumed_complete: bool) -> None:
        result = {
            "checkpoint_uri": {"type": "path", "raw_value": where},
            "final_step": step,
            "reused_final_checkpoint": resumed_complete,
            **({"workload_image": image} if (image := node_env().image) else {}),  # which image ran it, if one did
            **metadata,
        }
        self._pipes.report_asset_materialization(metadata=result)  # type: ignore[union-attr]
