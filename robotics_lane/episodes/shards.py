"""Rollout shards: one file per finished episode, assembled into a dataset at the end.

A shard that may be preempted at any moment commits each finished episode on its own: its
cameras as MP4 files (`episode-000042.observation.images.front.mp4`), then its frames as one
parquet file (`episode-000042.parquet`, the columns of a LeRobot v3 data file, written last).
`assemble_dataset` merges them into one v3.0 dataset folder once every shard is done, copying
each video byte for byte into the dataset (one MP4 per episode per camera, as `write_dataset`
lays them out): nothing is decoded or encoded again, so assembling costs a file copy and the
result equals `write_dataset` on the same episodes, bit for bit (encoding is deterministic).
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass

import numpy as np

from robotics_lane.episodes.layout import DatasetInfo, Episode, open_folder, read_table, table_bytes, video_file, write_bytes
from robotics_lane.episodes.reading import episode_from_frames
from robotics_lane.episodes.video import VideoUnreadable, decode_video, encode_video, pixel_histogram
from robotics_lane.episodes.writing import camera_shapes, check_episode, frames_table, metadata_columns, start_dataset, write_tables
from workload_runtime.storage import fs_for

EPISODE_FILE_METADATA_KEY = b"sinewgrid"


def write_episode_file(uri: str, episode: Episode, episode_index: int, global_index_start: int, task_index: int, fps: int) -> str:
    """Write one finished episode as `<uri>/episode-<episode_index:06d>.parquet`; return its URI.

    The file has the same columns as a v3.0 data file; the episode's metadata rides in the
    parquet schema metadata, with each camera's video file (written first, beside it), frame
    size and pixel histogram. Give it to `assemble_dataset` with the task list that `task_index`
    points into.
    """
    fs, root = open_folder(uri)
    check_episode(episode, episode_index)
    table = frames_table(episode, episode_index, global_index_start, task_index, int(fps))
    metadata_columns([episode])  # same type rules as the dataset's episode table
    meta = {k: v.item() if isinstance(v, np.generic) else v for k, v in episode.metadata.items()}
    stem = f"episode-{episode_index:06d}"
    cameras = {}
    for key, (height, width) in camera_shapes([episode]).items():
        name = f"{stem}.{key}.mp4"
        write_bytes(fs, posixpath.join(root, name), encode_video(episode.images[key], int(fps)))
        cameras[key] = {"file": name, "shape": [height, width, 3], "histogram": pixel_histogram(episode.images[key]).tolist()}
    shard_meta = {"metadata": meta} | ({"fps": int(fps), "cameras": cameras} if cameras else {})
    table = table.replace_schema_metadata({EPISODE_FILE_METADATA_KEY: json.dumps(shard_meta).encode()})
    path = posixpath.join(root, f"{stem}.parquet")
    write_bytes(fs, path, table_bytes(table))
    return fs.unstrip_protocol(path) if "://" in uri else path


@dataclass(frozen=True)
class _ShardVideo:
    path: str  # beside the episode file, on the same filesystem
    height: int
    width: int
    histogram: np.ndarray


def _read_shard(uri: str, tasks: list[str]) -> tuple[Episode, dict[str, _ShardVideo], int]:
    """The episode (no images), its videos and the fps they were encoded at."""
    fs, path = fs_for(uri)
    table = read_table(fs, path)
    task_index = int(table.column("task_index")[0].as_py())
    if not 0 <= task_index < len(tasks):
        raise ValueError(f"{uri}: task_index {task_index} is outside the {len(tasks)} tasks given; pass the task list the shard used.")
    meta = json.loads((table.schema.metadata or {}).get(EPISODE_FILE_METADATA_KEY, b"{}"))
    videos = {
        key: _ShardVideo(posixpath.join(posixpath.dirname(path), cam["file"]), int(cam["shape"][0]), int(cam["shape"][1]), np.asarray(cam["histogram"], np.int64))
        for key, cam in meta.get("cameras", {}).items()
    }
    return episode_from_frames(table, tasks[task_index], meta.get("metadata", {})), videos, int(meta.get("fps", 1))


def read_episode_file(uri: str, tasks: list[str], decode_images: bool = False) -> Episode:
    """One file written by `write_episode_file`, back as an Episode (cameras decoded when asked)."""
    episode, videos, fps = _read_shard(uri, tasks)
    fs, _ = fs_for(uri)
    for key, video in videos.items() if decode_images else ():
        try:
            episode.images[key] = decode_video(fs, video.path, 0.0, episode.length / fps, fps)
        except (FileNotFoundError, VideoUnreadable) as exc:
            raise ValueError(f"{uri}: cannot read its `{key}` video {video.path} ({exc}); rerun the episode.") from exc
    return episode


def assemble_dataset(
    uri: str, episode_files: list[str], tasks: list[str], fps: int, robot_type: str, state_names: list[str], action_names: list[str]
) -> DatasetInfo:
    """Merge per-episode files into one v3.0 dataset folder at `uri`.

    Episodes are renumbered 0..N-1 in the order of `episode_files` (so shards may number
    their episodes independently) and tasks by first use; videos are copied, not re-encoded;
    the result equals `write_dataset` on the same episodes.
    """
    duplicates = sorted({f for f in episode_files if episode_files.count(f) > 1})
    if duplicates:
        raise ValueError(f"episode files listed more than once: {duplicates[:5]}; each finished episode goes in once.")
    shards = [_read_shard(f, tasks) for f in episode_files]
    episodes = [episode for episode, _, _ in shards]
    fs, root = start_dataset(uri, episodes, fps=fps, state_names=state_names, action_names=action_names)
    cameras = {key: (v.height, v.width) for key, v in shards[0][1].items()}
    histograms = {key: np.zeros((3, 256), np.int64) for key in cameras}
    for i, (name, (_, videos, shard_fps)) in enumerate(zip(episode_files, shards, strict=True)):
        if {key: (v.height, v.width) for key, v in videos.items()} != cameras:
            raise ValueError(
                f"{name} has cameras {_sizes(videos)} but {episode_files[0]} has {_sizes(shards[0][1])}; "
                "every episode of a dataset records the same cameras at the same size."
            )
        if videos and shard_fps != int(fps):
            raise ValueError(f"{name}'s videos were encoded at {shard_fps} fps, not the dataset's {fps}; assemble shards of one fps.")
        source_fs, _ = fs_for(name)
        for key, video in videos.items():
            write_bytes(fs, posixpath.join(root, video_file(key, i)[2]), source_fs.cat_file(video.path))
            histograms[key] += video.histogram
    return write_tables(fs, root, episodes, cameras, histograms, fps=fps, robot_type=robot_type, state_names=state_names, action_names=action_names)


def _sizes(videos: dict[str, _ShardVideo]) -> dict[str, str]:
    return {key: f"{v.height}×{v.width}" for key, v in sorted(videos.items())}
