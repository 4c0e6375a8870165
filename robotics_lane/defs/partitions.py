"""Partitions of the Robotics lane."""

import dagster as dg

from robotics_lane.sweeps import SWEEPS

teleop_sessions = dg.DynamicPartitionsDefinition(name="teleop_sessions")
robot_evals = dg.DynamicPartitionsDefinition(name="robot_evals")

# One partition per night × sweep configuration.
SWEEP_START = "2026-11-01"
nightly_sweeps = dg.MultiPartitionsDefinition(
    {
        "night": dg.DailyPartitionsDefinition(start_date=SWEEP_START),
        "sweep": dg.StaticPartitionsDefinition(sorted(SWEEPS)),
    }
)
