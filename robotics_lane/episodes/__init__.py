"""Robot episodes as LeRobot v3.0 datasets: reading, writing and checking them.

`lerobot_v3` reads and writes datasets that LeRobot's own `LeRobotDataset` opens, cameras
included (MP4 video per episode per camera, `video`); `validation` lists everything wrong with a
dataset folder (a teleop drop, a rollout shard) as `DropIssue`s that say which episode, frame,
feature or video to fix; `shards` commits one file per finished episode (and its videos) and
assembles them into a dataset without re-encoding.
"""

from robotics_lane.episodes.lerobot_v3 import DatasetInfo, Episode, dataset_files, read_dataset, write_dataset
from robotics_lane.episodes.shards import assemble_dataset, read_episode_file, write_episode_file
from robotics_lane.episodes.validation import validate_dataset

__all__ = [
    "DatasetInfo",
    "Episode",
    "assemble_dataset",
    "dataset_files",
    "read_dataset",
    "read_episode_file",
    "validate_dataset",
    "write_dataset",
    "write_episode_file",
]
