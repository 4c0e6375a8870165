"""One partition per lab drop: the drop_id the lab chose."""

import dagster as dg

assay_drops = dg.DynamicPartitionsDefinition(name="assay_drops")
