"""The whole Cell graph on an object-store root: drops in, a model and the next plate out.

The loop runs on a fresh `s3://` root of the session's S3 API server, as in production. The same
loop on the embedded default (a local folder) is the session's demo run, checked in
tests/test_demo_loops.py: running it a second time here would add nothing but minutes.
"""

from __future__ import annotations

import io
import posixpath

import anndata as ad
import dagster as dg
import pandas as pd
import pytest
from typer.testing import CliRunner

from cell_lane.definitions import defs
from cell_lane.defs.assets.dataset import omics_dataset
from cell_lane.defs.assets.design import next_plate_proposal
from cell_lane.defs.assets.ingest import raw_assay, validated_assay
from cell_lane.defs.assets.rationale import plate_rationale
from cell_lane.defs.assets.training import finetuned_model, foundation_model
from cell_lane.defs.sensors import assay_drop_sensor
from cell_lane.omics import read_dataset
from cell_lane.plate_validation import (
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    check_plate_file,
)
from cell_lane.standins.lab import LabStandIn
from control_plane.accounting.ledger import read_ledger
from control_plane.settings import code_version
from data_layer.checkpoint_registry import CheckpointRegistry
from data_layer.experiments import load_run
from data_layer.lineage import LineageStore
from data_layer.registry.registry import DataRegistry
from platform_location.defs.assets.data_layer import checkpoint_retention
from shared_resources.resources import StorageResource
from sinewgrid.cli import app
from tests.helpers import LAB, LAB_DROPS, Preemptor, add_lab_drops, lab_drop, lab_storage, sensor_ingest
from workload_runtime.checkpoints import CheckpointStore
from workload_runtime.storage import glob_uris, read_bytes, write_bytes_atomic

pytestmark = pytest.mark.e2e  # runs workloads end to end, in their own processes

TRAINING = [omics_dataset, foundation_model, finetuned_model, next_plate_proposal]
FAST = {
    "ops": {
        "cell__foundation_model": {"config": {"steps": 200, "checkpoint_every_steps": 50}},
        "cell__finetuned_model": {"config": {"folds": 3, "steps_per_fold": 100}},
    }
}


@pytest.fixture
def storage(root: str):
    """lab-a's own root: the Cell loop runs for a lab, its data sealed with the lab's key (held here)."""
    return lab_storage(root)


def _ledger(root: str):
    """The platform's attempt ledger (every tenant's steps)."""
    return read_ledger(StorageResource(root=root).get().ledger())


def _ingest_all(instance, resources, drops):
    add_lab_drops(instance, drops)
    return {
        d: dg.materialize([raw_assay, validated_assay], instance=instance, resources=resources, partition_key=lab_drop(d), raise_on_error=False).success
        for d in drops
    }


def _sensor_ingest(instance, resources, root: str, cursor: str | None) -> tuple[list[str], dict[str, bool], str | None]:
    """One tick of the assay landing sensor, then an ingest of each drop it asked for."""
    return sensor_ingest(assay_drop_sensor, [raw_assay, validated_assay], defs, instance, resources, root, cursor)


def _md(result, key: str) -> dict:
    event = next(e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == key)
    return {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}


