"""The Robotics code location: teleop episodes, nightly sim sweeps, policy, sim and real evaluation.

Its assets, checks, jobs, sensors and schedule live under `defs/` and are found there by
Dagster's `load_defs`; this module adds the platform's resources (storage and compute).
"""

import dagster as dg

import robotics_lane.defs
from shared_resources.resources import platform_resources

defs = dg.Definitions.merge(dg.components.load_defs(robotics_lane.defs), dg.Definitions(resources=platform_resources()))
