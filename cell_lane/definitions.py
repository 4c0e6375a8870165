"""The Cell code location: assay drops → validated plates → omics dataset → models → next plate."""

import dagster as dg

from cell_lane.assets import dataset, design, ingest, training
from cell_lane.assets.dataset import OMICS_DATASET
from cell_lane.assets.ingest import VALIDATED_ASSAY
from cell_lane.jobs import assay_ingest_job, training_round_job
from cell_lane.partitions import assay_drops
from sensors.inflight_watcher import make_inflight_watcher
from sensors.landing_drops import make_landing_sensor
from sensors.retraining import make_retraining_sensor
from shared_resources.resources import platform_resources

assay_drop_sensor = make_landing_sensor(
    name="assay_drop_sensor",
    kind="assays",
    job_name=assay_ingest_job.name,
    partitions_def=assay_drops,
    description="Watches landing/assays/ for complete lab drops (manifest.json present) and ingests each once.",
)

training_round_sensor = make_retraining_sensor(
    name="training_round_sensor",
    upstream=VALIDATED_ASSAY,
    accepted_status="valid",
    training_set=OMICS_DATASET,
    job_name=training_round_job.name,
    ingest_job_name=assay_ingest_job.name,
    description="Starts a training round when newly validated plates are in and no ingest is still running.",
)
gpu_job_watcher = make_inflight_watcher(name="cell_gpu_job_watcher", asset_prefix="cell/")

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([ingest, dataset, training, design]),
    jobs=[assay_ingest_job, training_round_job],
    sensors=[assay_drop_sensor, training_round_sensor, gpu_job_watcher],
    resources=platform_resources(),
)
