"""The storage root on an object store: the same code paths against a real S3 API server.

`moto_server` serves the S3 API on loopback (no real S3 can run here; see
testbed/s3_server.py); s3fs talks to it through AWS_ENDPOINT_URL exactly as it would
to AWS. The `s3_root` fixture (tests/conftest.py) gives each test a fresh prefix.
"""

from __future__ import annotations

import dagster as dg
import pandas as pd
import torch

from cell_lane.defs.assets.ingest import raw_assay, validated_assay
from cell_lane.omics import join_labels, publish_dataset, read_dataset
from workload_runtime.checkpoints import CheckpointStore
from control_plane.intake.landing import list_complete_drops
from shared_resources.resources import platform_resources
from workload_runtime.storage import fs_for, read_bytes
from tests.helpers import SEALED, add_lab_drops, drop_plate, good_plate, lab_drop, lab_storage


def test_drops_are_ingested_and_quarantined_on_s3(s3_root, instance):
    storage = lab_storage(s3_root)  # lab-a's root under the S3 root, its key held here
    drop_plate(storage, "good")
    bad = good_plate()
    drop_plate(storage, "bad", bad[bad["sample_type"] != "neg_ctrl"])
    assert {d.drop_id for d in list_complete_drops(storage.landing("assays"))} == {"bad", "good"}

    resources = platform_resources(root=s3_root, pools_file="")
    add_lab_drops(instance, ["good", "bad"])
    ok = dg.materialize([raw_assay, validated_assay], instance=instance, resources=resources, partition_key=lab_drop("good"))
    assert ok.success
    failed = dg.materialize([raw_assay, validated_assay], instance=instance, resources=resources, partition_key=lab_drop("bad"), raise_on_error=False)
    assert not failed.success

    fs, _ = fs_for(s3_root)
    assert fs.cat_file(storage.raw("assays", "good") + "/plates/plate.csv").startswith(SEALED)
    assert read_bytes(storage.raw("assays", "good") + "/plates/plate.csv") == fs.cat_file(storage.landing("assays", "good") + "/plates/plate.csv")
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
