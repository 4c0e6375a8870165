"""The whole Cell graph on a temporary root: drops in, a model and the next plate out."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import anndata as ad
import dagster as dg
import pandas as pd

from cell_lane.assets.dataset import omics_dataset
from cell_lane.assets.design import next_plate_proposal
from cell_lane.assets.ingest import raw_assay, validated_assay
from cell_lane.assets.training import finetuned_model, foundation_model
from cell_lane.lab_simulator import LabSimulator
from cell_lane.plate_validation import OPTIONAL_COLUMNS, REQUIRED_COLUMNS, check_plate_file
from shared_resources.ledger import read_ledger

TRAINING = [omics_dataset, foundation_model, finetuned_model, next_plate_proposal]
FAST = {
    "ops": {
        "cell__foundation_model": {"config": {"steps": 200, "checkpoint_every_steps": 50}},
        "cell__finetuned_model": {"config": {"folds": 3, "steps_per_fold": 100}},
    }
}


def _ingest_all(instance, resources, drops):
    instance.add_dynamic_partitions("assay_drops", drops)
    return {d: dg.materialize([raw_assay, validated_assay], instance=instance, resources=resources, partition_key=d, raise_on_error=False).success for d in drops}


def _md(result, key: str) -> dict:
    event = next(e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == key)
    return {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}


def test_cell_loop_end_to_end(instance, resources, home, storage):
    lab = LabSimulator(storage)
    drops = lab.seed_drops(plates=2, include_bad=True)
    assert _ingest_all(instance, resources, drops) == {"seed-plate-001": True, "seed-plate-002": True, "seed-plate-bad-export": False}

    result = dg.materialize(TRAINING, instance=instance, resources=resources, run_config=FAST)
    assert result.success

    dataset = _md(result, "cell/omics_dataset")
    adata = ad.read_zarr(dataset["path"])
    assert adata.n_obs == 700 and adata.uns["sinewgrid"]["version"] == dataset["version"]
    assert int((adata.var["assay_n"] > 0).sum()) == dataset["labelled_genes"] == 76
    assert dataset["drops"] == 2  # the bad drop carries no label

    foundation = _md(result, "cell/foundation_model")
    assert foundation["pool"] == "cell-steady" and foundation["purchasing"] == "reserved"
    assert foundation["final_loss"] < foundation["first_loss"]

    finetuned = _md(result, "cell/finetuned_model")
    assert finetuned["pool"] == "cell-burst" and finetuned["n_assayed_genes"] == 76
    assert 0 < finetuned["held_out_rmse"] < 1 and finetuned["cost_usd"] >= 0

    ledger = read_ledger(storage.ledger())
    assert set(ledger["step"]) == {"cell.foundation_model", "cell.finetuned_model"}
    assert (ledger["outcome"] == "succeeded").all() and (ledger["gpu_hours"] > 0).all()

    proposal = _md(result, "cell/next_plate_proposal")
    worklist = Path(proposal["worklist"])
    table = pd.read_csv(worklist)
    assert set(REQUIRED_COLUMNS) <= set(table.columns) <= set(REQUIRED_COLUMNS) | set(OPTIONAL_COLUMNS)
    proposed = set(table.loc[table["sample_type"] == "sample", "perturbation"])
    assert len(proposed) == proposal["genes"] == 38
    assert not proposed & set(adata.var_names[adata.var["assay_n"] > 0]), "proposes only genes not yet assayed"
    assert table["readout"].isna().all()

    # The lab answers the worklist; the new drop validates and grows the training set.
    new = lab.answer_outbox()
    assert len(new) == 1 and lab.answer_outbox() == []
    plate = next((home / "landing" / "assays" / new[0] / "plates").iterdir())
    assert check_plate_file(plate.read_bytes(), "p.csv").ok
    assert _ingest_all(instance, resources, new) == {new[0]: True}
    second = dg.materialize(TRAINING, instance=instance, resources=resources, run_config=FAST)
    assert _md(second, "cell/omics_dataset")["labelled_genes"] == 76 + 38
    assert _md(second, "cell/foundation_model")["reused_final_checkpoint"] is True  # same matrix: pretraining reused
    assert _md(second, "cell/finetuned_model")["n_assayed_genes"] == 114


def _children_running(module: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
        if ppid == os.getpid() and module in cmdline:
            found.append(int(entry.name))
    return found


def test_compute_resource_resumes_a_preempted_step(instance, resources, home, storage):
    lab = LabSimulator(storage)
    _ingest_all(instance, resources, lab.seed_drops(plates=2, include_bad=False))
    dg.materialize([omics_dataset], instance=instance, resources=resources)

    preempted: list[int] = []

    def preempt_first_attempt():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not preempted:
            manifests = list((home / "checkpoints").rglob("step-00000100/manifest.json"))
            pids = _children_running("cell_lane.workloads.pretrain")
            if manifests and pids:
                os.kill(pids[0], signal.SIGTERM)  # the capacity is taken back
                preempted.append(pids[0])
            time.sleep(0.05)

    watcher = threading.Thread(target=preempt_first_attempt, daemon=True)
    watcher.start()
    config = {"ops": {"cell__foundation_model": {"config": {"steps": 2000, "checkpoint_every_steps": 50}}}}
    result = dg.materialize([omics_dataset, foundation_model], instance=instance, resources=resources, run_config=config, selection=[foundation_model])
    watcher.join(timeout=5)
    assert result.success and preempted
    md = _md(result, "cell/foundation_model")
    assert md["attempts"] == 2 and md["preemptions"] == 1
    ledger = read_ledger(storage.ledger())
    assert list(ledger["outcome"]) == ["preempted", "succeeded"]
    assert ledger.loc[0, "exit_code"] == 75
    assert ledger.loc[0, "productive_seconds"] > 0  # its checkpointed work was kept
    logs = [e.message for e in instance.all_logs(result.run_id) if e.message]
    assert any("resuming from" in m for m in logs)


def test_failing_workload_is_a_clear_failure(instance, resources, home, storage):
    """Fine-tuning with no assay results fails with a message that says what to do."""
    dg.materialize([omics_dataset], instance=instance, resources=resources)
    result = dg.materialize(
        [omics_dataset, foundation_model, finetuned_model], instance=instance, resources=resources,
        run_config=FAST, selection=[foundation_model, finetuned_model], raise_on_error=False,
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert "failed on pool cell-burst" in failure.step_failure_data.error.message
    ledger = read_ledger(storage.ledger())
    assert ledger.iloc[-1]["outcome"] == "failed"
