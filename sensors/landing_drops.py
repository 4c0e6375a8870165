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
"""


import json
from dataclasses import dataclass, field

import dagster as dg

from shared_resources.intake.landing import DROP_ID_PATTERN, DropIssue, list_complete_drops, quarantine_drop
from shared_resources.resources import StorageResource

LOOKBACK_SECONDS = 600.0


@dataclass
class DropCursor:
    mtime: float = float("-inf")  # the newest manifest time seen
    seen: dict[str, float] = field(default_factory=dict)  # drops seen within the look-back window, with their times

    @classmethod
    def parse(cls, raw: str | None) -> "DropCursor":
        if not raw:
            return cls()
        doc = json.loads(raw)
        mtime = float(doc["mtime"])
        if "ids_at_mtime" in doc:  # the cursor format before the look-back window
            return cls(mtime, {drop_id: mtime for drop_id in doc["ids_at_mtime"]})
        return cls(mtime, {str(k): float(v) for k, v in doc["seen"].items()})

    def dump(self) -> str:
        return json.dumps({"mtime": self.mtime, "seen": dict(sorted(self.seen.items()))})

    def is_new(self, mtime: float, drop_id: str) -> bool:
        return drop_id not in self.seen and mtime > self.mtime - LOOKBACK_SECONDS

    def advance(self, mtime: float, drop_id: str) -> None:
        self.mtime = max(self.mtime, mtime)
        self.seen[drop_id] = mtime
        self.seen = {d: t for d, t in self.seen.items() if t > self.mtime - LOOKBACK_SECONDS}


def make_landing_sensor(
    *,
    name: str,
    kind: str,
    job_name: str,
    partitions_def: dg.DynamicPartitionsDefinition,
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
    def _sensor(context: dg.SensorEvaluationContext, storage: StorageResource) -> dg.SensorResult | dg.SkipReason:
        store = storage.get()
        cursor = DropCursor.parse(context.cursor)
        new_partitions: list[str] = []
        runs: list[dg.RunRequest] = []
        already: list[str] = []
        for drop in list_complete_drops(store.landing(kind)):
            if not cursor.is_new(drop.mtime, drop.drop_id):
                continue
            cursor.advance(drop.mtime, drop.drop_id)
            if not DROP_ID_PATTERN.match(drop.drop_id):
                issue = DropIssue(
                    "drop_id",
                    f"folder name {drop.drop_id!r} is not a valid drop_id (letters, digits, '.', '_', '-', up to 128, "
                    "starting with a letter or digit). Send the drop again under a valid name.",
                )
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
