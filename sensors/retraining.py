"""A sensor that starts a training round once new validated data has landed.

It waits while ingest runs are still going, so a batch of drops yields one round, and it
compares what the instance already holds (the newest accepted upstream materialization
against the newest training-set materialization), so the UI's daemon and the
`sinewgrid tick` command never start the same round twice.
"""


import dagster as dg

_IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def make_retraining_sensor(
    *,
    name: str,
    upstream: dg.AssetKey,
    accepted_status: str,
    training_set: dg.AssetKey,
    job_name: str,
    ingest_job_name: str,
    description: str,
    minimum_interval_seconds: int = 30,
) -> dg.SensorDefinition:
    @dg.sensor(
        name=name,
        job_name=job_name,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=description,
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        instance = context.instance
        busy = instance.get_runs_count(dg.RunsFilter(job_name=ingest_job_name, statuses=_IN_FLIGHT))
        if busy:
            return dg.SkipReason(f"waiting for {busy} ingest run(s) to finish")
        trained = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=training_set), limit=1)
        after = trained.records[0].storage_id if trained.records else None
        newest_accepted = None
        cursor = None
        while True:
            page = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=upstream, after_storage_id=after), limit=500, cursor=cursor, ascending=True
            )
            for record in page.records:
                status = record.asset_materialization.metadata.get("status")
                if status is not None and getattr(status, "value", status) == accepted_status:
                    newest_accepted = record
            if not page.has_more:
                break
            cursor = page.cursor
        if newest_accepted is None:
            return dg.SkipReason(f"no new {accepted_status} {upstream.to_user_string()} since the last training set")
        partition = newest_accepted.partition_key
        return dg.RunRequest(
            run_key=f"after-{newest_accepted.storage_id}",
            tags={"sinewgrid/trigger": f"{upstream.to_user_string()}:{partition}"},
        )

    return _sensor
