"""Jobs of the Cell lane."""

import dagster as dg

from cell_lane.defs.assets.dataset import OMICS_DATASET
from cell_lane.defs.assets.design import NEXT_PLATE_PROPOSAL
from cell_lane.defs.assets.ingest import RAW_ASSAY, VALIDATED_ASSAY
from cell_lane.defs.assets.training import FINETUNED_MODEL, FOUNDATION_MODEL
from cell_lane.defs.partitions import assay_drops

assay_ingest_job = dg.define_asset_job(
    "assay_ingest",
    selection=dg.AssetSelection.assets(RAW_ASSAY, VALIDATED_ASSAY),
    partitions_def=assay_drops,
    description="Copy one lab drop into the raw zone and validate it (bad drops go to quarantine).",
)

training_round_job = dg.define_asset_job(
    "cell_training_round",
    selection=dg.AssetSelection.assets(OMICS_DATASET, FOUNDATION_MODEL, FINETUNED_MODEL, NEXT_PLATE_PROPOSAL),
    description="One round of the loop: rebuild the training set, (re)use the foundation model, fine-tune, propose the next plate.",
)
