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
    upstream: dg.AssetKey | list[dg.AssetKey],
    accepted_status: str,
    training_set: dg.AssetKey,
    job_name: str,
    ingest_job_name: str | list[str],
    description: str,
    minimum_interval_seconds: int = 30,
) -> dg.SensorDefinition:
    upstreams = upstream if isinstance(upstream, list) else [upstream]
    ingest_jobs = ingest_job_name if isinstance(ingest_job_name, list) else [ingest_job_name]
    watched = ", ".join(k.to_user_string() for k in upstreams)

    @dg.sensor(
        name=name,
        job_name=job_name,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=description,
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        instance = context.instance
        busy = sum(instance.get_runs_count(dg.RunsFilter(job_name=job, statuses=_IN_FLIGHT)) for job in ingest_jobs)
        if busy:
            return dg.SkipReason(f"waiting for {busy} ingest run(s) to finish")
        trained = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=training_set), limit=1)
        after = trained.records[0].storage_id if trained.records else None
        newest_accepted = None
        for key in upstreams:
            cursor = None
            while True:
                page = instance.fetch_materializations(
                    dg.AssetRecordsFilter(asset_key=key, after_storage_id=after), limit=500, cursor=cursor, ascending=True
                )
                for record in page.records:
                    status = record.asset_materialization.metadata.get("status")
                    accepted = status is not None and getattr(status, "value", status) == accepted_status
                    if accepted and (newest_accepted is None or record.storage_id > newest_accepted.storage_id):
                        newest_accepted = record
                if not page.has_more:
                    break
                cursor = page.cursor
        if newest_accepted is None:
            return dg.SkipReason(f"no new {accepted_status} {watched} since the last training set")
        partition = newest_accepted.partition_key
        return dg.RunRequest(
            run_key=f"after-{newest_accepted.storage_id}",
            tags={"sinewgrid/trigger": f"{newest_accepted.asset_materialization.asset_key.to_user_string()}:{partition}"},
        )

    return _sensor
