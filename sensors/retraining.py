"""A sensor that starts a training round once new validated data has landed.

It waits while ingest runs are still going, so a batch of drops yields one round, and it
compares what the instance already holds (accepted upstream materializations against the start
of the run that made the newest training set), so the UI's daemon and the `sinewgrid tick`
command never start the same round twice, and data accepted while a round ran (which the round
may have read too late) starts the next one instead of being lost.

With `tenants` (the Cell lane, whose upstream has a partition per tenant's drop), a round is
one partition of the training set per tenant: it asks for a round of each tenant whose newest
accepted upstream is newer than that tenant's own last training set, and of no other.
"""


from collections.abc import Callable, Sequence

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
    tenants: Sequence[str] = (),
    tenant_of: Callable[[str], str] | None = None,
) -> dg.SensorDefinition:
    """`tenants`: the training set is partitioned by tenant and each round is one tenant's;
    `tenant_of` names the tenant of an upstream partition."""
    if bool(tenants) != (tenant_of is not None):
        raise ValueError(f"sensor {name}: a per-tenant round needs both `tenants` and `tenant_of`")
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
    def _sensor(context: dg.SensorEvaluationContext) -> dg.RunRequest | dg.SensorResult | dg.SkipReason:
        instance = context.instance
        busy = sum(instance.get_runs_count(dg.RunsFilter(job_name=job, statuses=_IN_FLIGHT)) for job in ingest_jobs)
        if busy:
            return dg.SkipReason(f"waiting for {busy} ingest run(s) to finish")
        if tenant_of is not None:
            return _per_tenant_rounds(instance, upstreams, accepted_status, training_set, list(tenants), tenant_of, watched)
        trained = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=training_set), limit=1)
        after = _read_from(instance, trained.records[0]) if trained.records else None
        newest_accepted = None
        for record in _accepted_since(instance, upstreams, accepted_status, after):
            if newest_accepted is None or record.storage_id > newest_accepted.storage_id:
                newest_accepted = record
        if newest_accepted is None:
            return dg.SkipReason(f"no new {accepted_status} {watched} since the last training set")
        partition = newest_accepted.partition_key
        return dg.RunRequest(
            run_key=f"after-{newest_accepted.storage_id}",
            tags={"sinewgrid/trigger": f"{newest_accepted.asset_materialization.asset_key.to_user_string()}:{partition}"},
        )

    return _sensor


def _read_from(instance: dg.DagsterInstance, trained: dg.EventLogRecord) -> float:
    """Upstream accepted after this time counts as new for the next round: the start of the run
    that made the last training set. The run reads its upstream after it starts, so what was
    accepted while it ran may or may not be in it: counted new (at worst one more round), never
    lost (the run's own materialization comes after such upstream, and counting from it would
    skip them). A time, not a storage id: on SQLite a run's events are numbered in a file of
    their own, apart from the asset index."""
    started = instance.get_records_for_run(run_id=trained.run_id, of_type=dg.DagsterEventType.RUN_START, limit=1).records if trained.run_id else []
    return started[0].event_log_entry.timestamp if started else trained.timestamp


def _accepted_since(instance: dg.DagsterInstance, upstreams: list[dg.AssetKey], accepted_status: str, after: float | None):
    """Every accepted materialization of the upstreams after time `after`, oldest first per asset."""
    for key in upstreams:
        cursor = None
        while True:
            page = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, after_timestamp=after), limit=500, cursor=cursor, ascending=True)
            for record in page.records:
                status = record.asset_materialization.metadata.get("status")
                if status is not None and getattr(status, "value", status) == accepted_status:
                    yield record
            if not page.has_more:
                break
            cursor = page.cursor


def _per_tenant_rounds(
    instance: dg.DagsterInstance,
    upstreams: list[dg.AssetKey],
    accepted_status: str,
    training_set: dg.AssetKey,
    tenants: list[str],
    tenant_of: Callable[[str], str],
    watched: str,
) -> dg.SensorResult:
    """One round per tenant with accepted upstream newer than the tenant's own last training set."""
    trained_after: dict[str, float | None] = {}
    for tenant in tenants:
        last = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=training_set, asset_partitions=[tenant]), limit=1)
        trained_after[tenant] = _read_from(instance, last.records[0]) if last.records else None
    known = [s for s in trained_after.values() if s is not None]
    after = min(known) if len(known) == len(trained_after) and known else None
    newest: dict[str, dg.EventLogRecord] = {}
    for record in _accepted_since(instance, upstreams, accepted_status, after):
        if record.partition_key is None:
            continue
        tenant = tenant_of(record.partition_key)
        since = trained_after.get(tenant)
        if tenant in trained_after and (since is None or record.timestamp > since):
            if tenant not in newest or record.storage_id > newest[tenant].storage_id:
                newest[tenant] = record
    if not newest:
        return dg.SensorResult(skip_reason=dg.SkipReason(f"no new {accepted_status} {watched} of any tenant since its last training set"))
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                partition_key=tenant,
                run_key=f"{tenant}/after-{record.storage_id}",
                tags={
                    "sinewgrid/tenant": tenant,
                    "sinewgrid/trigger": f"{record.asset_materialization.asset_key.to_user_string()}:{record.partition_key}",
                },
            )
            for tenant, record in sorted(newest.items())
        ]
    )
