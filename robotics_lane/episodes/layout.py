"""The LeRobot v3.0 layout: file paths, feature names, the typed `Episode` and `DatasetInfo`, and
the storage helpers the writer, reader and validator share.

A dataset is a folder (local path or fsspec URI such as `s3://bucket/x` or `memory://x`); see
`robotics_lane.episodes.lerobot_v3` for what each file holds.
"""

from __future__ import annotations

import io
import json
import posixpath
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from workload_runtime.storage import fs_for

CODEBASE_VERSION = "v3.0"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_DIR = "meta/episodes"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH = EPISODES_DIR + "/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
CHUNKS_SIZE = 1000  # files per chunk folder, as LeRobot numbers them
STATE, ACTION, REWARD, DONE, SUCCESS = "observation.state", "action", "next.reward", "next.done", "next.success"
CAMERA_PREFIX = "observation.images."
METADATA_PREFIX = "sinewgrid/"
# LeRobot's DEFAULT_FEATURES: one value per frame, stored as plain scalar columns.
SCALAR_FEATURES = {"timestamp": "float32", "frame_index": "int64", "episode_index": "int64", "index": "int64", "task_index": "int64"}
OPTIONAL_FEATURES: dict[str, str] = {REWARD: "float32", DONE: "bool", SUCCESS: "bool"}
VIDEO_COLUMNS = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")  # episodes table: videos/<key>/<column>


@dataclass
class Episode:
    """One demonstration or rollout: what the robot sensed and did at each control step.

    `observation_state` is (T, D) and `action` is (T, A), both float32, one row per frame
    at the dataset's fps. `reward` is the per-step reward (T,), `success` whether the
    episode reached its goal. `metadata` holds scalar extras (str/int/float/bool) such as
    the seed or a failure mode; None values are not stored. `images` maps each camera
    (`"observation.images.front"`) to its frames, uint8 (T, H, W, 3) RGB, one per row of
    `observation_state`; every episode of a dataset has the same cameras at the same size.
    """

    task: str
    observation_state: np.ndarray
    action: np.ndarray
    reward: np.ndarray | None = None
    success: bool | None = None
    metadata: dict = field(default_factory=dict)
    images: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return int(self.observation_state.shape[0])


@dataclass(frozen=True)
class DatasetInfo:
    """What a dataset's `meta/info.json` and `meta/tasks.parquet` say, typed."""

    fps: int
    robot_type: str
    state_names: list[str]
    action_names: list[str]
    total_episodes: int
    total_frames: int
    tasks: list[str]
    features: dict

    @property
    def cameras(self) -> dict[str, tuple[int, int]]:
        """Each video feature with its (height, width), in info.json's order."""
        return {name: (int(ft["shape"][0]), int(ft["shape"][1])) for name, ft in self.features.items() if ft.get("dtype") == "video"}


def video_file(key: str, episode_index: int) -> tuple[int, int, str]:
    """Where this writer puts an episode's video of camera `key`: one MP4 per episode per camera,
    numbered like LeRobot numbers its files (1000 files per chunk). (chunk, file, relative path)."""
    chunk, file = divmod(int(episode_index), CHUNKS_SIZE)
    return chunk, file, VIDEO_PATH.format(video_key=key, chunk_index=chunk, file_index=file)


# --- storage helpers ----------------------------------------------------------------------


def open_folder(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and root path of a dataset folder URI."""
    fs, root = fs_for(uri)
    return fs, root.rstrip("/") or "/"


def write_bytes(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    with fs.open(path, "wb") as fh:
        fh.write(data)


def table_bytes(table: pa.Table, row_groups: list[int] | None = None) -> bytes:
    """Parquet bytes (snappy); `row_groups` are row counts, one group each (per episode)."""
    sink = io.BytesIO()
    with pq.ParquetWriter(sink, table.schema, compression="snappy") as writer:
        offset = 0
        for n in row_groups or [table.num_rows]:
            writer.write_table(table.slice(offset, n))
            offset += n
    return sink.getvalue()


def read_table(fs: fsspec.AbstractFileSystem, path: str) -> pa.Table:
    """Read one parquet file; raises FileNotFoundError or pyarrow's error as is.

    Local files are read by pyarrow itself (memory-mapped, column chunks in parallel), the
    same way ``pyarrow.parquet.read_table(path)`` reads them; other filesystems through fsspec.
    """
    if isinstance(fs, LocalFileSystem):
        return pq.read_table(path, memory_map=True)
    with fs.open(path, "rb") as fh:
        return pq.read_table(fh)


def read_info_json(fs: fsspec.AbstractFileSystem, root: str) -> dict[str, Any]:
    with fs.open(posixpath.join(root, INFO_PATH), "rb") as fh:
        return json.loads(fh.read().decode("utf-8"))


def read_tasks(fs: fsspec.AbstractFileSystem, root: str) -> dict[int, str]:
    """`task_index -> task` from `meta/tasks.parquet` (task strings are the pandas index, stored as a column `task`)."""
    table = read_table(fs, posixpath.join(root, TASKS_PATH))
    if "task_index" not in table.column_names:
        raise ValueError(f"{TASKS_PATH} has no `task_index` column (found {[c for c in table.column_names if c != 'task']}).")
    tasks = table.column("task").to_pylist() if "task" in table.column_names else list(range(table.num_rows))
    return {int(i): str(t) for t, i in zip(tasks, table.column("task_index").to_pylist(), strict=True)}


def episode_table_paths(fs: fsspec.AbstractFileSystem, root: str) -> list[str]:
    """Every episodes-table file, in chunk/file order."""
    return sorted(fs.glob(posixpath.join(root, EPISODES_DIR, "chunk-*", "file-*.parquet")))


def column_values(table: pa.Table, name: str) -> np.ndarray:
    """A column as numpy: (N,) for scalar columns, (N, K) for list columns of equal length K."""
    col = table.column(name).combine_chunks()
    if pa.types.is_fixed_size_list(col.type):
        return col.flatten().to_numpy(zero_copy_only=False).reshape(len(col), col.type.list_size)
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        widths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        if len(col) and (col.null_count or widths.min() != widths.max()):
            raise ValueError(f"column `{name}` holds lists of different lengths; every frame must have the same width.")
        width = int(widths[0]) if len(col) else 0
        return pc.list_flatten(col).to_numpy(zero_copy_only=False).reshape(len(col), width)
    return col.to_numpy(zero_copy_only=False)


def feature_names(feature: dict, width: int) -> list[str]:
    """Names of a vector feature's dimensions (LeRobot allows a list or `{"axes": [...]}`)."""
    names = feature.get("names")
    if isinstance(names, dict):
        names = next(iter(names.values()), None)
    if isinstance(names, list) and len(names) == width:
        return [str(n) for n in names]
    return [str(i) for i in range(width)]


def info_from_json(info: dict[str, Any], tasks: list[str]) -> DatasetInfo:
    """The typed view of an info.json dict (which must have observation.state and action)."""
    feats = info["features"]
    return DatasetInfo(
        fps=int(info["fps"]),
        robot_type=str(info.get("robot_type") or ""),
        state_names=feature_names(feats[STATE], int(feats[STATE]["shape"][0])),
        action_names=feature_names(feats[ACTION], int(feats[ACTION]["shape"][0])),
        total_episodes=int(info["total_episodes"]),
        total_frames=int(info["total_frames"]),
        tasks=tasks,
        features=feats,
    )
