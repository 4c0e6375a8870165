"""The assay sensor: complete drops only, one partition per lab and drop, idempotent, cursor-bounded.

The drops are lab-a's, in its own landing zone (`tenants/lab-a/landing/assays/`)."""

from __future__ import annotations

import json
import os

import dagster as dg
import pytest

from cell_lane.definitions import defs
from cell_lane.defs.sensors import assay_drop_sensor
from sensors.landing_drops import LOOKBACK_SECONDS, DropCursor, parse_tenant_cursors
from shared_resources.resources import StorageResource
from tests.helpers import LAB, LAB_DROPS, drop_plate, ingest_drop, lab_drop, lab_storage
from workload_runtime.storage import read_json


@pytest.fixture
def storage(root: str):
    return lab_storage(root)


@pytest.fixture
def lab(home, storage):
    return home / "tenants" / LAB


def _tick(instance, home, cursor=None):
    # Used as a context manager so the instance it opens from the ref is closed again.
    with dg.build_sensor_context(
        instance_ref=instance.get_ref(), cursor=cursor, definitions=defs, resources={"storage": StorageResource(root=str(home))}
    ) as context:
        result = assay_drop_sensor.evaluate_tick(context)
    for request in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return result


def test_complete_drop_becomes_one_partition_and_one_run(instance, home, storage):
    drop_plate(storage, "drop-a")
    result = _tick(instance, home)
    assert [r.partition_key for r in result.run_requests] == [lab_drop("drop-a")]
    assert result.run_requests[0].run_key == f"assays/{LAB}/drop-a"
    assert {k: v for k, v in result.run_requests[0].tags.items() if k.startswith("sinewgrid/")} == {"sinewgrid/tenant": LAB, "sinewgrid/drop_id": "drop-a"}
    assert result.dynamic_partitions_requests[0].partition_keys == [lab_drop("drop-a")]
    assert instance.get_dynamic_partitions(LAB_DROPS) == [lab_drop("drop-a")]


def test_drop_without_manifest_waits(instance, home, lab, storage):
    folder = storage.landing("assays", "half-written")
    (lab / "landing" / "assays" / "half-written" / "plates").mkdir(parents=True)
    (lab / "landing" / "assays" / "half-written" / "plates" / "p.csv").write_text("plate_barcode,well\n")
    result = _tick(instance, home)
    assert result.run_requests == []
    assert "no new complete drops" in result.skip_message
    # once the manifest is written, the drop is picked up
    drop_plate(storage, "half-written")
    result = _tick(instance, home, result.cursor)
    assert [r.partition_key for r in result.run_requests] == [lab_drop("half-written")]
    assert folder.endswith("half-written")


def test_same_drop_seen_twice_yields_one_partition(instance, resources, home, storage):
    drop_plate(storage, "drop-a")
    first = _tick(instance, home)
    ingest_drop(instance, resources, "drop-a")  # the requested run ran
    # a fresh cursor (e.g. the UI daemon after `sinewgrid tick`) sees the drop again
    again = _tick(instance, home, cursor=None)
    assert len(first.run_requests) == 1
    assert again.run_requests == []
    assert instance.get_dynamic_partitions(LAB_DROPS) == [lab_drop("drop-a")]


def test_cursor_only_opens_new_drops(instance, home, storage):
    drop_plate(storage, "drop-a")
    first = _tick(instance, home)
    drop_plate(storage, "drop-b")
    second = _tick(instance, home, first.cursor)
    assert [r.partition_key for r in second.run_requests] == [lab_drop("drop-b")]
    cursor = parse_tenant_cursors(second.cursor)[LAB]
    assert "drop-b" in cursor.seen
    third = _tick(instance, home, second.cursor)
    assert third.run_requests == []


def test_a_manifest_older_than_the_cursor_is_still_found(instance, home, lab, storage):
    """A manifest renamed into place keeps its temporary file's time: it can land after a newer one."""
    drop_plate(storage, "drop-new")
    drop_plate(storage, "drop-late")
    manifest = lab / "landing" / "assays" / "drop-late" / "manifest.json"
    newest = (lab / "landing" / "assays" / "drop-new" / "manifest.json").stat().st_mtime
    late = manifest.read_bytes()
    manifest.unlink()  # not yet visible when the first tick looks
    first = _tick(instance, home)
    assert [r.partition_key for r in first.run_requests] == [lab_drop("drop-new")]
    manifest.write_bytes(late)
    os.utime(manifest, (newest - 60, newest - 60))  # written a minute before drop-new's, renamed after
    second = _tick(instance, home, first.cursor)
    assert [r.partition_key for r in second.run_requests] == [lab_drop("drop-late")]
    assert _tick(instance, home, second.cursor).run_requests == []
    # a drop older than the window is left to a fresh cursor (e.g. the UI daemon's first tick)
    assert parse_tenant_cursors(second.cursor)[LAB].is_new(newest - 2 * LOOKBACK_SECONDS, "drop-other") is False


def test_cursor_from_before_the_look_back_window_still_parses():
    cursor = DropCursor.parse(json.dumps({"mtime": 100.0, "ids_at_mtime": ["a", "b"]}))
    assert cursor.seen == {"a": 100.0, "b": 100.0}
    assert not cursor.is_new(100.0, "a") and cursor.is_new(99.0, "c")


def test_several_drops_in_one_tick_each_get_a_run(instance, home, storage):
    for name in ("d1", "d2", "d3"):
        drop_plate(storage, name)
    result = _tick(instance, home)
    assert sorted(r.partition_key for r in result.run_requests) == sorted(lab_drop(d) for d in ("d1", "d2", "d3"))
    assert len({r.run_key for r in result.run_requests}) == 3


def test_folder_name_that_cannot_be_a_partition_is_quarantined(instance, home, lab, storage):
    bad = lab / "landing" / "assays" / "bad name!"
    bad.mkdir(parents=True)
    (bad / "manifest.json").write_text(json.dumps({"drop_id": "bad name!", "files": []}))
    drop_plate(storage, "good-drop")
    result = _tick(instance, home)
    assert [r.partition_key for r in result.run_requests] == [lab_drop("good-drop")]
    report = read_json(str(lab / "quarantine" / "assays" / "bad name!" / "QUARANTINE.json"))  # sealed under the lab's root
    assert report["issues"][0]["rule"] == "drop_id"
    assert (bad / "manifest.json").exists()  # landing untouched


def test_the_same_drop_id_from_two_labs_is_two_partitions(instance, home, root):
    for tenant in ("lab-a", "lab-b"):
        drop_plate(lab_storage(root, tenant), "x")
    result = _tick(instance, home)
    assert sorted(r.partition_key for r in result.run_requests) == sorted([lab_drop("x", "lab-a"), lab_drop("x", "lab-b")])
    assert sorted(r.run_key for r in result.run_requests) == ["assays/lab-a/x", "assays/lab-b/x"]
    assert sorted(instance.get_dynamic_partitions(LAB_DROPS)) == ["lab-a/x", "lab-b/x"]  # one partition per lab's drop, none for a drop no lab sent


def test_a_platform_landing_drop_is_not_a_labs(instance, home):
    """The platform's own landing/assays/ belongs to no lab: nothing there is ingested as a lab's."""
    from workload_runtime.storage import Storage

    drop_plate(Storage.at(str(home)), "stray")
    assert _tick(instance, home).run_requests == []