@pytest.mark.parametrize("root", ["s3"], indirect=True)
def test_cell_loop_end_to_end(instance, resources, root, storage, tmp_path):
    lab = LabStandIn(storage)
    drops = lab.seed_drops(plates=2, include_bad=True)
    # A drop still being written (no manifest yet) is not complete: the sensor leaves it be.
    write_bytes_atomic(posixpath.join(storage.landing("assays", "half-written"), "plates", "P9.csv"), b"plate_barcode,well\n")
    requested, ingested, cursor = _sensor_ingest(instance, resources, root, cursor=None)
    assert sorted(requested) == sorted(lab_drop(d) for d in drops)
    assert ingested == {lab_drop("seed-plate-001"): True, lab_drop("seed-plate-002"): True, lab_drop("seed-plate-bad-export"): False}
    assert sorted(instance.get_dynamic_partitions(LAB_DROPS)) == sorted(lab_drop(d) for d in drops)
    assert _sensor_ingest(instance, resources, root, cursor)[0] == []  # nothing new: nothing requested

    result = dg.materialize(TRAINING, instance=instance, resources=resources, run_config=FAST, partition_key=LAB)
    assert result.success

    dataset = _md(result, "cell/omics_dataset")
    assert dataset["path"].startswith(root)
    adata = read_dataset(dataset["path"])
    assert adata.n_obs == 700 and adata.uns["sinewgrid"]["version"] == dataset["version"]
    assert int((adata.var["assay_n"] > 0).sum()) == dataset["labelled_genes"] == 76
    assert dataset["drops"] == 2  # the bad drop carries no label

    foundation = _md(result, "cell/foundation_model")
    assert foundation["pool"] == "cell-steady" and foundation["purchasing"] == "reserved"
    assert foundation["final_loss"] < foundation["first_loss"]
    assert foundation["bytes_from_store"] > 0 and foundation["bytes_from_node_cache"] == 0  # nothing on this node yet
    assert glob_uris(posixpath.join(storage.uri("checkpoints"), "**", "manifest.json")), "checkpoints are under the root"

    finetuned = _md(result, "cell/finetuned_model")
    assert finetuned["pool"] == "cell-burst" and finetuned["n_assayed_genes"] == 76
    assert 0 < finetuned["held_out_rmse"] < 1 and finetuned["cost_usd"] >= 0

    ledger = _ledger(root)
    assert set(ledger["step"]) == {"cell.foundation_model", "cell.finetuned_model"}
    assert (ledger["outcome"] == "succeeded").all() and (ledger["gpu_hours"] > 0).all()

    proposal = _md(result, "cell/next_plate_proposal")
    assert proposal["worklist"].startswith(storage.outbox("plates"))
    table = pd.read_csv(io.BytesIO(read_bytes(proposal["worklist"])))
    assert set(REQUIRED_COLUMNS) <= set(table.columns) <= set(REQUIRED_COLUMNS) | set(OPTIONAL_COLUMNS)
    proposed = set(table.loc[table["sample_type"] == "sample", "perturbation"])
    assert len(proposed) == proposal["genes"] == 38
    assert not proposed & set(adata.var_names[adata.var["assay_n"] > 0]), "proposes only genes not yet assayed"
    assert table["readout"].isna().all()

    # A model writes a note per proposed gene; the lab's agreement decides who may see its data.
    notes = _md(dg.materialize([plate_rationale], instance=instance, resources=resources, partition_key=LAB), "cell/plate_rationale")
    assert notes["completed_tasks"] == 38 and notes["failed_tasks"] == 0 and notes["tenant"] == LAB
    assert notes["model"] == "standin-anthropic/brisk-2"  # the only outside provider lab-a's agreement lists
    assert notes["token_cost_usd"] > 0 and notes["cache_hits"] == 0  # a lab's answers are never cached
    token_rows = _ledger(root).query("backend == 'model-gateway' and step == 'gene-rationale@v1'")
    assert len(token_rows) == 38 and set(token_rows["tenant"]) == {LAB} and token_rows["gpu_hours"].sum() == 0

    # The lab answers the worklist; the sensor sees exactly that drop, and it grows the training set.
    new = lab.answer_outbox()
    assert len(new) == 1 and lab.answer_outbox() == []
    plates = glob_uris(posixpath.join(storage.landing("assays", new[0]), "plates", "*.csv"))
    assert len(plates) == 1 and check_plate_file(read_bytes(plates[0]), "p.csv").ok
    requested, ingested, _ = _sensor_ingest(instance, resources, root, cursor)
    assert requested == [lab_drop(new[0])] and ingested == {lab_drop(new[0]): True}
    second = dg.materialize(TRAINING, instance=instance, resources=resources, run_config=FAST, partition_key=LAB)
    assert _md(second, "cell/omics_dataset")["labelled_genes"] == 76 + 38
    assert _md(second, "cell/foundation_model")["reused_final_checkpoint"] is True  # same matrix: pretraining reused
    # Its final checkpoint was written on this node: from an object store, it is read back from the node cache.
    reread = _md(second, "cell/foundation_model")
    assert reread["bytes_from_node_cache"] > 0 and reread["bytes_from_store"] == 0
    assert _md(second, "cell/finetuned_model")["n_assayed_genes"] == 114

    _check_data_layer(instance, root, storage, tmp_path, dataset, result, second, new[0])


