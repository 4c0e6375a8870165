"""A sensor that turns complete drops in a landing zone into partitions and ingest runs.

A drop is complete when its manifest is present (see docs/drop-protocol.md). Each new
drop becomes one dynamic partition and one run; a drop already known is never
requested again, so the same drop seen twice yields one partition and no duplicate
data. The cursor (the newest manifest time seen, and the drops seen in a look-back
window before it) means a tick opens only manifests that are new: its cost follows what
arrived, not all history.

The look-back window exists because manifest times do not arrive in order: a manifest
renamed into place keeps the time its temporary file was written, and on a shared file
system or an object store the times come from different writers' clocks. A drop whose
manifest time is up to `LOOKBACK_SECONDS` older than the newest one seen is still found.

On an S3 root with a queue configured for the kind (`SINEWGRID_DROP_QUEUES`), a tick reads the
bucket's events of new manifests from SQS instead of listing the zone, and lists only at its first
tick and then once every `RECONCILE_SECONDS` to find what no event announced
(`control_plane/intake/drop_events.py`): its cost no longer grows with the zone's history.

With `tenants`, the sensor watches each tenant's own landing zone (`<tenant root>/landing/<kind>/`,
the Cell labs) and adds one dynamic partition per tenant's drop, `<tenant>/<drop_id>`
(`tenant_drop_key`), with its run: a drop id two tenants both use is two partitions (`lab-a/x`,
`lab-b/x`), each ingested into its own tenant's root, and no partition names a drop that no
tenant sent. Each tenant has its own cursor.
"""


import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import dagster as dg

from control_plane.intake.drop_events import RECONCILE_SECONDS, DropQueue
from control_plane.intake.landing import DROP_ID_PATTERN, CompleteDrop, list_complete_drops, quarantine_drop, tenant_drop_key
from shared_resources.resources import StorageResource
from workload_runtime.data_issues import DropIssue
from workload_runtime.storage import Storage

LOOKBACK_SECONDS = 600.0


@dataclass
class DropCursor:
    mtime: float = float("-inf")  # the newest manifest time seen
    seen: dict[str, float] = field(default_factory=dict)  # drops seen within the look-back window, with their times
    listed_at: float = float("-inf")  # when the zone was last listed (a zone whose drops arrive as events)

    @classmethod
    def parse(cls, raw: str | None) -> "DropCursor":
        if not raw:
            return cls()
        doc = json.loads(raw)
        mtime = float(doc["mtime"])
        if "ids_at_mtime" in doc:  # the cursor format before the look-back window
            return cls(mtime, {drop_id: mtime for drop_id in doc["ids_at_mtime"]})
        return cls(mtime, {str(k): float(v) for k, v in doc["seen"].items()}, float(doc.get("listed_at", float("-inf"))))

    def dump(self) -> str:
        return json.dumps({"mtime": self.mtime, "seen": dict(sorted(self.seen.items())), "listed_at": self.listed_at})

    def is_new(self, mtime: float, drop_id: str) -> bool:
        return drop_id not in self.seen and mtime > self.mtime - LOOKBACK_SECONDS

    def advance(self, mtime: float, drop_id: str) -> None:
        self.mtime = max(self.mtime, mtime)
        self.seen[drop_id] = mtime
        self.seen = {d: t for d, t in self.seen.items() if t > self.mtime - LOOKBACK_SECONDS}


def parse_tenant_cursors(raw: str | None) -> dict[str, DropCursor]:
    """One cursor per tenant (a cursor of the single-zone format starts every tenant afresh)."""
    doc = json.loads(raw) if raw else {}
    return {t: DropCursor.parse(json.dumps(c)) for t, c in doc.get("tenants", {}).items()}


def dump_tenant_cursors(cursors: dict[str, DropCursor]) -> str:
    return json.dumps({"tenants": {t: json.loads(c.dump()) for t, c in sorted(cursors.items())}})


def arrived_drops(kind: str, landings: dict[str, str], cursors: dict[str, DropCursor]) -> dict[str, list[CompleteDrop]]:
    """The complete drops of each zone (a tenant's, or "" for a single zone) to look at in this tick,
    oldest first: the events on the kind's queue, and a listing of each zone no queue serves or whose
    reconciling listing is due (the cursor records when it ran). Drops seen before are filtered by the cursor."""
    queue = DropQueue.for_kind(kind)
    found = queue.receive(landings) if queue else {}
    now = time.time()
    for zone, uri in landings.items():
        if zone not in found or now - cursors[zone].listed_at >= RECONCILE_SECONDS:
            found.setdefault(zone, []).extend(list_complete_drops(uri))
            cursors[zone].listed_at = now
    return {zone: sorted(drops, key=lambda d: (d.mtime, d.drop_id)) for zone, drops in found.items()}


def _invalid_drop_id(drop_id: str) -> DropIssue:
    return DropIssue(
        "drop_id",
        f"folder name {drop_id!r} is not a valid drop_id (letters, digits, '.', '_', '-', up to 128, "
        "starting with a letter or digit). Send the drop again under a valid name.",
    )


