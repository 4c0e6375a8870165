"""Checkpoints: manifest-last publishing, torn and corrupt ones skipped, and exact resume."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pandas as pd
import pytest
import torch

from cell_lane.omics import join_labels, publish_dataset
from control_plane.catalog.step_spec import TRAINING_IMPORTS
from tests.helpers import WorkloadProcess
from workload_runtime.checkpoints import CheckpointStore
from workload_runtime.inputs import Failpoint
from workload_runtime.workload import PREEMPTED_EXIT_CODE

pytestmark = pytest.mark.e2e  # runs workloads end to end, in their own processes



def test_roundtrip_and_manifest(tmp_path):
    store = CheckpointStore(str(tmp_path / "ck"))
    store.save(10, {"model": {"w": torch.arange(6.0).reshape(2, 3)}}, meta={"loss": 1.5}, lineage={"run": "r1"})
    loaded = store.latest_valid()
    assert loaded.step == 10 and not loaded.final
    assert torch.equal(loaded.tensors["model"]["w"], torch.arange(6.0).reshape(2, 3))
    manifest = json.loads((tmp_path / "ck" / "step-00000010" / "manifest.json").read_text())
    assert manifest["lineage"] == {"run": "r1"} and manifest["meta"] == {"loss": 1.5}
    assert set(manifest["files"]) == {"model.safetensors"}
    assert len(manifest["files"]["model.safetensors"]["sha256"]) == 64


def test_torn_checkpoint_is_skipped_with_a_warning(tmp_path):
    warnings: list[str] = []
    store = CheckpointStore(str(tmp_path / "ck"), warn=warnings.append)
    store.save(10, {"model": {"w": torch.ones(3)}})
    store.save(20, {"model": {"w": torch.full((3,), 2.0)}})
    (tmp_path / "ck" / "step-00000020" / "manifest.json").unlink()  # the writer died before publishing
    loaded = store.latest_valid()
    assert loaded.step == 10 and torch.equal(loaded.tensors["model"]["w"], torch.ones(3))
    assert any("torn" in w and "step-00000020" in w for w in warnings)


def test_corrupt_checkpoint_is_skipped_with_a_warning(tmp_path):
    warnings: list[str] = []
    store = CheckpointStore(str(tmp_path / "ck"), warn=warnings.append)
    store.save(10, {"model": {"w": torch.ones(3)}})
    store.save(20, {"model": {"w": torch.full((3,), 2.0)}})
    target = tmp_path / "ck" / "step-00000020" / "model.safetensors"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    assert store.latest_valid().step == 10
    assert any("corrupt" in w for w in warnings)


def test_no_valid_checkpoint_gives_none(tmp_path):
    store = CheckpointStore(str(tmp_path / "nothing"))
    assert store.latest_valid() is None


@pytest.fixture(scope="module")
def dataset_uri(tmp_path_factory, reference_expression) -> str:
    base = tmp_path_factory.mktemp("omics")
    uri, _ = publish_dataset(join_labels(reference_expression, pd.DataFrame()), str(base))
    return uri


def _extras(tmp_path: Path, dataset_uri: str, name: str, steps: int, hold_at: int | None = None) -> Path:
    """The workload's inputs; `hold_at`: it waits after that step (the `hold` failpoint) until it
    is signalled, so a test interrupts it at that exact step, however fast the machine is."""
    path = tmp_path / f"{name}.json"
    inputs = {
        "config": {"dataset_uri": dataset_uri, "steps": steps, "seed": 3},
        "checkpoint_uri": str(tmp_path / name),
        "checkpoint_every_steps": 50,
    }
    if hold_at is not None:
        inputs["failpoint"] = Failpoint(kind="hold", at_step=hold_at, marker=str(_held_marker(tmp_path, name))).model_dump()
    path.write_text(json.dumps(inputs))
    return path


def _held_marker(tmp_path: Path, name: str) -> Path:
    return tmp_path / f"{name}-held.json"


def _final_model(folder: Path) -> dict[str, torch.Tensor]:
    checkpoint = CheckpointStore(str(folder)).latest_valid()
    assert checkpoint is not None and checkpoint.final
    return checkpoint.tensors["model"]


STEPS = 300  # past both holds (70, 120): enough to resume and finish, no more
PRETRAIN = "cell_lane.workloads.pretrain"
PRETRAIN_IMPORTS = [*TRAINING_IMPORTS, "anndata"]  # as the foundation_model asset declares


def test_killed_pretraining_resumes_to_the_same_weights(tmp_path, dataset_uri):
    reference = WorkloadProcess(PRETRAIN, _extras(tmp_path, dataset_uri, "uninterrupted", STEPS), "first", imports=PRETRAIN_IMPORTS)
    assert reference.wait(timeout=600) == 0, reference.tail()

    # Killed at step 120, mid-interval: held there (an event), so the kill lands at the same step on any machine.
    extras = _extras(tmp_path, dataset_uri, "killed", STEPS, hold_at=120)
    victim = WorkloadProcess(PRETRAIN, extras, "first", imports=PRETRAIN_IMPORTS)
    victim.wait_until_held(_held_marker(tmp_path, "killed"))
    victim.process.send_signal(signal.SIGKILL)  # no warning, no last checkpoint: like a lost node
    assert victim.wait(timeout=60) == -signal.SIGKILL
    assert CheckpointStore(str(tmp_path / "killed")).steps() == [50, 100]  # 20 steps of work lost

    resumed = WorkloadProcess(PRETRAIN, extras, "resumed", imports=PRETRAIN_IMPORTS)  # the marker exists: no hold this time
    assert resumed.wait(timeout=600) == 0, resumed.tail()
    assert "resuming from" in resumed.log.read_text() and "(step 100)" in resumed.log.read_text()

    expected, actual = _final_model(tmp_path / "uninterrupted"), _final_model(tmp_path / "killed")
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), f"{name} differs after resume"


def test_sigterm_checkpoints_and_exits_with_the_preempted_code(tmp_path, dataset_uri):
    extras = _extras(tmp_path, dataset_uri, "preempted", STEPS, hold_at=70)
    process = WorkloadProcess(PRETRAIN, extras, "first", imports=PRETRAIN_IMPORTS)
    process.wait_until_held(_held_marker(tmp_path, "preempted"))
    os.kill(process.process.pid, signal.SIGTERM)
    assert process.wait(timeout=60) == PREEMPTED_EXIT_CODE, process.tail()
    store = CheckpointStore(str(tmp_path / "preempted"))
    last = store.latest_valid()
    assert last is not None and last.step == 70 and not last.final  # the step it was at when SIGTERM came
    resumed = WorkloadProcess(PRETRAIN, extras, "resumed", imports=PRETRAIN_IMPORTS)
    assert resumed.wait(timeout=600) == 0, resumed.tail()
    assert store.latest_valid().final
