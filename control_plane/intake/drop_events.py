"""Complete drops announced by the object store rather than found by listing: S3 event notifications on SQS.

Listing a landing zone costs what its history holds: with 100,000 drops seen, every tick pages
through every object under it before it opens one new drop. In the production shape the bucket
sends an event to an SQS queue whenever an object is created under a lab's landing prefix
(`deploy/tenancy/README.md` configures it); the manifest is written last, so the event of a
`manifest.json` says its drop is complete, and a tick reads only what arrived.

One queue per kind of drop (`SINEWGRID_DROP_QUEUES=assay=<queue url>,teleop=<queue url>`): the
landing sensor of that kind reads it for every tenant, mapping each event to the tenant whose
landing prefix holds the object. Messages are deleted once read: the drops they announce are
requested in that tick (or were known; run keys make a second request harmless). An event the
sensor never reads (the notification was configured after the drop arrived, the queue's
retention passed) is found by the listing the sensor still runs at its first tick and then at
most once every `RECONCILE_SECONDS`. On a local folder (the embedded default) there are no
events: the sensor lists.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote_plus, urlparse

from control_plane.intake.landing import MANIFEST_NAME, CompleteDrop
from control_plane.settings import settings

RECONCILE_SECONDS = 3600.0
MAX_MESSAGES_PER_TICK = 2000  # the rest wait for the next tick: a tick's time stays bounded
log = logging.getLogger(__name__)


class DropQueueError(RuntimeError):
    """The queue of a kind of drop is misnamed or unreadable; the message says which and how to fix it."""


def configured_queues(raw: str | None = None) -> dict[str, str]:
    """Kind -> queue URL from `SINEWGRID_DROP_QUEUES` (`kind=url,kind=url`)."""
    raw = settings().drop_queues if raw is None else raw
    queues: dict[str, str] = {}
    for item in (part.strip() for part in raw.split(",") if part.strip()):
        kind, sep, url = item.partition("=")
        if not sep or not kind.strip() or not urlparse(url.strip()).scheme.startswith("http"):
            raise DropQueueError(
                f"SINEWGRID_DROP_QUEUES entry {item!r} is not `kind=queue URL`; write e.g. "
                "`assay=https://sqs.us-east-1.amazonaws.com/123456789012/sinewgrid-drops-assay` (comma-separated for several kinds)"
            )
        queues[kind.strip()] = url.strip()
    return queues


def _s3_location(uri: str) -> tuple[str, str]:
    parsed = urlparse(uri)
    return parsed.netloc, parsed.path.strip("/") + "/"


@dataclass(frozen=True)
class DropQueue:
    """The SQS queue the bucket's `s3:ObjectCreated:*` events for one kind of drop go to."""

    kind: str
    url: str

    @classmethod
    def for_kind(cls, kind: str) -> DropQueue | None:
        url = configured_queues().get(kind)
        return cls(kind, url) if url else None

    def _client(self):
        import boto3  # the endpoint (AWS_ENDPOINT_URL) and credentials are boto3's own settings

        return boto3.client("sqs", region_name=settings().aws_region or None)

    def receive(self, landings: Mapping[str, str]) -> dict[str, list[CompleteDrop]]:
        """The drops whose manifest was created since the last read, per key of `landings` (a
        tenant, or "" for a single zone: its landing URI on S3). Reads and deletes up to
        `MAX_MESSAGES_PER_TICK` messages."""
        prefixes = {key: _s3_location(uri) for key, uri in landings.items() if uri.startswith("s3://")}
        found: dict[str, list[CompleteDrop]] = {key: [] for key in prefixes}
        client, read = self._client(), 0
        try:
            while read < MAX_MESSAGES_PER_TICK:
                messages = client.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
                if not messages:
                    break
                read += len(messages)
                for message in messages:
                    for key, drop in self._drops(message["Body"], prefixes):
                        found[key].append(drop)
                client.delete_message_batch(QueueUrl=self.url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)])
        except client.exceptions.QueueDoesNotExist as exc:
            raise DropQueueError(f"the {self.kind} drop queue {self.url} does not exist: create it, or fix SINEWGRID_DROP_QUEUES") from exc
        return found

    def _drops(self, body: str, prefixes: Mapping[str, tuple[str, str]]) -> list[tuple[str, CompleteDrop]]:
        try:
            event = json.loads(body)
        except ValueError:
            log.warning("the %s drop queue holds a message that is not JSON; it was removed: %.200s", self.kind, body)
            return []
        drops = []
        for record in event.get("Records", []):  # no Records: S3's test event when the notification was configured
            if not str(record.get("eventName", "")).startswith("ObjectCreated"):
                continue
            bucket, key = record["s3"]["bucket"]["name"], unquote_plus(record["s3"]["object"]["key"])
            owner = next((k for k, (b, p) in prefixes.items() if b == bucket and key.startswith(p)), None)
            drop_id, sep, name = key[len(prefixes[owner][1]) :].partition("/") if owner is not None else ("", "", "")
            if owner is None or not sep or name != MANIFEST_NAME:
                log.warning("the %s drop queue announced s3://%s/%s, which is no drop manifest of a landing zone it serves", self.kind, bucket, key)
                continue
            when = dt.datetime.fromisoformat(record["eventTime"].replace("Z", "+00:00")).timestamp()
            drops.append((owner, CompleteDrop(drop_id, f"s3://{bucket}/{key}", when)))
        return drops
