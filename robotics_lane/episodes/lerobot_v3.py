"""Read and write state-only LeRobot v3.0 datasets with pyarrow (no torch, no `lerobot`).

A dataset is a folder (local path or fsspec URI such as `s3://bucket/x` or `memory://x`)::

    meta/info.json                          fps, robot type, features, path templates (written last)
    meta/tasks.parquet                      task strings (pandas index `task`) -> `task_index`
    meta/stats.json                         per-feature min/max/mean/std/count/quantiles
    meta/episodes/chunk-000/file-000.parquet  one row per episode: length, where its frames live
    data/chunk-000/file-000.parquet         one row per frame, one row group per episode

Frames carry `observation.state` (float32 [D]), `action` (float32 [A]), the standard
`timestamp`, `frame_index`, `episode_index`, `index`, `task_index`, and `next.done` (True
on an episode's last frame); `next.reward` and `next.success` appear when the episodes
carry them. Shape-[1] features are plain scalar columns, as LeRobot writes them. Extra
per-episode facts (seed, failure mode, ...) live in the episodes table as `sinewgrid/<key>`
columns; LeRobot ignores them.
"""

from __future__ import annotations

import io
import json
import posixpath
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

CODEBASE_VERSION = "v3.0"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_DIR = "meta/episodes"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH = EPISODES_DIR + "/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
STATE, ACTION, REWARD, DONE, SUCCESS = "observation.state", "action", "next.reward", "next.done", "next.success"
METADATA_PREFIX = "sinewgrid/"
# LeRobot's DEFAULT_FEATURES: one value per frame, stored as plain scalar columns.
SCALAR_FEATURES = {"timestamp": "float32", "frame_index": "int64", "episode_index": "int64", "index": "int64", "task_index": "int64"}
OPTIONAL_FEATURES: dict[str, str] = {REWARD: "float32", DONE: "bool", SUCCESS: "bool"}
_QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}


@dataclass
class Episode:
    """One demonstration or rollout: what the robot sensed and did at each control step.

    `observation_state` is (T, D) and `action` is (T, A), both float32, one row per frame
    at the dataset's fps. `reward` is the per-step reward (T,), `success` whether the
    episode reached its goal. `metadata` holds scalar extras (str/int/float/bool) such as
    the seed or a failure mode; None values are not stored.
    """

    task: str
    observation_state: np.ndarray
    action: np.ndarray
    reward: np.ndarray | None = None
    success: bool | None = None
    metadata: dict = field(default_factory=dict)

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


# --- storage helpers (also used by the validator) ---------------------------------------


