"""Drops announced by the object store: the landing sensor reads S3's event notifications from SQS
instead of listing the zone, and lists only to reconcile (control_plane/intake/drop_events.py).

On the session's S3 API server (moto serves S3's event notifications and SQS), in a bucket of this
module's own: each test's queue receives the bucket's `s3:ObjectCreated:*` events of manifests
under its labs' landing zones, as deploy/tenancy/README.md configures a real bucket.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import dagster as dg
import pytest

from cell_lane.definitions import defs
from cell_lane.defs.sensors import assay_drop_sensor
from control_plane.intake.drop_events import RECONCILE_SECONDS, DropQueue, DropQueueError, configured_queues
from sensors.landing_drops import parse_tenant_cursors
from shared_resources.resources import StorageResource
from tests.helpers import drop_plate, lab_drop, lab_storage

pytestmark = pytest.mark.engines  # the S3 API server
BUCKET = "sinewgrid-drop-events"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def events_root(s3_root: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A root in this module's bucket whose labs' new manifests are announced on a fresh queue."""
    import boto3

    s3, sqs = boto3.client("s3"), boto3.client("sqs")
    if BUCKET not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket=BUCKET)
    prefix = s3_root.rsplit("/", 1)[1]
    url = sqs.create_queue(QueueName=f"drops-{uuid.uuid4().hex[:12]}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    rules = [{"Name": "prefix", "Value": f"{prefix}/tenants/"}, {"Name": "suffix", "Value": "manifest.json"}]
    s3.put_bucket_notification_configuration(
        Bucket=BUCKET, NotificationConfiguration={"QueueConfigurations": [{"QueueArn": arn, "Events": ["s3:ObjectCreated:*"], "Filter": {"Key": {"FilterRules": rules}}}]}
    )
    monkeypatch.setenv("SINEWGRID_DROP_QUEUES", f"assays={url}")
    yield f"s3://{BUCKET}/{prefix}"
    s3.put_bucket_notification_configuration(Bucket=BUCKET, NotificationConfiguration={})
    sqs.delete_queue(QueueUrl=url)


def _tick(instance, root: str, cursor: str | None) -> dg.SensorResult:
    with dg.build_sensor_context(instance_ref=instance.get_ref(), cursor=cursor, definitions=defs, resources={"storage": StorageResource(root=root)}) as context:
        result = assay_drop_sensor.evaluate_tick(context)
    for request in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return result


def _drain(url: str) -> int:
    """Read and delete every message on the queue, as if a consumer elsewhere had taken them."""
    import boto3

    sqs, taken = boto3.client("sqs"), 0
    while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", []):
        taken += len(messages)
        sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)])
    return taken


def test_a_tick_reads_the_events_and_lists_only_when_reconciling_is_due(instance, events_root: str, monkeypatch: pytest.MonkeyPatch):
    first = _tick(instance, events_root, None)  # its first tick lists every zone once
    assert first.run_requests == [] and all(c.listed_at > 0 for c in parse_tenant_cursors(first.cursor).values())

    # A drop whose event never reaches the sensor (taken off the queue): no listing, so not seen yet.
    drop_plate(lab_storage(events_root, "lab-a"), "unannounced")
    assert _drain(configured_queues()["assays"]) == 1
    # Drops announced by their events, from two labs and one with the other's id: each its own run.
    drop_plate(lab_storage(events_root, "lab-a"), "d1")
    drop_plate(lab_storage(events_root, "lab-b"), "d1")
    drop_plate(lab_storage(events_root, "lab-b"), "d2")
    second = _tick(instance, events_root, first.cursor)
    assert sorted(map(str, (r.partition_key for r in second.run_requests))) == sorted(
        map(str, [lab_drop("d1", "lab-a"), lab_drop("d1", "lab-b"), lab_drop("d2", "lab-b")])
    )
    assert _tick(instance, events_root, second.cursor).run_requests == []  # the events were consumed

    # Once the reconciling listing is due, the unannounced drop is found, and nothing twice.
    doc = json.loads(second.cursor)
    for cursor in doc["tenants"].values():
        cursor["listed_at"] -= RECONCILE_SECONDS
    reconciled = _tick(instance, events_root, json.dumps(doc))
    assert [r.partition_key for r in reconciled.run_requests] == [lab_drop("unannounced", "lab-a")]


