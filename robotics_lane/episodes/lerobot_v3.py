"""Read and write LeRobot v3.0 datasets with pyarrow and PyAV (no torch, no `lerobot`).

A dataset is a folder (local path or fsspec URI such as `s3://bucket/x` or `memory://x`)::

    meta/info.json                          fps, robot type, features, path templates (written last)
    meta/tasks.parquet                      task strings (pandas index `task`) -> `task_index`
    meta/stats.json                         per-feature min/max/mean/std/count/quantiles
    meta/episodes/chunk-000/file-000.parquet  one row per episode: length, where its frames live
    data/chunk-000/file-000.parquet         one row per frame, one row group per episode
    videos/<camera>/chunk-000/file-007.mp4  camera frames of episode 7 (only with cameras)

Frames carry `observation.state` (float32 [D]), `action` (float32 [A]), the standard
`timestamp`, `frame_index`, `episode_index`, `index`, `task_index`, and `next.done` (True
on an episode's last frame); `next.reward` and `next.success` appear when the episodes
carry them. Shape-[1] features are plain scalar columns, as LeRobot writes them. Extra
per-episode facts (seed, failure mode, ...) live in the episodes table as `sinewgrid/<key>`
columns; LeRobot ignores them.

Cameras (`observation.images.<name>`) are video features: `dtype` "video", `shape` [H, W, 3],
an `info` block with the stream's codec, pixel format and fps, and `video_path` in info.json.
Each episode row says where its frames are: `videos/<camera>/chunk_index`, `file_index`,
`from_timestamp` and `to_timestamp` (seconds). Image stats (per channel, values in [0, 1]) are
in `meta/stats.json`. The codec and why: `robotics_lane.episodes.video`.

This module is the public face; the code lives in `layout` (paths, `Episode`, `DatasetInfo`,
storage helpers), `writing`, `reading` and `video`.
"""

from robotics_lane.episodes.layout import (
    ACTION,
    CAMERA_PREFIX,
    CODEBASE_VERSION,
    DATA_PATH,
    DONE,
    EPISODES_DIR,
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
)
from robotics_lane.episodes.reading import dataset_files, read_dataset
from robotics_lane.episodes.writing import write_dataset

__all__ = [
    "ACTION",
    "CAMERA_PREFIX",
    "CODEBASE_VERSION",
    "DATA_PATH",
    "DONE",
    "EPISODES_DIR",
    "EPISODES_PATH",
    "INFO_PATH",
    "METADATA_PREFIX",
    "OPTIONAL_FEATURES",
    "REWARD",
    "SCALAR_FEATURES",
    "STATE",
    "STATS_PATH",
    "SUCCESS",
    "TASKS_PATH",
    "VIDEO_PATH",
    "DatasetInfo",
    "Episode",
    "dataset_files",
    "read_dataset",
    "write_dataset",
]
