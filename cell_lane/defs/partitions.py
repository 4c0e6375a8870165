"""The Cell lane's partitions: one per lab (tenant), and for ingest one per drop a lab sent.

The tenants are the Cell labs of the tenants catalog (`control_plane/catalog/tenants.yaml`,
or `SINEWGRID_TENANTS`), read when the code location loads: a new lab appears after a reload.
An ingest partition is a lab's drop, `<lab>/<drop_id>` (`lab-a/seed-plate-001`), added by the
landing sensor when the drop arrives: the UI offers only drops that exist. A drop is named by the
drop_id the lab chose, so two labs may use the same one: `x` from each is `lab-a/x` and `lab-b/x`,
two partitions, each in its own lab's storage root.
"""

import dagster as dg

from control_plane.catalog.tenants import load_tenants
from control_plane.intake.landing import split_tenant_drop_key

cell_tenants = dg.StaticPartitionsDefinition([t.name for t in load_tenants().of_lane("cell")])
lab_drops = dg.DynamicPartitionsDefinition(name="lab_assay_drops")


def tenant_and_drop(context: dg.AssetExecutionContext) -> tuple[str, str]:
    """The lab and the drop_id of an ingest partition."""
    return split_tenant_drop_key(context.partition_key)


def tenant_of(partition_key: str) -> str:
    """The lab whose drop an ingest partition is."""
    return split_tenant_drop_key(partition_key)[0]
