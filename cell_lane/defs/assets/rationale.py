"""Rationale: a short note per gene of the next plate, written by a model for the scientist who reviews it."""

import io
import posixpath
from pathlib import Path

import dagster as dg
import pandas as pd

from cell_lane.defs.assets.design import NEXT_PLATE_PROPOSAL
from cell_lane.defs.assets.training import pointer_uri
from cell_lane.defs.partitions import cell_tenants
from cell_lane.plate_design_rationale import rationale_payloads
from control_plane.tenancy.shown import table_or_count
from data_layer.provenance import record_result
from shared_resources.resources import ModelGatewayResource, StorageResource
from workload_runtime.storage import exists, read_bytes, read_json, write_bytes_atomic

PLATE_RATIONALE = dg.AssetKey(["cell", "plate_rationale"])
TASK_FOLDER = Path(__file__).resolve().parents[2] / "tasks" / "gene-rationale"


@dg.asset(key=PLATE_RATIONALE, deps=[NEXT_PLATE_PROPOSAL], partitions_def=cell_tenants, group_name="cell_design", kinds={"parquet", "llm"})
def plate_rationale(context: dg.AssetExecutionContext, storage: StorageResource, models: ModelGatewayResource) -> dg.MaterializeResult:
    """Why each gene is on the next plate, in a sentence or two: which way the model expects the
    knockdown to move viability, how sure it is, and whether the gene was picked for its predicted
    effect or to learn where the model is unsure. Written by a language model as a research
    assistant; each note is checked against the numbers it explains before it is kept.

    The lab's data goes only to the model providers its data agreement allows (tenants catalog,
    `outside_models`): a lab that allows none gets its notes from a model the platform serves
    itself. Tokens and cost per gene are in the metadata and in the ledger beside GPU hours.
    """
    tenant = context.partition_key
    store = storage.for_tenant(tenant)
    finetuned = read_json(pointer_uri(store, "finetuned_model"))
    proposal_id = f"plate-{finetuned['run_id'][:12]}"
    proposal_uri = store.outbox("plates", proposal_id, "proposal.json")
    if not exists(proposal_uri):
        raise dg.Failure(f"{tenant} has no proposal {proposal_id} ({proposal_uri}): materialize cell/next_plate_proposal for it first.")
    proposal = read_json(proposal_uri)
    predictions = pd.read_parquet(io.BytesIO(read_bytes(finetuned["predictions_uri"])))
    payloads = rationale_payloads(pd.DataFrame(proposal["genes"]), proposal_id=proposal_id, exploration=float(proposal["exploration"]), training=predictions)
    items = [(p["gene"], p) for p in payloads]
    source = f"cell/next_plate_proposal/{proposal_id}"
    run = models.run_task(context, str(TASK_FOLDER), items, inputs=[source], lane="cell", tenant=tenant, storage_root=store.root)
    notes = run.frame()
    uri = store.curated("plate_rationale", proposal_id, "rationale.parquet")
    buffer = io.BytesIO()
    notes.to_parquet(buffer, index=False)
    write_bytes_atomic(uri, buffer.getvalue())  # derived from the lab's results: sealed with its key
    shown = notes[[c for c in ("gene", "direction", "confidence", "rationale", "model") if c in notes]].head(12)
    provenance = record_result(
        store, f"cell/plate_rationale/{proposal_id}", "notes", f"{len(run.completed)} gene notes for plate {proposal['plate_barcode']}",
        inputs=[source], uri=uri, facts={"task": run.task.ref, "model": run.route.primary.id, "tenant": tenant},
    )
    return dg.MaterializeResult(
        metadata={
            "tenant": tenant,
            "proposal_id": proposal_id,
            "notes": table_or_count(store.root, shown, "gene notes (the first 12)", uri),
            "notes_file": dg.MetadataValue.path(uri),
            **run.metadata(),
            **provenance,
        }
    )
