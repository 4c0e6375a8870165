"""The platform's data-layer views on a fresh root, and retention as an asset (dry run, then for real)."""

from __future__ import annotations

import dagster as dg
import torch

from platform_location.defs.assets.data_layer import checkpoint_retention, dataset_catalog, training_runs
from data_layer.checkpoint_registry import CheckpointRegistry
from workload_runtime.checkpoints import CheckpointStore
from shared_resources.resources import StorageResource


def _md(result, key: str) -> dict:
    event = next(e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == key)
    return {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}


def test_views_explain_an_empty_root(instance, home):
    result = dg.materialize([dataset_catalog, training_runs, checkpoint_retention], instance=instance, resources={"storage": StorageResource(root=str(home))})
    assert result.success
    assert _md(result, "platform/dataset_catalog")["versions"] == 0
    assert "no dataset registered yet" in _md(result, "platform/dataset_catalog")["catalog"]
    assert _md(result, "platform/training_runs")["runs"] == 0
    assert _md(result, "platform/checkpoint_retention")["removed"] == 0


def test_retention_asset_dry_run_then_apply(instance, home):
    store = CheckpointStore(str(home / "checkpoints" / "cell" / "foundation_model" / "run-a"))
    for step, loss in ((10, 0.9), (20, 0.2), (30, 0.5), (40, 0.6)):
        store.save(step, {"model": {"w": torch.full((2,), float(step))}}, meta={"losses": [loss]})
    resources = {"storage": StorageResource(root=str(home))}
    dry = dg.materialize([checkpoint_retention], instance=instance, resources=resources, run_config={"ops": {"platform__checkpoint_retention": {"config": {"dry_run": True}}}})
    assert _md(dry, "platform/checkpoint_retention")["would_remove"] == 2
    assert len(CheckpointRegistry(str(home)).entries()) == 4  # nothing removed in a dry run
    done = dg.materialize([checkpoint_retention], instance=instance, resources=resources)
    md = _md(done, "platform/checkpoint_retention")
    assert md["removed"] == 2 and "step-00000010" in md["removed_paths"] and "step-00000030" in md["removed_paths"]
    assert [e.step for e in CheckpointRegistry(str(home)).entries()] == [20, 40]  # the best loss and the latest
    assert store.latest_valid().step == 40
