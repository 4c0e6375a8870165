"""The Cell lane's partitions: one per lab (tenant), and for ingest one per lab and drop.

The tenants are the Cell labs of the tenants catalog (`control_plane/catalog/tenants.yaml`,
or `SINEWGRID_TENANTS`), read when the code location loads: a new lab appears after a reload.
A drop is named by the drop_id the lab chose, so two labs may use the same one: Dagster writes
the keys `x|lab-a` and `x|lab-b` (dimensions in name order), two partitions, each in its own
lab's storage root.
"""

import dagster as dg

from control_plane.catalog.tenants import load_tenants

TENANT = "tenant"
DROP = "drop"

cell_tenants = dg.StaticPartitionsDefinition([t.name for t in load_tenants().of_lane("cell")])
assay_drops = dg.DynamicPartitionsDefinition(name="assay_drops")
tenant_drops = dg.MultiPartitionsDefinition({DROP: assay_drops, TENANT: cell_tenants})


def tenant_and_drop(context: dg.AssetExecutionContext) -> tuple[str, str]:
    """The lab and the drop_id of an ingest partition."""
    keys = context.partition_key.keys_by_dimension
    return keys[TENANT], keys[DROP]