def open_folder(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and root path of a dataset folder URI."""
    fs, root = url_to_fs(uri)
    return fs, root.rstrip("/") or "/"


def _write_bytes(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    with fs.open(path, "wb") as fh:
        fh.write(data)


def _table_bytes(table: pa.Table, row_groups: list[int] | None = None) -> bytes:
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


# --- writing ---------------------------------------------------------------------------


def _check_episode(ep: Episode, n: int) -> None:
    state, action = np.shape(ep.observation_state), np.shape(ep.action)
    if len(state) != 2 or len(action) != 2 or state[0] != action[0] or state[0] == 0:
        raise ValueError(f"episode {n}: observation_state must be (T, D) and action (T, A) with the same T >= 1; got {state} and {action}.")
    if ep.reward is not None and np.shape(ep.reward) != (state[0],):
        raise ValueError(f"episode {n}: reward must have shape ({state[0]},), one value per frame; got {np.shape(ep.reward)}.")


def _vector_column(values: np.ndarray) -> pa.Array:
    """(T, K) as a fixed-size-list column; K == 1 as a plain scalar column, as LeRobot expects."""
    if values.shape[1] == 1:
        return pa.array(values[:, 0])
    return pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), values.shape[1])


def _frames_table(ep: Episode, episode_index: int, index_start: int, task_index: int, fps: int) -> pa.Table:
    """One episode's frames, columns in LeRobot's order (user features, then standard ones)."""
    _check_episode(ep, episode_index)
    state = np.ascontiguousarray(ep.observation_state, dtype=np.float32)
    action = np.ascontiguousarray(ep.action, dtype=np.float32)
    t = state.shape[0]
    frame = np.arange(t, dtype=np.int64)
    cols: dict[str, pa.Array] = {STATE: _vector_column(state), ACTION: _vector_column(action)}
    if ep.reward is not None:
        cols[REWARD] = pa.array(np.asarray(ep.reward, dtype=np.float32))
    cols[DONE] = pa.array(frame == t - 1)
    if ep.success is not None:
        cols[SUCCESS] = pa.array((frame == t - 1) & bool(ep.success))
    cols["timestamp"] = pa.array((frame / fps).astype(np.float32))
    cols["frame_index"] = pa.array(frame)
    cols["episode_index"] = pa.array(np.full(t, episode_index, dtype=np.int64))
    cols["index"] = pa.array(frame + index_start)
    cols["task_index"] = pa.array(np.full(t, task_index, dtype=np.int64))
    return pa.table(cols)


def _features(state_names: list[str], action_names: list[str], columns: list[str]) -> dict[str, dict]:
    feats: dict[str, dict] = {
        STATE: {"dtype": "float32", "shape": [len(state_names)], "names": list(state_names)},
        ACTION: {"dtype": "float32", "shape": [len(action_names)], "names": list(action_names)},
    }
    for name, dtype in OPTIONAL_FEATURES.items():
        if name in columns:
            feats[name] = {"dtype": dtype, "shape": [1], "names": None}
    feats.update({name: {"dtype": dtype, "shape": [1], "names": None} for name, dtype in SCALAR_FEATURES.items()})
    return feats


def _stats(table: pa.Table, features: dict[str, dict]) -> dict[str, dict[str, list]]:
    """Dataset-wide normalisation stats in LeRobot's `meta/stats.json` layout."""
    stats: dict[str, dict[str, list]] = {}
    for name, ft in features.items():
        if ft["dtype"] == "bool":
            continue
        values = column_values(table, name).astype(np.float64).reshape(table.num_rows, -1)
        entry = {"min": values.min(0), "max": values.max(0), "mean": values.mean(0), "std": values.std(0)}
        entry.update({k: np.quantile(values, q, axis=0) for k, q in _QUANTILES.items()})
        stats[name] = {k: v.tolist() for k, v in entry.items()} | {"count": [table.num_rows]}
    return stats


def _metadata_columns(episodes: list[Episode]) -> dict[str, pa.Array]:
    keys = sorted({k for ep in episodes for k in ep.metadata})
    cols: dict[str, pa.Array] = {}
    for key in keys:
        values = [ep.metadata.get(key) for ep in episodes]
        values = [v.item() if isinstance(v, np.generic) else v for v in values]
        bad = [v for v in values if v is not None and not isinstance(v, str | int | float | bool)]
        if bad:
            raise TypeError(f"metadata[{key!r}] = {bad[0]!r}: only str, int, float and bool values are stored; flatten it.")
        try:
            cols[METADATA_PREFIX + key] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise TypeError(f"metadata[{key!r}] mixes types across episodes ({exc}); use one type per key.") from exc
    return cols


def _all_or_none(episodes: list[Episode], attr: str) -> None:
    missing = [i for i, ep in enumerate(episodes) if getattr(ep, attr) is None]
    if 0 < len(missing) < len(episodes):
        raise ValueError(f"`{attr}` is set on some episodes but not on episodes {missing[:5]}; set it on all or none.")


def write_dataset(
    uri: str, episodes: list[Episode], *, fps: int, robot_type: str, state_names: list[str], action_names: list[str]
) -> DatasetInfo:
    """Write `episodes` as a new LeRobot v3.0 dataset folder; `meta/info.json` goes last.

    Episodes are numbered 0..N-1 in list order; tasks are numbered in order of first use.
    Raises FileExistsError if the folder already holds a finished dataset (an info.json).
    """
    fs, root = open_folder(uri)
    if fs.exists(posixpath.join(root, INFO_PATH)):
        raise FileExistsError(f"{uri} already holds a dataset ({INFO_PATH} exists); write to a new folder.")
    if not episodes:
        raise ValueError("write_dataset needs at least one episode.")
    if int(fps) != fps or fps <= 0:
        raise ValueError(f"fps must be a positive whole number (LeRobot stores it as int); got {fps}.")
    _all_or_none(episodes, "reward")
    _all_or_none(episodes, "success")
    tasks = list(dict.fromkeys(ep.task for ep in episodes))
    tables, start = [], 0
    for i, ep in enumerate(episodes):
        _check_episode(ep, i)
        dims = (np.shape(ep.observation_state)[1], np.shape(ep.action)[1])
        if dims != (len(state_names), len(action_names)):
            names = f"{len(state_names)} state_names and {len(action_names)} action_names"
            raise ValueError(f"episode {i}: state/action widths {dims} do not match the {names}; give one name per dimension.")
        tables.append(_frames_table(ep, i, start, tasks.index(ep.task), int(fps)))
        start += tables[-1].num_rows
    data = pa.concat_tables(tables)
    features = _features(state_names, action_names, data.column_names)
    lengths = [t.num_rows for t in tables]
    ends, zeros = np.cumsum(lengths), np.zeros(len(episodes), np.int64)
    ep_cols: dict[str, Any] = {  # LeRobot's column order; all frames live in chunk 0, file 0
        "episode_index": np.arange(len(episodes), dtype=np.int64),
        "tasks": pa.array([[ep.task] for ep in episodes], pa.list_(pa.string())),
        "length": np.asarray(lengths, np.int64),
        "data/chunk_index": zeros,
        "data/file_index": zeros,
        "dataset_from_index": ends - lengths,
        "dataset_to_index": ends,
        "meta/episodes/chunk_index": zeros,
        "meta/episodes/file_index": zeros,
        **_metadata_columns(episodes),
    }
    tasks_frame = pd.DataFrame({"task_index": range(len(tasks))}, index=pd.Index(tasks, name="task"))
    info = {
        "codebase_version": CODEBASE_VERSION, "robot_type": robot_type,
        "total_episodes": len(episodes), "total_frames": data.num_rows, "total_tasks": len(tasks),
        "chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
        "fps": int(fps), "splits": {"train": f"0:{len(episodes)}"},
        "data_path": DATA_PATH, "video_path": None, "features": features,
    }  # fmt: skip
    join = posixpath.join
    _write_bytes(fs, join(root, DATA_PATH.format(chunk_index=0, file_index=0)), _table_bytes(data, lengths))
    _write_bytes(fs, join(root, EPISODES_PATH.format(chunk_index=0, file_index=0)), _table_bytes(pa.table(ep_cols)))
    _write_bytes(fs, join(root, TASKS_PATH), tasks_frame.to_parquet())
    _write_bytes(fs, join(root, STATS_PATH), json.dumps(_stats(data, features), indent=2).encode())
    _write_bytes(fs, join(root, INFO_PATH), json.dumps(info, indent=4).encode())
    return info_from_json(info, tasks)


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


# --- reading ---------------------------------------------------------------------------


def read_dataset(uri: str) -> tuple[DatasetInfo, list[Episode]]:
    """Every episode of a v3.0 dataset (ours or LeRobot's), in `episode_index` order.

    An episode's task is the task of its first frame. Raises ValueError naming the file
    when the dataset is not a readable state-only v3.0 dataset; run `validate_dataset`
    for a full list of problems.
    """
    fs, root = open_folder(uri)
    info = read_info_json(fs, root)
    if info.get("codebase_version") != CODEBASE_VERSION:
        version = info.get("codebase_version")
        raise ValueError(f"{uri}/{INFO_PATH}: codebase_version is {version!r}, not {CODEBASE_VERSION!r}; convert it with LeRobot's v3.0 converter.")
    if not {STATE, ACTION} <= set(info.get("features", {})):
        raise ValueError(f"{uri}/{INFO_PATH}: features lack observation.state or action; this reader needs both.")
    task_by_index = read_tasks(fs, root)
    paths = episode_table_paths(fs, root)
    if not paths:
        raise FileNotFoundError(f"{uri}: no {EPISODES_DIR}/chunk-*/file-*.parquet; the dataset has no episode table.")
    ep_table = pa.concat_tables([read_table(fs, p) for p in paths], promote_options="permissive").sort_by("episode_index").to_pylist()
    data_path = info.get("data_path", DATA_PATH)
    files: dict[tuple[int, int], _FileFrames] = {}
    episodes: list[Episode] = []
    for row in ep_table:
        key = (int(row["data/chunk_index"]), int(row["data/file_index"]))
        rel = data_path.format(chunk_index=key[0], file_index=key[1])
        if key not in files:
            files[key] = _FileFrames(read_table(fs, posixpath.join(root, rel)))
        span = files[key].where.get(int(row["episode_index"]))
        if span is None:
            raise ValueError(f"{uri}: episode {row['episode_index']} has no frames in {rel}, where the episode table points.")
        task = task_by_index.get(int(files[key].columns["task_index"][span[0]]), (row.get("tasks") or [""])[0])
        metadata = {k[len(METADATA_PREFIX) :]: v for k, v in row.items() if k.startswith(METADATA_PREFIX) and v is not None}
        episodes.append(files[key].episode(span, task, metadata))
    tasks = [task_by_index[i] for i in sorted(task_by_index)]
    return info_from_json(info, tasks), episodes


class _FileFrames:
    """One data file's columns as numpy, grouped by episode once (not filtered again per episode)."""

    def __init__(self, table: pa.Table) -> None:
        names = [n for n in (STATE, ACTION, REWARD, SUCCESS, "task_index", "episode_index") if n in table.column_names]
        self.columns = {name: column_values(table, name) for name in names}
        episode = self.columns.get("episode_index", np.zeros(table.num_rows, dtype=np.int64))
        if not np.all(episode[1:] >= episode[:-1]):  # group the frames, each episode's in file order
            order = np.argsort(episode, kind="stable")
            self.columns, episode = {name: values[order] for name, values in self.columns.items()}, episode[order]
        ids, starts, counts = np.unique(episode, return_index=True, return_counts=True)
        self.where = {int(i): (int(a), int(a + n)) for i, a, n in zip(ids, starts, counts, strict=True)}

    def episode(self, span: tuple[int, int], task: str, metadata: dict) -> Episode:
        """The frames in ``span`` as an Episode (its arrays are views of the file's columns)."""
        part = {name: values[span[0] : span[1]] for name, values in self.columns.items()}
        matrix = {name: part[name].astype(np.float32, copy=False).reshape(span[1] - span[0], -1) for name in (STATE, ACTION, REWARD) if name in part}
        return Episode(
            task=task,
            observation_state=matrix[STATE],
            action=matrix[ACTION],
            reward=matrix[REWARD][:, 0] if REWARD in matrix else None,
            success=bool(part[SUCCESS][-1]) if SUCCESS in part else None,
            metadata=metadata,
        )


def _episode_from_frames(frames: pa.Table, task: str, metadata: dict) -> Episode:
    """One episode from a table holding only its frames (a file written by `write_episode_file`)."""
    return _FileFrames(frames).episode((0, frames.num_rows), task, metadata)


def dataset_files(uri: str) -> list[str]:
    """Relative POSIX paths of every file under the dataset folder, sorted.

    A top-level `manifest.json` is left out: a drop manifest lists the files beside it,
    never itself.
    """
    fs, root = open_folder(uri)
    paths = [posixpath.relpath(p, root) for p in fs.find(root)]
    return sorted(p for p in paths if p != "manifest.json")
