"""Write episodes as a new LeRobot v3.0 dataset folder (pyarrow for the tables, PyAV for the cameras).

`write_dataset` encodes each episode's cameras as one MP4 per episode per camera
(`videos/<camera>/chunk-000/file-007.mp4` for episode 7: valid v3, where LeRobot's own recorder
appends episodes to a file until it reaches 200 MB; each episode row names its file and its
span in it, here always from 0 s), then writes the tables; `meta/info.json` goes last.
`robotics_lane.episodes.shards` builds the same dataset from per-episode files by copying their
videos, never decoding them; both end in `write_tables`.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa

from robotics_lane.episodes.layout import (
    ACTION,
    CAMERA_PREFIX,
    CHUNKS_SIZE,
    CODEBASE_VERSION,
    DATA_PATH,
    DONE,
    EPISODES_PATH,
    INFO_PATH,
    METADATA_PREFIX,
    OPTIONAL_FEATURES,
    REWARD,
    SCALAR_FEATURES,
    STATE,
    STATS_PATH,
    SUCCESS,
    TASKS_PATH,
    VIDEO_PATH,
    DatasetInfo,
    Episode,
    column_values,
    info_from_json,
    open_folder,
    table_bytes,
    video_file,
    write_bytes,
)
from robotics_lane.episodes.video import encode_video, image_stats, pixel_histogram, video_feature

_QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}


def write_dataset(
    uri: str, episodes: list[Episode], *, fps: int, robot_type: str, state_names: list[str], action_names: list[str]
) -> DatasetInfo:
    """Write `episodes` as a new LeRobot v3.0 dataset folder; `meta/info.json` goes last.

    Episodes are numbered 0..N-1 in list order; tasks are numbered in order of first use. Each
    camera in `Episode.images` becomes a video feature, encoded at `fps` (see
    `robotics_lane.episodes.video` for the codec). Raises FileExistsError if the folder already
    holds a finished dataset (an info.json), ValueError naming the episode for inconsistent input.
    """
    fs, root = start_dataset(uri, episodes, fps=fps, state_names=state_names, action_names=action_names)
    cameras = camera_shapes(episodes)
    histograms = {key: np.zeros((3, 256), np.int64) for key in cameras}
    for i, ep in enumerate(episodes):
        for key in cameras:
            write_bytes(fs, posixpath.join(root, video_file(key, i)[2]), encode_video(ep.images[key], int(fps)))
            histograms[key] += pixel_histogram(ep.images[key])
    return write_tables(fs, root, episodes, cameras, histograms, fps=fps, robot_type=robot_type, state_names=state_names, action_names=action_names)


def start_dataset(
    uri: str, episodes: list[Episode], *, fps: int, state_names: list[str], action_names: list[str]
) -> tuple[fsspec.AbstractFileSystem, str]:
    """Check that `uri` is free and the episodes fit together, before anything is written."""
    fs, root = open_folder(uri)
    if fs.exists(posixpath.join(root, INFO_PATH)):
        raise FileExistsError(f"{uri} already holds a dataset ({INFO_PATH} exists); write to a new folder.")
    if not episodes:
        raise ValueError("write_dataset needs at least one episode.")
    if int(fps) != fps or fps <= 0:
        raise ValueError(f"fps must be a positive whole number (LeRobot stores it as int); got {fps}.")
    _all_or_none(episodes, "reward")
    _all_or_none(episodes, "success")
    for i, ep in enumerate(episodes):
        check_episode(ep, i)
        dims = (np.shape(ep.observation_state)[1], np.shape(ep.action)[1])
        if dims != (len(state_names), len(action_names)):
            names = f"{len(state_names)} state_names and {len(action_names)} action_names"
            raise ValueError(f"episode {i}: state/action widths {dims} do not match the {names}; give one name per dimension.")
    return fs, root


def check_episode(ep: Episode, n: int) -> None:
    """ValueError naming episode `n` when its arrays do not have one row per frame."""
    state, action = np.shape(ep.observation_state), np.shape(ep.action)
    if len(state) != 2 or len(action) != 2 or state[0] != action[0] or state[0] == 0:
        raise ValueError(f"episode {n}: observation_state must be (T, D) and action (T, A) with the same T >= 1; got {state} and {action}.")
    if ep.reward is not None and np.shape(ep.reward) != (state[0],):
        raise ValueError(f"episode {n}: reward must have shape ({state[0]},), one value per frame; got {np.shape(ep.reward)}.")
    for key, frames in ep.images.items():
        if not key.startswith(CAMERA_PREFIX) or "/" in key or key == CAMERA_PREFIX:
            raise ValueError(f"episode {n}: camera {key!r} must be named `{CAMERA_PREFIX}<camera>` (no '/'), e.g. `{CAMERA_PREFIX}front`.")
        shape = np.shape(frames)
        if len(shape) != 4 or shape[0] != state[0] or shape[3] != 3 or getattr(frames, "dtype", None) != np.uint8:
            dtype = getattr(frames, "dtype", type(frames).__name__)
            raise ValueError(
                f"episode {n}: `{key}` must be uint8 RGB frames (T, H, W, 3) with T = {state[0]}, one per row of "
                f"observation_state; got {dtype} {shape}."
            )


def camera_shapes(episodes: list[Episode]) -> dict[str, tuple[int, int]]:
    """Each camera's (height, width); ValueError unless every episode has the same cameras at the same size."""
    first = {key: tuple(np.shape(frames)[1:3]) for key, frames in episodes[0].images.items()}
    for i, ep in enumerate(episodes[1:], start=1):
        if set(ep.images) != set(first):
            raise ValueError(
                f"episode {i} has cameras {sorted(ep.images)} but episode 0 has {sorted(first)}; "
                "every episode of a dataset records the same cameras."
            )
        for key, frames in ep.images.items():
            if tuple(np.shape(frames)[1:3]) != first[key]:
                raise ValueError(
                    f"episode {i}: `{key}` frames are {np.shape(frames)[1]}×{np.shape(frames)[2]} (H×W) but episode 0's are "
                    f"{first[key][0]}×{first[key][1]}; a camera keeps one resolution across the dataset."
                )
    return {key: (int(h), int(w)) for key, (h, w) in first.items()}


