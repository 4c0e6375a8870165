"""Training, one lab at a time: pretrain the foundation model on a steady pool, fine-tune it on a burst pool."""


import hashlib
import json

import dagster as dg
from pydantic import Field

from cell_lane.defs.assets.dataset import OMICS_DATASET, latest_dataset
from cell_lane.defs.partitions import cell_tenants
from cell_lane.workloads.config import FinetuneConfig, FinetuneSettings, PretrainConfig, PretrainSettings
from shared_resources.compute import ComputeResource
from control_plane.catalog.pools import Capacity
from data_layer.agreement_checks import require_shared_training, shared_training_check_spec
from control_plane.tenancy.agreements import check_shared_training, limits_for
from data_layer.experiments import list_runs
from data_layer.provenance import dataset_ref, find_version, record_result, track_run, trained_on
from data_layer.run_comparison import image_markdown, rounds_frame, rounds_png
from shared_resources.resources import StorageResource
from control_plane.catalog.step_spec import TRAINING_IMPORTS, StepSpec
from workload_runtime.storage import Storage, read_json, write_json_atomic

FOUNDATION_MODEL = dg.AssetKey(["cell", "foundation_model"])
FINETUNED_MODEL = dg.AssetKey(["cell", "finetuned_model"])


def _short_hash(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:10]


class PretrainLaunchpad(dg.Config, PretrainSettings):
    """Masked-expression pretraining settings (change them in the launchpad)."""

    checkpoint_every_steps: int = Field(50, ge=1, description="Save a checkpoint every this many steps (and on preemption).")


class FinetuneLaunchpad(dg.Config, FinetuneSettings):
    """Fine-tune settings: K-fold effect heads on the foundation's gene embeddings."""

    checkpoint_every_steps: int = Field(100, ge=1, description="Save a checkpoint every this many steps (and on preemption).")


def checkpoint_sealed_with(checkpoint_uri: str) -> dict[str, str]:
    """The key that sealed a checkpoint (its manifest names it, never holding it), for the lineage."""
    manifest = read_json(f"{checkpoint_uri.rstrip('/')}/manifest.json")
    sealed = manifest.get("sealed_with") or {}
    return {"sealed_with_key": sealed["key_id"]} if sealed else {}


def pointer_uri(store: Storage, asset: str) -> str:
    """The pointer to an asset's newest result under a lab's root."""
    return store.artifacts("cell", asset, "latest.json")


@dg.asset(
    key=FOUNDATION_MODEL, deps=[OMICS_DATASET], partitions_def=cell_tenants, group_name="cell_training", kinds={"pytorch", "safetensors"},
    check_specs=[shared_training_check_spec(FOUNDATION_MODEL)],
)
def foundation_model(
    context: dg.AssetExecutionContext, config: PretrainLaunchpad, storage: StorageResource, compute: ComputeResource
) -> dg.MaterializeResult:
    """A lab's model of how genes co-vary across cells, learnt by hiding part of each cell's
    expression and predicting it back. Its gene embeddings are the starting point of the lab's
    fine-tunes; its weights are sealed with the lab's key.

    Runs on steady capacity; checkpoints every few steps and resumes after a preemption.
    Pretraining depends only on the expression matrix, so a new assay round reuses it.
    `loss_curve` plots the run's loss; `lineage` names the omics version it was trained on.
    """
    tenant = context.partition_key
    store = storage.for_tenant(tenant)
    dataset = latest_dataset(store.curated("omics"))
    version = find_version(store, dataset["ref"])
    agreed = require_shared_training(context, check_shared_training([version]))
    job = PretrainConfig.of(config, dataset_uri=dataset["uri"])
    settings = job.model_dump(include=set(PretrainSettings.model_fields))
    lineage = f"cell/foundation_model/{dataset['matrix_version']}-{_short_hash(settings)}"
    spec = StepSpec(
        name="cell.foundation_model",
        entry_point="cell_lane.workloads.pretrain",
        tenant=tenant,
        gpus=1,
        capacity=Capacity.steady,
        checkpoint_every_steps=config.checkpoint_every_steps,
        expected_hours=0.5,
        imports=[*TRAINING_IMPORTS, "anndata"],
        datasets=[dataset_ref(version)],
        limits=limits_for([version]),  # the regions its data's agreement allows
        config=job,
    )
    step = compute.run(context, spec, lineage=lineage)
    write_json_atomic(pointer_uri(store, "foundation_model"), {"checkpoint_uri": step.checkpoint_uri, "lineage": lineage})
    final = step.metadata()
    provenance = record_result(
        store, lineage, "model", "pretrained foundation model (safetensors checkpoint)",
        inputs=trained_on(step.final_checkpoint), uri=step.final_checkpoint,
        facts={"final_loss": final.get("final_loss"), "pool": step.pool.name, **checkpoint_sealed_with(step.final_checkpoint)},
    )
    tracked = track_run(store, lineage, step.final_checkpoint, step.result, config=settings, pool=step.pool.name, cost_usd=step.cost_usd, dagster_run_id=context.run_id)
    return dg.MaterializeResult(
        metadata={**final, **provenance, **tracked, "tenant": tenant, "run": lineage, "dataset_version": dataset["version"]}, check_results=[agreed]
    )


