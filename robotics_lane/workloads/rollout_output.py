"""Where a rollout shard commits its work, read by the workload and by the assets that assemble it.

    <output_uri>/episodes/episode-000042.parquet  frames of seed 42 (LeRobot v3 data columns)
    <output_uri>/trials/seed-000042.json          the trial record: the commit marker
"""

from __future__ import annotations

import posixpath

from workload_runtime.storage import fs_for


def trial_uri(output_uri: str, seed: int) -> str:
    return posixpath.join(output_uri, "trials", f"seed-{seed:06d}.json")


def episodes_folder(output_uri: str) -> str:
    return posixpath.join(output_uri, "episodes")


def committed_seeds(output_uri: str) -> set[int]:
    fs, path = fs_for(posixpath.join(output_uri, "trials"))
    if not fs.exists(path):
        return set()
    return {int(posixpath.basename(p)[5:11]) for p in fs.glob(posixpath.join(path, "seed-*.json"))}