def test_without_a_queue_for_the_kind_the_sensor_lists_every_tick(instance, events_root: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SINEWGRID_DROP_QUEUES", "teleop=http://127.0.0.1:1/000000000000/elsewhere")
    first = _tick(instance, events_root, None)
    drop_plate(lab_storage(events_root, "lab-a"), "listed")
    assert [r.partition_key for r in _tick(instance, events_root, first.cursor).run_requests] == [lab_drop("listed", "lab-a")]


def test_a_drop_another_writer_uploads_is_listed_at_the_next_tick(instance, events_root: str, monkeypatch: pytest.MonkeyPatch):
    """A lab system uploads with its own client, not this process's: the listing must ask the store
    (a listings cache kept the code server blind to every drop after its first tick)."""
    import boto3

    monkeypatch.delenv("SINEWGRID_DROP_QUEUES")
    drop_plate(lab_storage(events_root, "lab-a"), "earlier")
    first = _tick(instance, events_root, None)  # lists the zone, and a listings cache would keep what it saw
    assert [r.partition_key for r in first.run_requests] == [lab_drop("earlier", "lab-a")]
    landing = lab_storage(events_root, "lab-a").landing("assays", "uploaded").removeprefix(f"s3://{BUCKET}/")
    boto3.client("s3").put_object(Bucket=BUCKET, Key=f"{landing}/manifest.json", Body=b'{"drop_id": "uploaded", "files": []}')
    assert [r.partition_key for r in _tick(instance, events_root, first.cursor).run_requests] == [lab_drop("uploaded", "lab-a")]


def test_the_bucket_announces_only_the_labs_manifests_to_a_queue_only_it_may_send_to():
    """deploy/tenancy: the notification, the queue's policy and the control plane's role agree."""
    import yaml

    tenancy = REPO / "deploy" / "tenancy"
    lab = yaml.safe_load((tenancy / "tenants-lab-a.yaml").read_text())["tenants"]["lab-a"]
    bucket, prefix = lab["storage"].removeprefix("s3://").split("/", 1)
    (notification,) = json.loads((tenancy / "s3-drop-notifications.json").read_text())["QueueConfigurations"]
    rules = {r["Name"]: r["Value"] for r in notification["Filter"]["Key"]["FilterRules"]}
    assert rules == {"prefix": f"{prefix}/landing/assays/", "suffix": "manifest.json"} and notification["Events"] == ["s3:ObjectCreated:*"]
    (send,) = json.loads((tenancy / "sqs-drop-queue-policy.json").read_text())["Statement"]
    assert send["Principal"] == {"Service": "s3.amazonaws.com"} and send["Action"] == "sqs:SendMessage"
    assert send["Resource"] == notification["QueueArn"] and send["Condition"]["ArnEquals"]["aws:SourceArn"] == f"arn:aws:s3:::{bucket}"
    reads = [s for s in json.loads((tenancy / "iam-control-plane-policy.json").read_text())["Statement"] if s["Resource"] == notification["QueueArn"]]
    assert [set(s["Action"]) for s in reads] == [{"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"}]
    (cell,) = [d for d in yaml.safe_load((REPO / "deploy" / "helm" / "values-lab-a.yaml").read_text())["dagster-user-deployments"]["deployments"] if d["name"] == "cell"]
    queue_url = configured_queues(cell["env"]["SINEWGRID_DROP_QUEUES"])["assays"]
    region, account, name = notification["QueueArn"].split(":")[3:]
    assert queue_url == f"https://sqs.{region}.amazonaws.com/{account}/{name}", "the code servers read the queue the bucket sends to"


def _record(key: str, event: str = "ObjectCreated:Put", bucket: str = "b") -> dict:
    return {"eventName": event, "eventTime": "2026-12-05T10:00:00.000Z", "s3": {"bucket": {"name": bucket}, "object": {"key": key}}}


def test_only_manifests_in_the_zones_the_queue_serves_are_drops(caplog: pytest.LogCaptureFixture):
    queue = DropQueue("assays", "http://sqs.invalid/q")
    prefixes = {"lab-a": ("b", "root/tenants/lab-a/landing/assays/"), "lab-b": ("b", "root/tenants/lab-b/landing/assays/")}
    body = json.dumps({"Records": [
        _record("root%2Ftenants%2Flab-a%2Flanding%2Fassays%2Fplate+7%2Fmanifest.json"),  # S3 sends keys URL-encoded
        _record("root/tenants/lab-b/landing/assays/d2/manifest.json"),
        _record("root/tenants/lab-b/landing/assays/d2/manifest.json", event="ObjectRemoved:Delete"),
        _record("root/tenants/lab-b/landing/assays/d3/plates/p.csv"),  # a data file, not the manifest
        _record("root/tenants/lab-b/landing/assays/d4/sub/manifest.json"),  # not a drop folder's own manifest
        _record("root/tenants/lab-c/landing/assays/d5/manifest.json"),  # a zone this sensor does not serve
        _record("root/tenants/lab-a/landing/assays/d6/manifest.json", bucket="other"),
    ]})  # fmt: skip
    drops = queue._drops(body, prefixes)
    assert [(owner, d.drop_id, d.manifest_uri) for owner, d in drops] == [
        ("lab-a", "plate 7", "s3://b/root/tenants/lab-a/landing/assays/plate 7/manifest.json"),
        ("lab-b", "d2", "s3://b/root/tenants/lab-b/landing/assays/d2/manifest.json"),
    ]
    assert sum("no drop manifest of a landing zone it serves" in m for m in caplog.messages) == 4
    assert queue._drops(json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent"}), prefixes) == []
    assert queue._drops("not json", prefixes) == [] and "not JSON" in caplog.messages[-1]


def test_a_misnamed_queue_setting_says_what_to_write():
    assert configured_queues("assays=https://sqs.us-east-1.amazonaws.com/1/a, teleop=http://127.0.0.1:5000/1/t") == {
        "assays": "https://sqs.us-east-1.amazonaws.com/1/a", "teleop": "http://127.0.0.1:5000/1/t",
    }  # fmt: skip
    for bad in ("assays", "=https://x/q", "assays=sqs-queue-name"):
        with pytest.raises(DropQueueError, match="is not `kind=queue URL`; write e.g."):
            configured_queues(bad)
