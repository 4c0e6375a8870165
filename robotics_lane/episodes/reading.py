"""Read a LeRobot v3.0 dataset (ours or LeRobot's) back as `Episode`s, cameras decoded on request."""

from __future__ import annotations

import posixpath

import numpy as np
import pyarrow as pa

from robotics_lane.episodes.layout import (
    ACTION,
    CODEBASE_VERSION,
    DATA_PATH,
    EPISODES_DIR,
    INFO_PATH,
    METADATA_PREFIX,
    REWARD,
    STATE,
    SUCCESS,
    DatasetInfo,
    Episode,
    column_values,
    episode_table_paths,
    info_from_json,
    open_folder,
    read_info_json,
    read_table,
    read_tasks,
)
from robotics_lane.episodes.video import VideoUnreadable, decode_video


def read_dataset(uri: str, decode_images: bool = False) -> tuple[DatasetInfo, list[Episode]]:
    """Every episode of a v3.0 dataset (ours or LeRobot's), in `episode_index` order.

    An episode's task is the task of its first frame. With `decode_images`, each episode's
    `images` holds every camera's frames decoded from its video (uint8 (T, H, W, 3) RGB, one
    per frame); without it, `images` is empty and no video is opened. Raises ValueError naming
    the file when the dataset is not readable; run `validate_dataset` for a full list of problems.
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
    cameras = [name for name, ft in info["features"].items() if ft.get("dtype") == "video"] if decode_images else []
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
        episode = files[key].episode(span, task, metadata)
        episode.images = {camera: _camera_frames(uri, fs, root, info, row, camera, episode.length) for camera in cameras}
        episodes.append(episode)
    tasks = [task_by_index[i] for i in sorted(task_by_index)]
    return info_from_json(info, tasks), episodes


def _camera_frames(uri: str, fs, root: str, info: dict, row: dict, camera: str, length: int) -> np.ndarray:
    """One episode's frames of one camera, from where its row in the episodes table points."""
    columns = {c: row.get(f"videos/{camera}/{c}") for c in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")}
    if not info.get("video_path") or any(v is None for v in columns.values()):
        raise ValueError(f"{uri}: episode {row['episode_index']} has no video location for `{camera}` (info.json video_path, videos/{camera}/* columns).")
    rel = info["video_path"].format(video_key=camera, chunk_index=int(columns["chunk_index"]), file_index=int(columns["file_index"]))
    try:
        frames = decode_video(fs, posixpath.join(root, rel), float(columns["from_timestamp"]), float(columns["to_timestamp"]), int(info["fps"]))
    except (FileNotFoundError, VideoUnreadable) as exc:
        raise ValueError(f"{uri}/{rel}: cannot read episode {row['episode_index']}'s `{camera}` frames ({exc}); run validate_dataset.") from exc
    if len(frames) != length:
        raise ValueError(
            f"{uri}/{rel}: {len(frames)} frames of `{camera}` in episode {row['episode_index']}'s span, but the episode has {length}; "
            "run validate_dataset."
        )
    return frames


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


def episode_from_frames(frames: pa.Table, task: str, metadata: dict) -> Episode:
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
