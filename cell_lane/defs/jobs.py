"""Jobs of the Cell lane."""

import dagster as dg

from cell_lane.defs.assets.dataset import OMICS_DATASET
from cell_lane.defs.assets.design import NEXT_PLATE_PROPOSAL
from cell_lane.defs.assets.ingest import RAW_ASSAY, VALIDATED_ASSAY
from cell_lane.defs.assets.rationale import PLATE_RATIONALE
from cell_lane.defs.assets.training import FINETUNED_MODEL, FOUNDATION_MODEL
from cell_lane.defs.partitions import cell_tenants, lab_drops

assay_ingest_job = dg.define_asset_job(
    "assay_ingest",
    selection=dg.AssetSelection.assets(RAW_ASSAY, VALIDATED_ASSAY),
    partitions_def=lab_drops,
    description="Copy one lab's drop into its raw zone and validate it (bad drops go to its quarantine).",
)

training_round_job = dg.define_asset_job(
    "cell_training_round",
    selection=dg.AssetSelection.assets(OMICS_DATASET, FOUNDATION_MODEL, FINETUNED_MODEL, NEXT_PLATE_PROPOSAL, PLATE_RATIONALE),
    partitions_def=cell_tenants,
    description="One round of one lab's loop: rebuild the training set, (re)use the foundation model, fine-tune, propose the next plate and write why each gene is on it.",
)
