"""The storage root on an object store: the same code paths against a real S3 API server.

`moto_server` serves the S3 API on loopback (no real S3 can run here); s3fs talks to it
through AWS_ENDPOINT_URL exactly as it would to AWS.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
import torch

from cell_lane.assets.ingest import raw_assay, validated_assay
from cell_lane.omics import join_labels, publish_dataset, read_dataset
from shared_resources.checkpoints import CheckpointStore
from shared_resources.landing import list_complete_drops
from shared_resources.resources import platform_resources
from shared_resources.storage import Storage, fs_for
from tests.helpers import drop_plate, good_plate

BUCKET = "sinewgrid-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint():
    port = _free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, "moto_server did not start"
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    server.terminate()
    server.wait(timeout=10)


@pytest.fixture
def s3_root(s3_endpoint, monkeypatch, request) -> str:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    return f"s3://{BUCKET}/{request.node.name}"


def test_drops_are_ingested_and_quarantined_on_s3(s3_root, instance):
    storage = Storage.at(s3_root)
    drop_plate(storage, "good")
    bad = good_plate()
    drop_plate(storage, "bad", bad[bad["sample_type"] != "neg_ctrl"])
    assert {d.drop_id for d in list_complete_drops(storage.landing("assays"))} == {"bad", "good"}

    resources = platform_resources(root=s3_root, pools_file="")
    instance.add_dynamic_partitions("assay_drops", ["good", "bad"])
    ok = dg.materialize([raw_assay, validated_assay], instance=instance, resources=resources, partition_key="good")
    assert ok.success
    failed = dg.materialize([raw_assay, validated_assay], instance=instance, resources=resources, partition_key="bad", raise_on_error=False)
    assert not failed.success

    fs, _ = fs_for(s3_root)
    assert fs.cat_file(storage.raw("assays", "good") + "/plates/plate.csv") == fs.cat_file(storage.landing("assays", "good") + "/plates/plate.csv")
    assert fs.exists(storage.curated("assays", "good", "effects.parquet"))
    assert fs.exists(storage.quarantine("assays", "bad") + "/QUARANTINE.json")
    assert fs.exists(storage.quarantine("assays", "bad") + "/original/plates/plate.csv")


def test_checkpoints_on_s3_skip_a_torn_one(s3_root):
    warnings: list[str] = []
    store = CheckpointStore(f"{s3_root}/checkpoints/run", warn=warnings.append)
    store.save(10, {"model": {"w": torch.ones(4)}})
    store.save(20, {"model": {"w": torch.zeros(4)}})
    fs, path = fs_for(store.step_uri(20) + "/manifest.json")
    fs.rm(path)
    loaded = store.latest_valid()
    assert loaded.step == 10 and torch.equal(loaded.tensors["model"]["w"], torch.ones(4))
    assert warnings and "torn" in warnings[0]


def test_omics_dataset_round_trips_through_s3(s3_root, reference_expression):
    dataset = join_labels(reference_expression, pd.DataFrame())
    uri, written = publish_dataset(dataset, f"{s3_root}/curated/omics")
    assert written and uri.startswith("s3://")
    back = read_dataset(uri)
    assert back.shape == dataset.adata.shape
    assert back.uns["sinewgrid"]["version"] == dataset.version
    assert publish_dataset(dataset, f"{s3_root}/curated/omics") == (uri, False)
