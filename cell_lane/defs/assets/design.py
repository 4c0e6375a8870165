"""Design: the model proposes the next plate, written to the outbox for the lab."""


import io
import posixpath

import dagster as dg
import pandas as pd

from cell_lane.defs.assets.training import FINETUNED_MODEL, pointer_uri
from cell_lane.defs.partitions import cell_tenants
from cell_lane.plate_layout import GENES_PER_PLATE, plate_layout
from control_plane.tenancy.shown import table_or_count
from data_layer.provenance import record_result
from shared_resources.resources import StorageResource
from workload_runtime.storage import exists, read_bytes, read_json, write_bytes_atomic, write_json_atomic

NEXT_PLATE_PROPOSAL = dg.AssetKey(["cell", "next_plate_proposal"])


class ProposalSettings(dg.Config):
    """How the next plate is chosen among genes not yet assayed."""

    genes: int = GENES_PER_PLATE
    exploration: float = 1.0  # weight of uncertainty against predicted effect (upper confidence bound)


def rank_candidates(predictions: pd.DataFrame, exploration: float) -> pd.DataFrame:
    """Genes not yet assayed, best first by predicted effect + exploration × uncertainty."""
    candidates = predictions[~predictions["assayed"]].copy()
    candidates["score"] = candidates["predicted_effect"] + exploration * candidates["uncertainty"]
    return candidates.sort_values(["score", "gene"], ascending=[False, True]).reset_index(drop=True)


@dg.asset(key=NEXT_PLATE_PROPOSAL, deps=[FINETUNED_MODEL], partitions_def=cell_tenants, group_name="cell_design", kinds={"csv"})
def next_plate_proposal(
    context: dg.AssetExecutionContext, config: ProposalSettings, storage: StorageResource
) -> dg.MaterializeResult:
    """The plate the lab's model asks it to run next: genes not yet assayed with the strongest
    predicted effect, favouring those it is least sure of, laid out on a 96-well plate with
    controls. The worklist (same columns as a drop, readout empty) is in the lab's outbox.

    The worklist and proposal stay plain (not sealed): the lab's own systems read them, with no
    key of ours. They name genes and wells, not the lab's results.
    """
    tenant = context.partition_key
    store = storage.for_tenant(tenant)
    finetuned = read_json(pointer_uri(store, "finetuned_model"))
    predictions = pd.read_parquet(io.BytesIO(read_bytes(finetuned["predictions_uri"])))
    ranked = rank_candidates(predictions, config.exploration)
    if ranked.empty:
        raise dg.Failure("Every gene in the dataset has been assayed: there is nothing left to propose.")
    chosen = ranked.head(min(config.genes, GENES_PER_PLATE))
    proposal_id = f"plate-{finetuned['run_id'][:12]}"
    barcode = f"SGP-{finetuned['run_id'][:8].upper()}"
    worklist = plate_layout(chosen["gene"].tolist(), barcode)
    folder = store.outbox("plates", proposal_id)
    worklist_uri = posixpath.join(folder, "worklist.csv")
    if not exists(worklist_uri):
        write_bytes_atomic(worklist_uri, worklist.to_csv(index=False).encode())
        write_json_atomic(
            posixpath.join(folder, "proposal.json"),
            {
                "proposal_id": proposal_id,
                "plate_barcode": barcode,
                "finetune_id": finetuned["run_id"],
                "dataset_version": finetuned["dataset_version"],
                "exploration": config.exploration,
                "genes": chosen[["gene", "predicted_effect", "uncertainty", "score"]].to_dict(orient="records"),
            },
        )
    else:
        context.log.info(f"{worklist_uri} exists already (same model, same proposal); left as it is")
    provenance = record_result(
        store, f"cell/next_plate_proposal/{proposal_id}", "proposal", f"plate {barcode} proposed to the lab",
        inputs=[finetuned.get("run", f"cell/finetuned_model/{finetuned['run_id']}")], uri=worklist_uri, facts={"genes": len(chosen)},
    )
    return dg.MaterializeResult(
        metadata={
            "proposal_id": proposal_id,
            "tenant": tenant,
            "plate_barcode": barcode,
            "worklist": dg.MetadataValue.path(worklist_uri),
            "genes": len(chosen),
            "candidates_left": len(ranked),
            "mean_predicted_effect": dg.MetadataValue.float(round(float(chosen["predicted_effect"].mean()), 4)),
            "proposed": table_or_count(store.root, chosen[["gene", "predicted_effect", "uncertainty", "score"]].round(3), "genes proposed", posixpath.join(folder, "proposal.json")),
            **provenance,
        }
    )