def frames_table(ep: Episode, episode_index: int, index_start: int, task_index: int, fps: int) -> pa.Table:
    """One episode's frames, columns in LeRobot's order (user features, then standard ones).
    Cameras are not columns: their frames live in the videos."""
    check_episode(ep, episode_index)
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


def metadata_columns(episodes: list[Episode]) -> dict[str, pa.Array]:
    """The episodes' `metadata` as `sinewgrid/<key>` columns; TypeError for values that cannot be stored."""
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


def write_tables(
    fs: fsspec.AbstractFileSystem,
    root: str,
    episodes: list[Episode],
    cameras: dict[str, tuple[int, int]],
    histograms: dict[str, np.ndarray],
    *,
    fps: int,
    robot_type: str,
    state_names: list[str],
    action_names: list[str],
) -> DatasetInfo:
    """The data file, episodes table, tasks, stats and (last) info.json of episodes whose videos
    (if any: `cameras` with their (H, W), pixel histograms summed over every frame) are in place."""
    tasks = list(dict.fromkeys(ep.task for ep in episodes))
    tables, start = [], 0
    for i, ep in enumerate(episodes):
        tables.append(frames_table(ep, i, start, tasks.index(ep.task), int(fps)))
        start += tables[-1].num_rows
    data = pa.concat_tables(tables)
    features = _features(state_names, action_names, data.column_names, cameras, int(fps))
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
    }
    chunk, file = np.divmod(np.arange(len(episodes), dtype=np.int64), CHUNKS_SIZE)  # as layout.video_file numbers them
    for key in cameras:  # one file per episode, the episode from 0 s to length / fps
        ep_cols |= {
            f"videos/{key}/chunk_index": chunk,
            f"videos/{key}/file_index": file,
            f"videos/{key}/from_timestamp": np.zeros(len(episodes), np.float64),
            f"videos/{key}/to_timestamp": np.asarray(lengths, np.float64) / int(fps),
        }
    ep_cols |= {"meta/episodes/chunk_index": zeros, "meta/episodes/file_index": zeros, **metadata_columns(episodes)}
    tasks_frame = pd.DataFrame({"task_index": range(len(tasks))}, index=pd.Index(tasks, name="task"))
    info = {
        "codebase_version": CODEBASE_VERSION, "robot_type": robot_type,
        "total_episodes": len(episodes), "total_frames": data.num_rows, "total_tasks": len(tasks),
        "chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
        "fps": int(fps), "splits": {"train": f"0:{len(episodes)}"},
        "data_path": DATA_PATH, "video_path": VIDEO_PATH if cameras else None, "features": features,
    }  # fmt: skip
    stats = _stats(data, features) | {key: image_stats(histograms[key], data.num_rows) for key in cameras}
    join = posixpath.join
    write_bytes(fs, join(root, DATA_PATH.format(chunk_index=0, file_index=0)), table_bytes(data, lengths))
    write_bytes(fs, join(root, EPISODES_PATH.format(chunk_index=0, file_index=0)), table_bytes(pa.table(ep_cols)))
    write_bytes(fs, join(root, TASKS_PATH), tasks_frame.to_parquet())
    write_bytes(fs, join(root, STATS_PATH), json.dumps(stats, indent=2).encode())
    write_bytes(fs, join(root, INFO_PATH), json.dumps(info, indent=4).encode())
    return info_from_json(info, tasks)


