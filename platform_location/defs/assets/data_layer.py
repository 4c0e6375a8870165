"""The experiment and data layer at a glance: dataset versions, training runs, checkpoint retention."""

import pandas as pd

import dagster as dg

from data_layer.checkpoint_registry import CheckpointRegistry, human_bytes
from data_layer.checkpoint_retention import apply_retention, plan_retention, pointer_protections
from data_layer.registry.registry import DataRegistry
from data_layer.experiments import list_runs
from data_layer.run_comparison import curve_png, image_markdown
from shared_resources.resources import StorageResource

GROUP = "platform_data"


@dg.asset(key=dg.AssetKey(["platform", "dataset_catalog"]), group_name=GROUP, kinds={"dvc", "git"})
def dataset_catalog(context: dg.AssetExecutionContext, storage: StorageResource) -> dg.MaterializeResult:
    """Every dataset version in the data registry (git + DVC under the storage root): what it is,
    its DVC hash and registry revision, its size and the region it lives in.

    Get one back with `sinewgrid data get DATASET VERSION DEST`, or without Sinewgrid with the
    `dvc get` line in the dataset asset's metadata (docs/datasets.md).
    """
    registry = DataRegistry.for_root(storage.get().root)
    versions = registry.versions()
    table = pd.DataFrame(
        [
            {"dataset": v.dataset, "version": v.version, "dvc_md5": v.md5[:12], "registry_rev": v.rev[:10], "files": v.files, "MB": round(v.bytes / 1e6, 2), "region": f"{v.provider} {v.region}", "registered": v.registered_at[:19]}
            for v in versions
        ]
    )
    per_dataset = table.groupby("dataset").agg(versions=("version", "count"), MB=("MB", "sum")).reset_index() if len(table) else table
    return dg.MaterializeResult(
        metadata={
            "versions": len(versions),
            "datasets": dg.MetadataValue.md(per_dataset.to_markdown(index=False) if len(table) else "no dataset registered yet"),
            "catalog": dg.MetadataValue.md(table.to_markdown(index=False) if len(table) else "no dataset registered yet"),
            "registry_git": registry.git_url,
            "dvc_remote": registry.remote_url,
        }
    )


@dg.asset(key=dg.AssetKey(["platform", "training_runs"]), group_name=GROUP, kinds={"parquet"})
def training_runs(context: dg.AssetExecutionContext, storage: StorageResource) -> dg.MaterializeResult:
    """Every recorded training run of both lanes: its figures, evaluations, datasets, code version,
    pool and cost, with each model's loss curves on one plot.

    Compare two runs with `sinewgrid runs compare A B` (docs/checkpoints.md).
    """
    runs = list_runs(storage.get().root, warn=context.log.warning)
    rows = [
        {
            "run": r.lineage,
            **{k: round(v, 5) for k, v in r.summary.items() if k in ("final_loss", "held_out_rmse", "baseline_rmse")},
            **{f"{name}:{k}": round(v, 4) for name, figures in r.evaluations.items() for k, v in figures.items() if "ci95" not in k},
            "datasets": len(r.datasets),
            "code": r.code_version[:10],
            "pool": r.pool,
            "recorded": r.recorded_at[:19],
        }
        for r in runs
    ]
    metadata = {
        "runs": len(runs),
        "table": dg.MetadataValue.md(pd.DataFrame(rows).to_markdown(index=False) if rows else "no training run recorded yet"),
    }
    for model in sorted({r.model for r in runs}):
        with_curve = [r for r in runs if r.model == model and not r.curve("loss").empty]
        if with_curve:
            metadata[f"loss_{model.replace('/', '_')}"] = dg.MetadataValue.md(image_markdown(curve_png(with_curve[-6:], "loss"), f"{model}: loss by step"))
    return dg.MaterializeResult(metadata=metadata)


class RetentionSettings(dg.Config):
    """What checkpoint retention keeps in every run (the rest is removed)."""

    keep_latest: int = 1
    keep_best: int = 1
    metric: str = "loss"
    mode: str = "min"
    dry_run: bool = False


@dg.asset(key=dg.AssetKey(["platform", "checkpoint_retention"]), group_name=GROUP, kinds={"safetensors"})
def checkpoint_retention(context: dg.AssetExecutionContext, config: RetentionSettings, storage: StorageResource) -> dg.MaterializeResult:
    """Frees checkpoint storage: in every run it keeps the newest checkpoint(s), the best by the
    metric (lowest loss by default), every final checkpoint and every checkpoint another asset
    points at, and removes the rest — manifest first, so nothing half removed is ever read as valid.

    The table says what was kept, what was removed and why. Set `dry_run` to see the plan only.
    Run metrics (`run.json`, `metrics.parquet`) are never removed.
    """
    root = storage.get().root
    plan = plan_retention(
        CheckpointRegistry(root),
        keep_latest=config.keep_latest, keep_best=config.keep_best, metric=config.metric, mode=config.mode, protect=pointer_protections(root),
    )
    removed = [] if config.dry_run else apply_retention(plan)
    context.log.info(("would remove" if config.dry_run else "removed") + f" {len(plan.remove)} checkpoint(s): {plan.summary()}")
    return dg.MaterializeResult(
        metadata={
            "removed": len(removed),
            "would_remove": len(plan.remove) if config.dry_run else 0,
            "bytes_freed": human_bytes(plan.bytes_freed if removed else 0),
            "kept": len(plan.keep),
            "plan": dg.MetadataValue.md(plan.markdown()),
            "removed_paths": dg.MetadataValue.md("\n".join(f"- {u}" for u in removed) or "nothing removed"),
        }
    )
