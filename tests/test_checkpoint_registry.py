"""The checkpoint registry and retention, on checkpoints written by the real CheckpointStore."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest
import torch
from typer.testing import CliRunner

from data_layer.checkpoint_registry import CheckpointRegistry
from data_layer.checkpoint_retention import apply_retention, plan_retention, pointer_protections
from workload_runtime.checkpoints import CheckpointStore
from data_layer.experiments import record_run
from workload_runtime.storage import Storage, fs_for, write_json_atomic
from sinewgrid.cli_models import checkpoints_app

FOUNDATION_A = "cell/foundation_model/v1-aaaa"
FOUNDATION_B = "cell/foundation_model/v2-bbbb"
POLICY = "robotics/policy/0123456789ab"


def _train(root: str, lineage: str, losses: dict[int, float | None], *, datasets: list[str], final_step: int | None = None, result: dict | None = None) -> CheckpointStore:
    """Write a checkpoint at each step as a training workload does (meta.losses so far, the
    orchestrator's lineage dict, result metadata on the final one). A None loss: no losses in meta."""
    store = CheckpointStore(Storage.at(root).checkpoints(lineage))
    curve: list[float] = []
    for step, loss in sorted(losses.items()):
        if loss is not None:
            curve.append(loss)
        meta: dict = {"losses": list(curve)} if loss is not None else {"hidden": 8}
        if step == final_step:
            meta["result"] = result or {}
        store.save(
            step,
            {"model": {"w": torch.full((16,), float(step))}, "optimizer": {"m": torch.zeros(8)}},
            meta=meta,
            lineage={"step": lineage.replace("/", "."), "lineage": lineage, "run_id": f"dagster-{lineage[-4:]}", "asset": "x", "datasets": datasets, "code_version": "c0ffee1"},
            final=step == final_step,
        )
    return store


@pytest.fixture
def three_runs(root: str) -> str:
    _train(
        root, FOUNDATION_A, {10: 0.9, 20: 0.5, 30: 0.4}, datasets=["cell/omics@v1"], final_step=30,
        result={"final_loss": 0.42, "steps": 30, "device": "cpu", "loss_curve": {"type": "md", "raw_value": "| step |"}, "rmse": {"type": "float", "raw_value": 1.5}},
    )
    _train(root, FOUNDATION_B, {10: 0.8, 20: 0.6}, datasets=["cell/omics@v2"])
    _train(root, POLICY, {5: 0.3, 10: 0.2}, datasets=["robotics/teleop@s1", "robotics/rollouts@n1"])
    return root


def _folder_bytes(uri: str) -> int:
    fs, path = fs_for(uri)
    return sum(info["size"] for info in fs.find(path, detail=True).values())


def test_query_by_model_run_step_and_dataset(three_runs: str) -> None:
    registry = CheckpointRegistry(three_runs)
    assert len(registry.entries()) == 7
    assert {e.lineage for e in registry.entries(model="cell/foundation_model")} == {FOUNDATION_A, FOUNDATION_B}
    assert len(registry.entries(model="cell")) == 5 and len(registry.entries(model="robotics")) == 2
    assert [e.step for e in registry.entries(run="v1-aaaa")] == [10, 20, 30]
    assert [e.step for e in registry.entries(run=FOUNDATION_B)] == [10, 20]
    assert {e.lineage for e in registry.entries(step=10)} == {FOUNDATION_A, FOUNDATION_B, POLICY}
    assert {e.lineage for e in registry.entries(dataset="cell/omics@v1")} == {FOUNDATION_A}
    assert {e.lineage for e in registry.entries(dataset="v2")} == {FOUNDATION_B}
    assert {e.lineage for e in registry.entries(dataset="cell/omics")} == {FOUNDATION_A, FOUNDATION_B}
    assert {e.lineage for e in registry.entries(dataset="robotics/rollouts@n1")} == {POLICY}
    assert registry.entries(dataset="cell/omics@v3") == []

    final = registry.entries(run=FOUNDATION_A, step=30)[0]
    assert final.final and final.model == "cell/foundation_model" and final.run == "v1-aaaa"
    # loss is the last of meta.losses; numbers of the result metadata come along, text does not.
    assert final.metrics == {"loss": 0.4, "final_loss": 0.42, "steps": 30.0, "rmse": 1.5}
    assert final.datasets == ["cell/omics@v1"] and final.code_version == "c0ffee1" and final.dagster_run_id == "dagster-aaaa"
    assert final.bytes == _folder_bytes(final.uri) > 0
    assert final.uri == CheckpointStore(Storage.at(three_runs).checkpoints(FOUNDATION_A)).step_uri(30)

    assert registry.latest(FOUNDATION_A).step == 30
    assert registry.best("v1-aaaa").step == 30 and registry.best(FOUNDATION_A, mode="max").step == 10
    assert registry.best(FOUNDATION_A, metric="held_out_rmse") is None
    assert registry.latest("cell/foundation_model/nope") is None
    summaries = {s.lineage: s for s in registry.runs(model="cell")}
    assert summaries[FOUNDATION_B].checkpoints == 2 and summaries[FOUNDATION_B].best_value == 0.6 and not summaries[FOUNDATION_B].final
    assert summaries[FOUNDATION_A].latest_step == 30 and summaries[FOUNDATION_A].final


def test_torn_checkpoints_are_listed_apart(root: str) -> None:
    store = _train(root, FOUNDATION_A, {10: 0.9, 20: 0.5, 30: 0.4, 40: 0.3}, datasets=[])
    Path(store.step_uri(40), "manifest.json").unlink()  # writer died before publishing
    model = Path(store.step_uri(30), "model.safetensors")
    model.write_bytes(model.read_bytes()[:-3])  # a file cut short
    Path(store.step_uri(20), "manifest.json").write_text("{not json")
    Path(store.step_uri(50)).mkdir()  # an empty step folder

    registry = CheckpointRegistry(root)
    assert [e.step for e in registry.entries()] == [10]
    torn = {t.step: t.reason for t in registry.torn()}
    assert set(torn) == {20, 30, 40, 50}
    assert "no manifest.json" in torn[40] and "no manifest.json" in torn[50]
    assert "model.safetensors has" in torn[30] and "not valid JSON" in torn[20]
    assert registry.torn(model="robotics") == []


def test_retention_keeps_latest_best_final_and_protected(root: str) -> None:
    x = _train(root, FOUNDATION_A, {10: 0.9, 20: 0.2, 30: 0.5, 40: 0.6, 50: 0.7}, datasets=[])
    y = _train(root, FOUNDATION_B, {10: 0.9, 20: 0.8, 30: 0.1, 40: 0.3}, datasets=[], final_step=40)
    z = _train(root, POLICY, {1: None, 2: None, 3: None}, datasets=[])  # no loss recorded at all
    record_run(root, FOUNDATION_A, curves={"loss": [0.9, 0.2]}, summary={"final_loss": 0.7}, config={}, datasets=[])
    storage = Storage.at(root)
    write_json_atomic(storage.artifacts("robotics", "policy", "latest.json"), {"version": "v", "checkpoint_uri": storage.checkpoints(POLICY)})
    outside = Path(root, "artifacts", "keep-me.txt")
    outside.write_text("not a checkpoint")

    protect = pointer_protections(root)
    assert protect == {storage.checkpoints(POLICY)}
    plan = plan_retention(CheckpointRegistry(root), keep_latest=1, keep_best=1, protect=protect | {x.step_uri(30)})
    kept = {(e.lineage, e.step): why for e, why in plan.keep}
    removed = {(e.lineage, e.step) for e, _ in plan.remove}
    assert set(kept) == {(FOUNDATION_A, 50), (FOUNDATION_A, 20), (FOUNDATION_A, 30), (FOUNDATION_B, 40), (FOUNDATION_B, 30), (POLICY, 3)}
    assert removed == {(FOUNDATION_A, 10), (FOUNDATION_A, 40), (FOUNDATION_B, 10), (FOUNDATION_B, 20), (POLICY, 1), (POLICY, 2)}
    assert "best loss" in kept[(FOUNDATION_A, 20)] and "protected" in kept[(FOUNDATION_A, 30)]
    assert kept[(FOUNDATION_B, 40)] == "latest, final" and "protected" in kept[(POLICY, 3)]
    sizes = {e.uri: _folder_bytes(e.uri) for e, _ in plan.remove}
    assert plan.bytes_freed == sum(sizes.values()) > 0
    assert "| remove | cell/foundation_model/v1-aaaa | 10 |" in plan.markdown()

    removed_uris = apply_retention(plan)
    assert sorted(removed_uris) == sorted(sizes)
    assert not any(Path(uri).exists() for uri in removed_uris)
    assert outside.read_text() == "not a checkpoint"
    assert Path(storage.checkpoints(FOUNDATION_A), "run.json").exists() and Path(storage.checkpoints(FOUNDATION_A), "metrics.parquet").exists()
    again = plan_retention(CheckpointRegistry(root), keep_latest=1, keep_best=1, protect=protect | {x.step_uri(30)})
    assert again.remove == [] and again.bytes_freed == 0 and len(again.keep) == 6
    assert x.latest_valid().step == 50 and y.latest_valid().final and z.latest_valid().step == 3
    assert CheckpointRegistry(root).torn() == []


def test_a_checkpoint_caught_half_removed_reads_as_torn(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _train(root, FOUNDATION_A, {10: 0.9, 20: 0.8}, datasets=[])
    plan = plan_retention(CheckpointRegistry(root))
    assert [e.step for e, _ in plan.remove] == [10]

    real_rm = fsspec.implementations.local.LocalFileSystem.rm

    def interrupted(self, path, recursive=False, maxdepth=None):
        """Removes manifests, then dies before the tensor files go."""
        paths = path if isinstance(path, list) else [path]
        if all(p.endswith("/manifest.json") for p in paths):
            return real_rm(self, path, recursive=recursive, maxdepth=maxdepth)
        raise OSError("interrupted")

    monkeypatch.setattr(fsspec.implementations.local.LocalFileSystem, "rm", interrupted)
    with pytest.raises(OSError):
        apply_retention(plan)
    monkeypatch.undo()
    registry = CheckpointRegistry(root)
    assert [e.step for e in registry.entries()] == [20]
    assert [t.step for t in registry.torn()] == [10]  # its tensors are still there, its manifest is not
    assert store.latest_valid().step == 20


def test_torn_folders_go_only_when_asked_and_only_behind_a_valid_one(root: str) -> None:
    store = _train(root, FOUNDATION_A, {10: 0.9, 20: 0.8, 30: 0.7, 40: 0.6}, datasets=[])
    Path(store.step_uri(20), "manifest.json").unlink()
    Path(store.step_uri(40), "manifest.json").unlink()  # newer than the newest valid: maybe still being written
    registry = CheckpointRegistry(root)
    assert plan_retention(registry).remove_torn == []
    plan = plan_retention(registry, include_torn=True)
    assert [t.step for t, _ in plan.remove_torn] == [20] and [e.step for e, _ in plan.remove] == [10]
    apply_retention(plan)
    assert store.steps() == [30, 40] and store.latest_valid().step == 30


def test_bad_retention_settings_are_refused(root: str) -> None:
    registry = CheckpointRegistry(root)
    with pytest.raises(ValueError, match="keep_latest must be at least 1"):
        plan_retention(registry, keep_latest=0)
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        plan_retention(registry, mode="median")


@pytest.mark.parametrize("root", ["s3"], indirect=True)
def test_registry_and_retention_on_s3(root: str) -> None:
    store = _train(root, FOUNDATION_A, {10: 0.9, 20: 0.3, 30: 0.5, 40: 0.6}, datasets=["cell/omics@v1"])
    fs, path = fs_for(store.step_uri(40) + "/manifest.json")
    fs.rm(path)
    registry = CheckpointRegistry(root)
    assert [e.step for e in registry.entries(dataset="v1")] == [10, 20, 30]
    assert registry.entries()[0].uri.startswith("s3://") and [t.step for t in registry.torn()] == [40]
    plan = plan_retention(registry, include_torn=False)
    assert {e.step for e, _ in plan.keep} == {20, 30} and [e.step for e, _ in plan.remove] == [10]
    assert apply_retention(plan) == [store.step_uri(10)]
    assert plan_retention(CheckpointRegistry(root)).remove == []
    assert store.steps() == [20, 30, 40] and store.latest_valid().step == 30


# CLI ----------------------------------------------------------------------------------------


def test_cli_lists_and_prunes_only_with_yes(three_runs: str) -> None:
    runner = CliRunner()
    listed = runner.invoke(checkpoints_app, ["list", "--root", three_runs, "--model", "cell/foundation_model"])
    assert listed.exit_code == 0, listed.output
    assert "v1-aaaa" in listed.output and "v2-bbbb" in listed.output and "0123456789ab" not in listed.output
    assert "5 checkpoint(s)" in listed.output
    by_dataset = runner.invoke(checkpoints_app, ["list", "--root", three_runs, "--dataset", "cell/omics@v2"])
    assert "2 checkpoint(s)" in by_dataset.output and "v1-aaaa" not in by_dataset.output

    dry = runner.invoke(checkpoints_app, ["prune", "--root", three_runs])
    assert dry.exit_code == 0, dry.output
    assert "Dry run: nothing was removed" in dry.output and "--yes" in dry.output
    assert len(CheckpointRegistry(three_runs).entries()) == 7

    applied = runner.invoke(checkpoints_app, ["prune", "--root", three_runs, "--yes"])
    assert applied.exit_code == 0, applied.output
    # A: 30 is latest, best and final (10, 20 go); B keeps 20 (10 goes); the policy keeps 10 (5 goes).
    assert "Removed 4 folder(s), freed" in applied.output
    assert sorted((e.lineage, e.step) for e in CheckpointRegistry(three_runs).entries()) == [(FOUNDATION_A, 30), (FOUNDATION_B, 20), (POLICY, 10)]
    assert "Nothing to remove" in runner.invoke(checkpoints_app, ["prune", "--root", three_runs, "--yes"]).output


def test_cli_bad_option_is_a_clear_error(root: str) -> None:
    result = CliRunner().invoke(checkpoints_app, ["prune", "--root", root, "--keep-latest", "0"])
    assert result.exit_code == 1
    assert "keep_latest must be at least 1" in result.output and "Traceback" not in result.output
