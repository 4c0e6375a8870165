"""The Cell lane's sensors: lab drops in, training rounds, and the watcher of its GPU jobs."""

from cell_lane.defs.assets.dataset import OMICS_DATASET
from cell_lane.defs.assets.ingest import VALIDATED_ASSAY
from cell_lane.defs import jobs
from cell_lane.defs.partitions import cell_tenants, lab_drops, tenant_of
from sensors.inflight_watcher import make_inflight_watcher
from sensors.landing_drops import make_landing_sensor
from sensors.retraining import make_retraining_sensor

assay_drop_sensor = make_landing_sensor(
    name="assay_drop_sensor",
    kind="assays",
    job_name=jobs.assay_ingest_job.name,
    partitions_def=lab_drops,
    tenants=cell_tenants.get_partition_keys(),
    description="Watches each lab's landing/assays/ (tenants/<lab>/landing/assays/) for complete drops (manifest.json present) and ingests each once, into that lab's own root.",
)

training_round_sensor = make_retraining_sensor(
    name="training_round_sensor",
    upstream=VALIDATED_ASSAY,
    accepted_status="valid",
    training_set=OMICS_DATASET,
    job_name=jobs.training_round_job.name,
    ingest_job_name=jobs.assay_ingest_job.name,
    tenants=cell_tenants.get_partition_keys(),
    tenant_of=tenant_of,
    description="Starts a training round for each lab with newly validated plates, once no ingest is still running.",
)
gpu_job_watcher = make_inflight_watcher(name="cell_gpu_job_watcher", asset_prefix="cell/")
