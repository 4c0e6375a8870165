"""A lab's drop goes through the production shape: uploaded with the lab system's own IAM user,
announced by the lab's bucket on the drop queue, found there by the daemon's sensor, ingested,
validated, trained on and answered with the next plate, every run started by the daemon in a
container of its own, the pretraining on the Slurm pool in a container of the workload image,
every GPU step booked once in the ledger on PostgreSQL."""

from __future__ import annotations

import time

import dagster as dg
import pytest
from botocore.exceptions import ClientError

from control_plane.accounting.ledger import Ledger, read_ledger
from rehearsal.lab import upload_drop
from rehearsal.account import LABS, PREFIX, lab_bucket
from rehearsal.stack import Stack
from cell_lane.omics import load_reference_expression
from cell_lane.plate_layout import GENES_PER_PLATE
from tests.helpers import SEALED, good_plate
from tests.rehearsal.conftest import failure_of, sensor_cursor, wait_for_run

pytestmark = pytest.mark.rehearsal

LAB, OTHER = LABS
DROP = "rehearsal-plate-001"
PARTITION = f"{LAB}/{DROP}"


def test_every_daemon_is_alive(instance: dg.DagsterInstance):
    deadline = time.monotonic() + 120
    while True:
        statuses = instance.get_daemon_statuses()
        if all(s.healthy for s in statuses.values()) or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert {"SENSOR", "SCHEDULER", "QUEUED_RUN_COORDINATOR", "MONITORING"} <= set(statuses), sorted(statuses)
    assert {name: s.healthy for name, s in statuses.items()} == {name: True for name in statuses}


def test_a_lab_system_writes_its_landing_prefix_only(stack: Stack):
    s3 = stack.aws.client("s3", stack.uploaders[OTHER])
    for bucket, key in ((lab_bucket(LAB), f"{PREFIX}/landing/assays/x/manifest.json"), (lab_bucket(OTHER), f"{PREFIX}/curated/x")):
        with pytest.raises(ClientError, match="AccessDenied"):
            s3.put_object(Bucket=bucket, Key=key, Body=b"{}")
    with pytest.raises(ClientError, match="AccessDenied"):
        s3.list_objects_v2(Bucket=lab_bucket(OTHER))


def test_a_drop_becomes_the_next_plate_through_the_daemon(stack: Stack, instance: dg.DagsterInstance, timings: dict[str, float]):
    genes = list(load_reference_expression().var_names[:GENES_PER_PLATE])  # genes the expression matrix has
    plate = good_plate("PR001", genes=genes, seed=11)
    sensor_cursor(instance, "assay_drop_sensor")  # its first tick, which lists every zone once, is behind us
    uploaded_at = time.time()
    upload_drop(stack, LAB, DROP, {"plates/plate.csv": plate.to_csv(index=False).encode()}, assay="viability", instrument="reader-1", project="rehearsal")

    ingest = wait_for_run(instance, stack, lambda r: r.job_name == "assay_ingest" and r.tags.get("dagster/partition") == PARTITION, f"the ingest of {PARTITION}")
    assert ingest.status == dg.DagsterRunStatus.SUCCESS, f"{failure_of(instance, ingest)}\n{stack.logs()}"
    assert ingest.tags.get("dagster/sensor_name") == "assay_drop_sensor"  # the daemon's sensor started it
    # Announced, not listed: the lab's bucket sent the manifest's event to the queue the sensor reads;
    # the sensor's last listing of the zone is older than the upload.
    assert sensor_cursor(instance, "assay_drop_sensor")["tenants"][LAB]["listed_at"] < uploaded_at
    if stack.image:  # in a container of its own, of the image its code server named (the workload image)
        assert ingest.tags.get("dagster/image") == stack.run_image and ingest.tags.get("docker/container_id"), ingest.tags
    validated = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(["cell", "validated_assay"]), asset_partitions=[PARTITION]), limit=1
    ).records
    assert validated and validated[0].asset_materialization.metadata["status"].value == "valid"
    timings["upload_to_validated_s"] = round(validated[0].timestamp - uploaded_at, 1)

    training = wait_for_run(instance, stack, lambda r: r.job_name == "cell_training_round" and r.tags.get("dagster/partition") == LAB, f"{LAB}'s training round")
    assert training.status == dg.DagsterRunStatus.SUCCESS, f"{failure_of(instance, training)}\n{stack.logs()}"
    assert training.tags.get("dagster/sensor_name") == "training_round_sensor"
    proposal = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(["cell", "next_plate_proposal"]), asset_partitions=[LAB]), limit=1
    ).records
    assert proposal, "no next plate proposal for the lab"
    timings["upload_to_proposal_s"] = round(proposal[0].timestamp - uploaded_at, 1)

    # Every GPU step of the round booked in the ledger on PostgreSQL, each attempt once, as the lab's.
    booked = read_ledger(Ledger(stack.env["SINEWGRID_LEDGER_URL"]), run_id=training.run_id)
    booked = booked[booked["backend"] != "model-gateway"]  # the gateway books a row per item asked
    assert len(booked) >= 2, booked  # the foundation model's pretraining and the fine-tune
    assert not booked.duplicated(["step", "attempt"]).any(), booked[["step", "attempt"]]
    assert set(booked["tenant"]) == {LAB}
    if stack.slurm:  # the pretraining went to the Slurm pool, and ran there in a container of the workload image
        pretraining = booked[booked["step"] == "cell.foundation_model"]
        assert set(zip(pretraining["backend"], pretraining["pool"])) == {("slurm", "cell-steady")}, pretraining
        (model,) = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(["cell", "foundation_model"]), asset_partitions=[LAB]), limit=1
        ).records
        ran_in = model.asset_materialization.metadata["workload_image"].value
        assert ran_in.startswith(f"workload@sha256:{stack.run_image.rsplit(':', 1)[1]}"), ran_in
        # The Slurm pool is queued (its quotas in the stack's file): admission let the pretraining in.
        said = [e.user_message for e in instance.all_logs(training.run_id)]
        assert any(m.startswith("admitted cell.foundation_model on cell-steady: within team cell's quota") for m in said), said[-20:]

    # The lab's copy is sealed with its key in its own bucket; the other lab ran nothing.
    admin = stack.aws.client("s3", stack.aws.admin)
    raw = admin.get_object(Bucket=lab_bucket(LAB), Key=f"{PREFIX}/raw/assays/{DROP}/plates/plate.csv")["Body"].read()
    assert raw.startswith(SEALED)
    assert not [r for r in instance.get_runs(limit=200) if OTHER in r.tags.get("dagster/partition", "")]
