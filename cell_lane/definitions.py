"""The Cell code location: assay drops → validated plates → omics dataset → models → next plate.

Its assets, checks, jobs and sensors live under `defs/` and are found there by Dagster's
`load_defs`; this module adds the platform's resources (storage and compute).
"""

import dagster as dg

import cell_lane.defs
from shared_resources.resources import platform_resources

defs = dg.Definitions.merge(dg.components.load_defs(cell_lane.defs), dg.Definitions(resources=platform_resources()))
