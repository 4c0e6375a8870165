"""Rollout shards: one file per finished episode, assembled into a dataset at the end.

A shard that may be preempted at any moment commits each finished episode as its own
parquet file (the columns of a LeRobot v3 data file); `assemble_dataset` merges them into one
v3.0 dataset folder once every shard is done.
"""

from __future__ import annotations

import json
import posixpath

import numpy as np
from fsspec.core import url_to_fs

from robotics_lane.episodes.lerobot_v3 import (
    DatasetInfo,
    Episode,
    _episode_from_frames,
    _frames_table,
    _metadata_columns,
    _table_bytes,
    _write_bytes,
    open_folder,
    read_table,
    write_dataset,
)

EPISODE_FILE_METADATA_KEY = b"sinewgrid"


def write_episode_file(
    uri: str, episode: Episode, episode_index: int, global_index_start: int, task_index: int, fps: int
) -> str:
    """Write one finished episode as `<uri>/episode-<episode_index:06d>.parquet`; return its URI.

    The file has the same columns as a v3.0 data file; the episode's metadata rides in
    the parquet schema metadata. Give it to `assemble_dataset` with the task list that
    `task_index` points into.
    """
    fs, root = open_folder(uri)
    table = _frames_table(episode, episode_index, global_index_start, task_index, int(fps))
    _metadata_columns([episode])  # same type rules as the dataset's episode table
    meta = {k: v.item() if isinstance(v, np.generic) else v for k, v in episode.metadata.items()}
    table = table.replace_schema_metadata({EPISODE_FILE_METADATA_KEY: json.dumps({"metadata": meta}).encode()})
    path = posixpath.join(root, f"episode-{episode_index:06d}.parquet")
    _write_bytes(fs, path, _table_bytes(table))
    return fs.unstrip_protocol(path) if "://" in uri else path


def read_episode_file(uri: str, tasks: list[str]) -> Episode:
    """One file written by `write_episode_file`, back as an Episode."""
    fs, path = url_to_fs(uri)
    table = read_table(fs, path)
    task_index = int(table.column("task_index")[0].as_py())
    if not 0 <= task_index < len(tasks):
        raise ValueError(f"{uri}: task_index {task_index} is outside the {len(tasks)} tasks given; pass the task list the shard used.")
    meta = json.loads((table.schema.metadata or {}).get(EPISODE_FILE_METADATA_KEY, b"{}"))
    return _episode_from_frames(table, tasks[task_index], meta.get("metadata", {}))


def assemble_dataset(
    uri: str, episode_files: list[str], tasks: list[str], fps: int, robot_type: str, state_names: list[str], action_names: list[str]
) -> DatasetInfo:
    """Merge per-episode files into one v3.0 dataset folder at `uri`.

    Episodes are renumbered 0..N-1 in the order of `episode_files` (so shards may number
    their episodes independently) and tasks by first use; the result equals
    `write_dataset` on the same episodes.
    """
    duplicates = sorted({f for f in episode_files if episode_files.count(f) > 1})
    if duplicates:
        raise ValueError(f"episode files listed more than once: {duplicates[:5]}; each finished episode goes in once.")
    episodes = [read_episode_file(f, tasks) for f in episode_files]
    return write_dataset(uri, episodes, fps=fps, robot_type=robot_type, state_names=state_names, action_names=action_names)
