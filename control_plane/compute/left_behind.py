"""Jobs a run's earlier worker left in flight: stopped before the step runs again, so one copy runs.

A GPU job on Slurm, Ray or Kubernetes outlives the run worker that submitted it. When that worker
dies (its container killed, its node lost) and Dagster's run monitoring resumes the run with a new
worker (`run_monitoring.max_resume_run_attempts`), the new worker runs the unfinished step again.
Before it submits anything, `stop_left_behind` finds the step's jobs still recorded in flight for
the same run (`state/inflight/`, written by every backend at submission and removed when the
attempt is collected; a record still there belongs to a worker that is gone), stops each the way
a preemption does (SIGTERM, so it checkpoints; cancelled after the grace period), books it in the
ledger as `orphaned` and forgets it. The new attempt resumes from the checkpoint and is numbered
after the left-behind one, so the ledger never holds one attempt twice. (A worker that died between
two attempts of a step left nothing in flight: its successor numbers the step's attempts from 1
again.) A step instance is its run, its step's name and its checkpoints' place: the shards of a
sweep, which run at once in one run under one step name, never stop each other.

The in-flight watcher (sensors/inflight_watcher.py) does the same for a job whose run is over.
"""

from __future__ import annotations

import datetime as dt
import signal
import time
from typing import Any

import dagster as dg

from control_plane.accounting.ledger import record_attempt
from control_plane.accounting.records import AttemptRecord
from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.compute.backends import backend_for
from control_plane.compute.backends.base import STOP_GRACE_SECONDS, JobHandle, JobState
from control_plane.compute.inflight import InFlight
from control_plane.tenancy.control import lane_of
from workload_runtime.storage import Storage

POLL_SECONDS = 1.0


def orphaned_attempt(record: dict[str, Any], handle: JobHandle, pools: dict[str, Pool]) -> AttemptRecord | None:
    """The ledger row of an in-flight job whose worker is gone: the time it held its pool, none of
    it counted productive (nobody collected what it did). None when its pool left the catalog."""
    pool = pools.get(handle.pool)
    if pool is None:
        return None
    owner = record["owner"]
    return AttemptRecord.for_attempt(
        run_id=owner["run_id"],
        step=owner["step"],
        asset=owner["asset"],
        partition=owner.get("partition"),
        attempt=int(owner.get("attempt", 0)),
        pool=pool,
        gpus=int(owner.get("gpus", 1)),
        started=dt.datetime.fromtimestamp(handle.submitted_at, dt.UTC),
        ended=dt.datetime.now(dt.UTC),
        productive_seconds=0.0,
        outcome="orphaned",
        exit_code=None,
        **({"tenant": tenant, "lane": lane_of(tenant)} if (tenant := owner.get("tenant")) else {}),
    )


def stop_left_behind(context: dg.AssetExecutionContext, spec: StepSpec, storage: Storage, pools: dict[str, Pool], checkpoint_uri: str) -> int:
    """Stop, book and forget the jobs an earlier worker of this run left in flight for `spec`
    writing `checkpoint_uri` (one step instance: a sweep's shards share the step's name); return
    the number of the last such attempt (0 if none), after which this worker counts."""
    inflight = InFlight(storage)
    left = [
        r for r in inflight.records()
        if r.get("owner", {}).get("run_id") == context.run_id and r["owner"].get("step") == spec.name and r["owner"].get("checkpoint_uri") == checkpoint_uri
    ]  # fmt: skip
    for record in left:
        handle = JobHandle.from_json(record["handle"])
        where = f"{handle.backend} job {handle.job_id} on pool {handle.pool} (attempt {record['owner'].get('attempt')})"
        state = _stop(handle)
        context.log.warning(
            f"{spec.name}: an earlier worker of this run left {where} in flight ({state}); it was stopped and is booked as "
            "orphaned: this worker resumes the step from its last checkpoint"
        )
        if (row := orphaned_attempt(record, handle, pools)) is not None:
            record_attempt(storage.ledger(), row)
        inflight.discard(record)
    return max((int(r["owner"].get("attempt", 0)) for r in left), default=0)


def _stop(handle: JobHandle) -> str:
    """SIGTERM (the workload checkpoints), a cancel after the grace period; how the job ended."""
    backend = backend_for(handle.backend)
    status = backend.status(handle)
    if status.state.ended:
        return f"it had already ended: {status.state.value}"
    if status.state is JobState.pending:
        backend.cancel(handle)
        return "it had not started: cancelled"
    backend.signal(handle, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while not (status := backend.status(handle)).state.ended and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    if not status.state.ended:
        backend.cancel(handle)
        return f"still {status.state.value} {STOP_GRACE_SECONDS:g} s after SIGTERM: cancelled"
    return f"it ended {status.state.value} after SIGTERM"