def _check_data_layer(instance, root, storage, tmp_path, first_dataset, first, second, answer_drop):
    """Dataset versions, lineage, run records and retention after two rounds of the loop: the lab's own, under its root."""
    platform_root, root = root, storage.root
    # Every curated dataset is a registered version, with its region, and comes back byte for byte.
    registry = DataRegistry.for_root(root)
    assert {v.ref for v in registry.versions("cell/assays")} == {"cell/assays@seed-plate-001", "cell/assays@seed-plate-002", f"cell/assays@{answer_drop}"}
    omics = [v.version for v in registry.versions("cell/omics")]
    assert omics == [first_dataset["version"], _md(second, "cell/omics_dataset")["version"]]
    assert first_dataset["dataset_ref"] == f"cell/omics@{omics[0]}" and first_dataset["registry_rev"]
    assert first_dataset["region"] == "us-east-1"
    out = CliRunner().invoke(app, ["data", "get", "cell/omics", omics[0], str(tmp_path / "omics-v1"), "--root", platform_root, "--tenant", LAB])
    assert out.exit_code == 0, out.output
    back = ad.read_zarr(tmp_path / "omics-v1" / "dataset.zarr")
    assert back.uns["sinewgrid"]["version"] == omics[0] and int((back.var["assay_n"] > 0).sum()) == 76

    # The second proposal traces back through the fine-tune, both datasets and the code, to every
    # drop — including the lab's answer to the first proposal.
    proposal = _md(second, "cell/next_plate_proposal")
    lineage = LineageStore(root)
    drops = {n.id for n in lineage.upstream(proposal["lineage_id"], kind="drop")}
    assert drops == {"drop/assays/seed-plate-001", "drop/assays/seed-plate-002", f"drop/assays/{answer_drop}"}
    upstream = {n.id: n for n in lineage.upstream(proposal["lineage_id"])}
    assert _md(first, "cell/next_plate_proposal")["lineage_id"] in upstream  # the loop, closed
    finetune_run = _md(second, "cell/finetuned_model")["run"]
    assert finetune_run in upstream and f"cell/omics@{omics[1]}" in upstream
    assert upstream[finetune_run].code_version == code_version() and "drop/assays/seed-plate-bad-export" not in upstream
    assert "cell/omics@" in proposal["lineage"] and "drop/assays/seed-plate-001" in proposal["lineage"]

    # Run records: the loss curve is plotted, the second fine-tune is compared with the first.
    foundation = _md(first, "cell/foundation_model")
    assert foundation["loss_curve"].startswith("![loss by step")
    assert "compared_with_previous" in _md(second, "cell/finetuned_model")
    run = load_run(root, foundation["run"])
    assert run.datasets == [f"cell/omics@{omics[0]}"] and len(run.curve("loss")) == 200

    # Retention keeps the final (and best) checkpoint of every run and the pointers' targets.
    before = CheckpointRegistry(root).entries(model="cell/foundation_model")
    assert [e.step for e in before] == [50, 100, 150, 200]
    pruned = dg.materialize([checkpoint_retention], instance=instance, resources={"storage": StorageResource(root=root)})
    assert _md(pruned, "platform/checkpoint_retention")["removed"] > 0
    after = CheckpointRegistry(root).entries(model="cell/foundation_model")
    assert 200 in [e.step for e in after] and len(after) < len(before)
    assert CheckpointStore(storage.checkpoints(foundation["run"])).latest_valid().final


def test_compute_resource_resumes_a_preempted_step(instance, resources, home, storage, tmp_path, monkeypatch):
    lab = LabStandIn(storage)
    _ingest_all(instance, resources, lab.seed_drops(plates=2, include_bad=False))
    dg.materialize([omics_dataset], instance=instance, resources=resources, partition_key=LAB)

    config = {"ops": {"cell__foundation_model": {"config": {"steps": 300, "checkpoint_every_steps": 50}}}}
    with Preemptor(monkeypatch, tmp_path / "held", at_step=100) as preemptor:  # SIGTERM once it has done step 100
        result = dg.materialize(
            [omics_dataset, foundation_model], instance=instance, resources=resources, run_config=config, selection=[foundation_model], partition_key=LAB
        )
    assert result.success and preemptor.preempted
    md = _md(result, "cell/foundation_model")
    assert md["attempts"] == 2 and md["preemptions"] == 1
    ledger = _ledger(str(home))
    assert list(ledger["outcome"]) == ["preempted", "succeeded"]
    assert ledger.loc[0, "exit_code"] == 75
    assert ledger.loc[0, "productive_seconds"] > 0  # its checkpointed work was kept
    logs = [e.message for e in instance.all_logs(result.run_id) if e.message]
    assert any("resuming from" in m for m in logs)


def test_failing_workload_is_a_clear_failure(instance, resources, home, storage):
    """Fine-tuning with no assay results fails with a message that says what to do."""
    dg.materialize([omics_dataset], instance=instance, resources=resources, partition_key=LAB)
    result = dg.materialize(
        [omics_dataset, foundation_model, finetuned_model], instance=instance, resources=resources,
        run_config=FAST, selection=[foundation_model, finetuned_model], raise_on_error=False, partition_key=LAB,
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert "failed on pool cell-burst" in failure.step_failure_data.error.message
    ledger = _ledger(str(home))
    assert ledger.iloc[-1]["outcome"] == "failed"
