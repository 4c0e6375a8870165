"""Figure 14: a landing sensor's tick when 100 new drops arrive in a zone that has seen 100,000,
with the drops announced as S3 events on SQS, against listing the zone.

Subject: one whole tick of the Cell lane's assay sensor (`assay_drop_sensor.evaluate_tick`) on
an `s3://` root whose kind has a queue (`SINEWGRID_DROP_QUEUES`): it reads the 100 events of the
new manifests from SQS and requests a run for each. Baseline: what a tick without events must do
before it opens a single new drop, listing the zone (`list_complete_drops`): every manifest of
the 100,100 drops, a paged listing of the prefix. The baseline is only that listing, none of the
rest of a tick, so it flatters the listing.

Both on one S3 API server (moto) on loopback, started here; each history drop is its manifest
alone (a listing's cost follows the objects under the prefix, and real drops hold more). Before
each repeat of the subject, 100 new drops are written (their events land on the queue); the
cursor is one whose reconciling listing is not due. Run: ``python -m benchmarks.drop_events``.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from benchmarks import REPEATS, Timing, time_pair

HISTORY, NEW = 100_000, 100
MAX_REPEATS = 2  # each listing of 100,000 drops takes ~4 minutes on moto, and seeding them ~5 minutes
BUCKET, TENANT, KIND = "bench-drops", "lab-a", "assays"


@dataclass
class DropEventsResult:
    history: int
    new: int
    event_tick: Timing
    listing: Timing
    seed_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"history": self.history, "new": self.new, "event_tick": self.event_tick.to_dict(), "listing": self.listing.to_dict(),
                "seed_seconds": self.seed_seconds, "ratio": self.event_tick.median / self.listing.median}  # fmt: skip


def _put_manifests(s3, prefix: str, drop_ids: list[str]) -> None:
    def put(drop_id: str) -> None:
        body = json.dumps({"drop_id": drop_id, "files": []}).encode()
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{drop_id}/manifest.json", Body=body)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, drop_ids))


def run(repeats: int = REPEATS, history: int = HISTORY) -> DropEventsResult:
    import boto3
    import dagster as dg

    from cell_lane.definitions import defs
    from cell_lane.defs.sensors import assay_drop_sensor
    from control_plane.intake.landing import list_complete_drops
    from sensors.landing_drops import DropCursor, dump_tenant_cursors
    from shared_resources.resources import StorageResource
    from testbed.s3_server import s3_server

    saved = dict(os.environ)
    with s3_server() as endpoint, tempfile.TemporaryDirectory() as tmp:
        os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
                           "SINEWGRID_KEYS_DIR": f"{tmp}/keys", "SINEWGRID_LEDGER_URL": f"sqlite:///{tmp}/ledger.db"})  # fmt: skip
        try:
            s3, sqs = boto3.client("s3"), boto3.client("sqs")
            s3.create_bucket(Bucket=BUCKET)
            root = f"s3://{BUCKET}/root"
            landing = StorageResource(root=root).for_tenant(TENANT).landing(KIND)
            prefix = landing.removeprefix(f"s3://{BUCKET}/")
            started = time.perf_counter()
            _put_manifests(s3, prefix, [f"seen-{i:06d}" for i in range(history)])
            seed_seconds = time.perf_counter() - started

            url = sqs.create_queue(QueueName="bench-drops-assays")["QueueUrl"]
            arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
            rules = [{"Name": "prefix", "Value": f"{prefix}/"}, {"Name": "suffix", "Value": "manifest.json"}]
            s3.put_bucket_notification_configuration(
                Bucket=BUCKET, NotificationConfiguration={"QueueConfigurations": [{"QueueArn": arn, "Events": ["s3:ObjectCreated:*"], "Filter": {"Key": {"FilterRules": rules}}}]}
            )
            os.environ["SINEWGRID_DROP_QUEUES"] = f"{KIND}={url}"
            sqs.purge_queue(QueueUrl=url)  # S3's test event
            cursor = dump_tenant_cursors({t: DropCursor(mtime=time.time(), listed_at=time.time()) for t in ("lab-a", "lab-b")})

            with dg.instance_for_test(temp_dir=tmp) as instance:
                requested: list[int] = []
                waiting = [0]  # new drops on the queue, not yet read by a tick

                def arrive() -> None:  # before each call, untimed: 100 new drops wait for the next event tick
                    if not waiting[0]:
                        _put_manifests(s3, prefix, [f"new-{uuid.uuid4().hex[:10]}" for _ in range(NEW)])
                        waiting[0] = NEW

                def event_tick() -> None:
                    with dg.build_sensor_context(instance_ref=instance.get_ref(), cursor=cursor, definitions=defs,
                                                 resources={"storage": StorageResource(root=root)}) as context:  # fmt: skip
                        requested.append(len(assay_drop_sensor.evaluate_tick(context).run_requests))
                    waiting[0] = 0

                def listing() -> None:
                    assert len(list_complete_drops(landing)) >= history

                event, listed = time_pair(event_tick, listing, repeats=min(repeats, MAX_REPEATS), before_each=arrive)
            if set(requested) != {NEW}:
                raise RuntimeError(f"each event tick should have requested {NEW} runs; they requested {requested}")
        finally:
            os.environ.clear()
            os.environ.update(saved)
    return DropEventsResult(history=history, new=NEW, event_tick=event, listing=listed, seed_seconds=seed_seconds)


def table(result: DropEventsResult, repeats: int) -> Table:
    out = Table(
        title=f"14. A landing sensor's tick: {result.new} new drops in a zone that has seen {result.history:,}, read as S3 events vs listing the zone",
        caption=(
            f"Median of {min(repeats, MAX_REPEATS)} repeats, one call each, alternating (time.perf_counter), on an S3 API server (moto) on loopback. "
            f"Events = the assay sensor's whole tick: {result.new} events read from SQS, a run requested for each. Listing = "
            "list_complete_drops over the zone alone, what a tick without events does before opening any drop. "
            f"Seeding the {result.history:,} manifests took {result.seed_seconds:.0f} s."
        ),
        title_justify="left",
        caption_justify="left",
    )
    for column in ("Case", "Events s", "Listing s", "Ratio"):
        out.add_column(column, justify="left" if column == "Case" else "right", style="bold" if column == "Ratio" else None)
    ratio = result.event_tick.median / result.listing.median
    out.add_row(f"{result.new} new of {result.history + result.new:,}", f"{result.event_tick.median:.2f}", f"{result.listing.median:.2f}", f"{ratio:.3f}×")
    return out


def main(repeats: int = REPEATS) -> None:
    import sys

    from rich.console import Console

    history = int(sys.argv[1]) if len(sys.argv) > 1 else HISTORY
    Console(width=160).print(table(run(repeats, history), repeats))


if __name__ == "__main__":
    main()
