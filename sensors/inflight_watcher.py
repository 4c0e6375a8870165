"""The in-flight watcher: no GPU job is left running, or lost, unaccounted.

Every backend records a job in `state/inflight/` when it submits it and removes the record
when it collects the result. A record that outlives its Dagster run means the orchestrator
process died (a killed run worker, a lost node) while the job went on. On each tick the
watcher looks at the records of its own lane's assets and asks the backend about each job:

| the run that owns it | the job | what the watcher does |
|---|---|---|
| finished, failed, cancelled or gone | still pending or running | cancels it (SIGTERM first, so it checkpoints) — an **orphan** |
| finished, failed, cancelled or gone | ended | nothing left to stop — a **stale** record |
| still running | ended or gone, submitted more than `grace_seconds` ago | reports it **stuck**: the run waits on a job that is no more |

An orphan is written to the ledger (outcome `orphaned`, with the time the job held its pool) so
the cost report includes it. Orphans and stale records are reported as an observation on the
asset the job was for (visible in the asset's event log), and their records removed.
"""

import time

import dagster as dg

from control_plane.compute.backends import backend_for
from control_plane.compute.backends.base import JobHandle
from control_plane.compute.inflight import InFlight
from control_plane.compute.left_behind import orphaned_attempt
from shared_resources.compute import ComputeResource
from control_plane.accounting.ledger import record_attempt
from shared_resources.resources import StorageResource

_RUN_ACTIVE = {
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
}


def make_inflight_watcher(
    *, name: str, asset_prefix: str, grace_seconds: float = 300.0, minimum_interval_seconds: int = 60
) -> dg.SensorDefinition:
    """A watcher over the in-flight jobs of the assets whose key starts with `asset_prefix`."""

    @dg.sensor(
        name=name,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            f"Watches the GPU jobs of `{asset_prefix}` assets that are in flight on any backend. Cancels jobs whose "
            "Dagster run is over (an orchestrator that died leaves them running), books them in the ledger as "
            "`orphaned`, and reports jobs a running step still waits on although the backend no longer has them."
        ),
    )
    def _watcher(context: dg.SensorEvaluationContext, storage: StorageResource, compute: ComputeResource) -> dg.SensorResult:
        inflight = InFlight(storage.get())
        pools = compute.pools()
        observations: list[dg.AssetObservation] = []
        checked = stuck = 0
        for record in inflight.records():
            owner = record.get("owner", {})
            if not str(owner.get("asset", "")).startswith(asset_prefix):
                continue
            checked += 1
            handle = JobHandle.from_json(record["handle"])
            try:
                status = backend_for(handle.backend).status(handle)
            except Exception as exc:  # noqa: BLE001 - an engine that cannot answer is reported, not fatal
                context.log.warning(f"{handle.backend} job {handle.job_id} on {handle.pool}: cannot read its state: {exc}")
                continue
            run = context.instance.get_run_by_id(owner["run_id"])
            run_over = run is None or run.status not in _RUN_ACTIVE
            asset_key = dg.AssetKey.from_user_string(owner["asset"])
            where = f"{handle.backend} job {handle.job_id} on pool {handle.pool} ({owner['step']}, attempt {owner.get('attempt')})"
            if run_over:
                action = "stale record removed"
                if not status.state.ended:
                    backend_for(handle.backend).cancel(handle)
                    action = "cancelled"
                run_state = run.status.value if run else "deleted"
                context.log.warning(f"{where}: its run {owner['run_id']} is {run_state}; {action}")
                ledger = orphaned_attempt(record, handle, pools)
                if ledger is not None and not status.state.ended:
                    record_attempt(storage.get().ledger(), ledger)
                observations.append(
                    dg.AssetObservation(
                        asset_key=asset_key,
                        partition=owner.get("partition"),
                        metadata={
                            "watcher": "orphaned" if action == "cancelled" else "stale",
                            "job": where,
                            "run_id": owner["run_id"],
                            "run_status": run_state,
                            "job_state": f"{status.state.value} {status.reason}".strip(),
                            "action": action,
                            "held_pool_seconds": dg.MetadataValue.float(round(time.time() - handle.submitted_at, 1)),
                        },
                    )
                )
                inflight.discard(record)
            elif status.state.ended and time.time() - handle.submitted_at > grace_seconds:
                stuck += 1
                context.log.warning(
                    f"{where}: the backend reports it {status.state.value} ({status.reason or 'no reason given'}) "
                    f"but run {owner['run_id']} is still {run.status.value}; if its process died, Dagster's run "
                    "monitoring will fail it, and the watcher then clears this record"
                )
        summary = f"checked {checked} in-flight job(s): {len(observations)} cleared, {stuck} stuck"
        return dg.SensorResult(asset_events=observations, skip_reason=None if observations else dg.SkipReason(summary))

    return _watcher