def make_landing_sensor(
    *,
    name: str,
    kind: str,
    job_name: str,
    partitions_def: dg.DynamicPartitionsDefinition,
    description: str,
    minimum_interval_seconds: int = 30,
    tenants: Sequence[str] = (),
) -> dg.SensorDefinition:
    """A sensor that ingests each complete drop of `landing/<kind>/` once (one dynamic partition of
    `partitions_def` per drop). With `tenants`: each tenant's landing zone, one partition
    `<tenant>/<drop_id>` per tenant's drop."""
    if tenants:
        return _tenant_landing_sensor(
            name=name, kind=kind, job_name=job_name, partitions_def=partitions_def, description=description,
            minimum_interval_seconds=minimum_interval_seconds, tenants=list(tenants),
        )

    @dg.sensor(
        name=name,
        job_name=job_name,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=description,
    )
    def _sensor(context: dg.SensorEvaluationContext, storage: StorageResource) -> dg.SensorResult | dg.SkipReason:
        store = storage.get()
        cursor = DropCursor.parse(context.cursor)
        new_partitions: list[str] = []
        runs: list[dg.RunRequest] = []
        already: list[str] = []
        for drop in arrived_drops(kind, {"": store.landing(kind)}, {"": cursor})[""]:
            if not cursor.is_new(drop.mtime, drop.drop_id):
                continue
            cursor.advance(drop.mtime, drop.drop_id)
            if not DROP_ID_PATTERN.match(drop.drop_id):
                issue = _invalid_drop_id(drop.drop_id)
                where = quarantine_drop(store, kind, drop.drop_id, [issue], stage="landing")
                context.log.error(f"{drop.drop_id!r} quarantined at {where}: {issue.message}")
                continue
            if drop.drop_id in new_partitions or context.instance.has_dynamic_partition(partitions_def.name, drop.drop_id):
                already.append(drop.drop_id)
                continue
            new_partitions.append(drop.drop_id)
            runs.append(dg.RunRequest(partition_key=drop.drop_id, run_key=f"{kind}/{drop.drop_id}", tags={"sinewgrid/drop_id": drop.drop_id}))
        if already:
            context.log.info(f"already ingested, not requested again: {', '.join(already)}")
        if not runs:
            return dg.SensorResult(skip_reason=dg.SkipReason(f"no new complete drops in landing/{kind}"), cursor=cursor.dump())
        context.log.info(f"new drops: {', '.join(new_partitions)}")
        return dg.SensorResult(
            run_requests=runs,
            dynamic_partitions_requests=[partitions_def.build_add_request(new_partitions)],
            cursor=cursor.dump(),
        )

    return _sensor


def _already_requested(context: dg.SensorEvaluationContext, key: str) -> bool:
    """A run of this tenant's drop exists already (requested by a sensor, or materialized by hand)."""
    return bool(context.instance.get_runs(filters=dg.RunsFilter(tags={"dagster/partition": str(key)}), limit=1))


def _tenant_landing_sensor(
    *,
    name: str,
    kind: str,
    job_name: str,
    partitions_def: dg.DynamicPartitionsDefinition,
    description: str,
    minimum_interval_seconds: int,
    tenants: list[str],
) -> dg.SensorDefinition:
    @dg.sensor(
        name=name,
        job_name=job_name,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=description,
    )
    def _sensor(context: dg.SensorEvaluationContext, storage: StorageResource) -> dg.SensorResult | dg.SkipReason:
        cursors = parse_tenant_cursors(context.cursor)
        new_keys: list[str] = []
        runs: list[dg.RunRequest] = []
        already: list[str] = []
        stores: dict[str, Storage] = {tenant: storage.for_tenant(tenant) for tenant in tenants}
        for tenant in tenants:
            cursors.setdefault(tenant, DropCursor())
        arrived = arrived_drops(kind, {tenant: store.landing(kind) for tenant, store in stores.items()}, cursors)
        for tenant in tenants:
            store, cursor = stores[tenant], cursors[tenant]
            for drop in arrived[tenant]:
                if not cursor.is_new(drop.mtime, drop.drop_id):
                    continue
                cursor.advance(drop.mtime, drop.drop_id)
                if not DROP_ID_PATTERN.match(drop.drop_id):
                    issue = _invalid_drop_id(drop.drop_id)
                    where = quarantine_drop(store, kind, drop.drop_id, [issue], stage="landing")
                    context.log.error(f"{tenant}: {drop.drop_id!r} quarantined at {where}: {issue.message}")
                    continue
                key = tenant_drop_key(tenant, drop.drop_id)
                known = context.instance.has_dynamic_partition(partitions_def.name, key)
                if known and _already_requested(context, key):
                    already.append(key)
                    continue
                if not known:
                    new_keys.append(key)
                runs.append(
                    dg.RunRequest(
                        partition_key=key,
                        run_key=f"{kind}/{tenant}/{drop.drop_id}",
                        tags={"sinewgrid/tenant": tenant, "sinewgrid/drop_id": drop.drop_id},
                    )
                )
        if already:
            context.log.info(f"already ingested, not requested again: {', '.join(already)}")
        if not runs:
            return dg.SensorResult(skip_reason=dg.SkipReason(f"no new complete drops in any tenant's landing/{kind}"), cursor=dump_tenant_cursors(cursors))
        context.log.info(f"new drops: {', '.join(r.tags['sinewgrid/tenant'] + '/' + r.tags['sinewgrid/drop_id'] for r in runs)}")
        return dg.SensorResult(
            run_requests=runs,
            dynamic_partitions_requests=[partitions_def.build_add_request(new_keys)] if new_keys else [],
            cursor=dump_tenant_cursors(cursors),
        )

    return _sensor
