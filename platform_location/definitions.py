"""The platform code location: cross-lane views — what the GPU work cost and how much was useful,
where the lanes' calendar will run next (the capacity plan), how the platform recovers
from faults (the failure drills), and the data layer (dataset versions, training runs,
checkpoint retention).

Its assets, jobs and schedule live under `defs/` and are found there by Dagster's
`load_defs`; this module adds the platform's resources (storage and compute).
"""

import dagster as dg

import platform_location.defs
from shared_resources.resources import platform_resources

defs = dg.Definitions.merge(dg.components.load_defs(platform_location.defs), dg.Definitions(resources=platform_resources()))