ROUND_FIGURES = ("held_out_rmse", "baseline_rmse", "held_out_spearman")
ROUND_PANELS = {
    "held-out error (lower is better)": ["held_out_rmse", "baseline_rmse"],
    "Spearman ρ on held-out genes": ["held_out_spearman"],
    "GPU cost (USD)": ["cost_usd"],
}


def rounds_metadata(store: Storage, tenant: str) -> dict:
    """The lab's fine-tuning rounds so far (each a run on a larger training set), as one chart
    and a table: the held-out error beside the baseline, the rank correlation and the cost,
    round by round. Only this lab's runs: they are read from its own root."""
    frame = rounds_frame(list_runs(store.root, model="cell/finetuned_model"), ROUND_FIGURES)
    chart = rounds_png(frame, ROUND_PANELS, f"{tenant}: the fine-tuned model, round by round")
    table = frame.drop(columns=["dataset"]).round(4).to_markdown(index=False)
    return {"round": len(frame), "rounds": dg.MetadataValue.md(image_markdown(chart, f"{tenant} rounds") + "\n\n" + table)}


@dg.asset(
    key=FINETUNED_MODEL, deps=[FOUNDATION_MODEL, OMICS_DATASET], partitions_def=cell_tenants, group_name="cell_training", kinds={"pytorch", "parquet"},
    check_specs=[shared_training_check_spec(FINETUNED_MODEL)],
)
def finetuned_model(
    context: dg.AssetExecutionContext, config: FinetuneLaunchpad, storage: StorageResource, compute: ComputeResource
) -> dg.MaterializeResult:
    """Predicts how strongly knocking down each gene changes the lab's assay readout, with an
    uncertainty, from the lab's foundation gene embeddings and all its assay results so far
    (its predictions are sealed with the lab's key).

    `held_out_rmse` is the error on genes the model did not see (K-fold); `baseline_rmse` is
    the error of always guessing the average — the model is useful while it stays below.
    `rounds` charts them (and the rank correlation and the cost) round by round for this lab:
    read it rather than the Plots tab, which joins the labs' latest values partition by partition.
    Runs on burst (spot) capacity and resumes from its checkpoint when preempted.
    """
    tenant = context.partition_key
    store = storage.for_tenant(tenant)
    dataset = latest_dataset(store.curated("omics"))
    foundation = read_json(pointer_uri(store, "foundation_model"))
    version = find_version(store, dataset["ref"])
    agreed = require_shared_training(context, check_shared_training([version]))
    settings = config.model_dump(include=set(FinetuneSettings.model_fields))
    run_id = f"{dataset['version']}-{_short_hash({**settings, 'foundation': foundation['lineage']})}"
    job = FinetuneConfig.of(
        config,
        dataset_uri=dataset["uri"],
        foundation_checkpoint_uri=foundation["checkpoint_uri"],
        predictions_uri=store.artifacts("cell", "finetuned_model", run_id, "predictions.parquet"),
    )
    spec = StepSpec(
        name="cell.finetuned_model",
        entry_point="cell_lane.workloads.finetune",
        tenant=tenant,
        gpus=1,
        capacity=Capacity.burst,
        checkpoint_every_steps=config.checkpoint_every_steps,
        expected_hours=0.1,
        imports=[*TRAINING_IMPORTS, "anndata", "pandas"],
        datasets=[dataset_ref(version)],
        limits=limits_for([version]),  # the regions its data's agreement allows
        config=job,
    )
    run = f"cell/finetuned_model/{run_id}"
    step = compute.run(context, spec, lineage=run)
    write_json_atomic(
        pointer_uri(store, "finetuned_model"),
        {"run_id": run_id, "run": run, "predictions_uri": job.predictions_uri, "dataset_version": dataset["version"]},
    )
    final = step.metadata()
    provenance = record_result(
        store, run, "model", "fine-tuned effect model, evaluated on held-out genes (K-fold)",
        inputs=[foundation["lineage"], *trained_on(step.final_checkpoint)], uri=step.final_checkpoint,
        facts={"held_out_rmse": final.get("held_out_rmse"), "baseline_rmse": final.get("baseline_rmse"), "pool": step.pool.name, **checkpoint_sealed_with(step.final_checkpoint)},
    )
    tracked = track_run(store, run, step.final_checkpoint, step.result, config={**settings, "foundation": foundation["lineage"]}, pool=step.pool.name, cost_usd=step.cost_usd, dagster_run_id=context.run_id)
    return dg.MaterializeResult(
        metadata={**final, **provenance, **tracked, **rounds_metadata(store, tenant), "tenant": tenant, "run": run, "dataset_version": dataset["version"], "finetune_id": run_id},
        check_results=[agreed],
    )
