"""Partitions of the Robotics lane."""

import dagster as dg

from robotics_lane.scenes.catalog import scene_for, scene_version_for, split_sweep_key, sweep_key
from robotics_lane.sweeps import SWEEPS

teleop_sessions = dg.DynamicPartitionsDefinition(name="teleop_sessions")
robot_evals = dg.DynamicPartitionsDefinition(name="robot_evals")


def sweep_scene_version(name: str) -> str:
    """The scene version sweep `name` runs: `<scene>-<hash8>`, the one it pins or its scene's now."""
    sweep = SWEEPS[name]
    return scene_version_for(sweep.backend, sweep.scene)


def sweep_partition_keys() -> list[str]:
    """`<sweep>.<hash8 of its scene>` per sweep: a changed scene makes a new key, and the nights
    run before it keep theirs (and their results) under the old one."""
    return sorted(sweep_key(name, sweep_scene_version(name)) for name in SWEEPS)


def sweep_of(key: str) -> tuple[str, str]:
    """A sweep partition key -> (the sweep's name, the scene version it names)."""
    name, digest = split_sweep_key(key)
    if name not in SWEEPS:
        raise KeyError(f"sweep partition {key!r}: no sweep {name!r} in robotics_lane/sweeps.py (known: {sorted(SWEEPS)})")
    sweep = SWEEPS[name]
    return name, f"{scene_for(sweep.backend, sweep.scene).name}-{digest}"


# One partition per night × sweep configuration at its scene version.
SWEEP_START = "2026-11-01"
nightly_sweeps = dg.MultiPartitionsDefinition(
    {
        "night": dg.DailyPartitionsDefinition(start_date=SWEEP_START),
        "sweep": dg.StaticPartitionsDefinition(sweep_partition_keys()),
    }
)