def _vector_column(values: np.ndarray) -> pa.Array:
    """(T, K) as a fixed-size-list column; K == 1 as a plain scalar column, as LeRobot expects."""
    if values.shape[1] == 1:
        return pa.array(values[:, 0])
    return pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), values.shape[1])


def _features(state_names: list[str], action_names: list[str], columns: list[str], cameras: dict[str, tuple[int, int]], fps: int) -> dict[str, dict]:
    feats: dict[str, dict] = {
        STATE: {"dtype": "float32", "shape": [len(state_names)], "names": list(state_names)},
        ACTION: {"dtype": "float32", "shape": [len(action_names)], "names": list(action_names)},
    }
    feats.update({key: video_feature(h, w, fps) for key, (h, w) in cameras.items()})
    for name, dtype in OPTIONAL_FEATURES.items():
        if name in columns:
            feats[name] = {"dtype": dtype, "shape": [1], "names": None}
    feats.update({name: {"dtype": dtype, "shape": [1], "names": None} for name, dtype in SCALAR_FEATURES.items()})
    return feats


def _stats(table: pa.Table, features: dict[str, dict]) -> dict[str, dict[str, list]]:
    """Dataset-wide normalisation stats of the frame columns in LeRobot's `meta/stats.json` layout."""
    stats: dict[str, dict[str, list]] = {}
    for name, ft in features.items():
        if ft["dtype"] in ("bool", "video"):
            continue
        values = column_values(table, name).astype(np.float64).reshape(table.num_rows, -1)
        entry = {"min": values.min(0), "max": values.max(0), "mean": values.mean(0), "std": values.std(0)}
        entry.update({k: np.quantile(values, q, axis=0) for k, q in _QUANTILES.items()})
        stats[name] = {k: v.tolist() for k, v in entry.items()} | {"count": [table.num_rows]}
    return stats


def _all_or_none(episodes: list[Episode], attr: str) -> None:
    missing = [i for i, ep in enumerate(episodes) if getattr(ep, attr) is None]
    if 0 < len(missing) < len(episodes):
        raise ValueError(f"`{attr}` is set on some episodes but not on episodes {missing[:5]}; set it on all or none.")
