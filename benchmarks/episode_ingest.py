"""Figure 4: episode ingest throughput (frames per second).

What the teleop asset (``robotics_lane/defs/assets/teleop.py``) does with each session's dataset,
``robotics_lane.episodes.validation.validate_dataset(uri)``, and what training does with it,
``robotics_lane.episodes.lerobot_v3.read_dataset(uri)`` (every episode as numpy arrays), are each
timed against a plain ``pyarrow.parquet.read_table`` of the parquet files they read: the data
file (``data/chunk-000/file-000.parquet``, every frame), the episodes table
(``meta/episodes/chunk-000/file-000.parquet``) and the task table (``meta/tasks.parquet``).
Both together (validate, then read: two reads of the same files) are timed as well.

The datasets are written once with ``write_dataset`` (LeRobot v3.0, cart-pole layout: 4 state
values, 1 action, reward, success) into a local temporary folder, outside the timings; both
sides read the same files from the OS page cache. Episodes are synthetic but shaped like
rollouts (fixed seed): smooth random-walk states, actions in [-1, 1], reward 1 per frame.
Before timing, the benchmark checks that the validator finds no issue, that ``read_dataset``
returns every episode equal to what was written and that the plain read sees every frame, so
a fast rejection can never be measured by mistake.

Throughput is frames (rows of the data file) ÷ median seconds, for every column. The writer puts
one parquet row group per episode (as LeRobot does), so the plain read pays per row group too.
"""

from __future__ import annotations

import posixpath
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from benchmarks import REPEATS, Timing, time_group
from robotics_lane.episodes.lerobot_v3 import (
    DATA_PATH,
    EPISODES_PATH,
    TASKS_PATH,
    Episode,
    read_dataset,
    write_dataset,
)
from robotics_lane.episodes.validation import validate_dataset
from robotics_lane.sim.base import ACTION_NAMES, STATE_NAMES

SEED = 20240601
FPS = 25
FRAMES_PER_EPISODE = 200
EPISODE_COUNTS = (10, 200, 2000)
TASK = "balance the pole"


@dataclass
class IngestCase:
    name: str
    uri: str
    episodes: list[Episode]
    frames: int
    files: list[
        str
    ]  # the parquet files the baseline reads (data, episodes table, tasks)
    file_bytes: int  # their total size on disk


@dataclass
class IngestResult:
    case: IngestCase
    validate: Timing
    read: Timing
    both: Timing
    plain_read: Timing

    def frames_per_s(self, timing: Timing) -> float:
        return self.case.frames / timing.median

    def throughput_ratio(self, timing: Timing) -> float:
        """Frames/s of ``timing`` ÷ frames/s of the plain read (1.0 = as fast as reading the files)."""
        return self.plain_read.median / timing.median

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.case.name,
            "episodes": len(self.case.episodes),
            "frames_per_episode": FRAMES_PER_EPISODE,
            "frames": self.case.frames,
            "fps": FPS,
            "parquet_files": [
                posixpath.relpath(f, self.case.uri) for f in self.case.files
            ],
            "parquet_bytes": self.case.file_bytes,
            **{
                key: {
                    "function": function,
                    "frames_per_s": self.frames_per_s(timing),
                    "throughput_ratio_over_baseline": self.throughput_ratio(timing),
                    **timing.to_dict(),
                }
                for key, function, timing in (
                    ("validate", "validate_dataset(uri)", self.validate),
                    ("read", "read_dataset(uri)", self.read),
                    (
                        "validate_and_read",
                        "validate_dataset(uri) + read_dataset(uri)",
                        self.both,
                    ),
                )
            },
            "baseline": {
                "function": "pyarrow.parquet.read_table of the data, episodes and tasks files",
                "frames_per_s": self.frames_per_s(self.plain_read),
                **self.plain_read.to_dict(),
            },
        }


def synthetic_episodes(count: int, rng: np.random.Generator) -> list[Episode]:
    """``count`` cart-pole-shaped episodes of ``FRAMES_PER_EPISODE`` frames each."""
    episodes = []
    for _ in range(count):
        steps = rng.normal(0.0, 0.01, size=(FRAMES_PER_EPISODE, len(STATE_NAMES)))
        state = (
            np.cumsum(steps, axis=0) + rng.normal(0.0, 0.05, size=len(STATE_NAMES))
        ).astype(np.float32)
        action = rng.uniform(
            -1.0, 1.0, size=(FRAMES_PER_EPISODE, len(ACTION_NAMES))
        ).astype(np.float32)
        episodes.append(
            Episode(
                task=TASK,
                observation_state=state,
                action=action,
                reward=np.ones(FRAMES_PER_EPISODE, dtype=np.float32),
                success=True,
                metadata={},
            )
        )
    return episodes


def build_cases(root: Path) -> list[IngestCase]:
    rng = np.random.default_rng(SEED)
    cases = []
    for count in EPISODE_COUNTS:
        uri = str(root / f"session-{count}")
        episodes = synthetic_episodes(count, rng)
        write_dataset(
            uri,
            episodes,
            fps=FPS,
            robot_type="cartpole",
            state_names=STATE_NAMES,
            action_names=ACTION_NAMES,
        )
        files = [
            posixpath.join(uri, DATA_PATH.format(chunk_index=0, file_index=0)),
            posixpath.join(uri, EPISODES_PATH.format(chunk_index=0, file_index=0)),
            posixpath.join(uri, TASKS_PATH),
        ]
        name = f"{count} episodes × {FRAMES_PER_EPISODE} frames"
        size = sum(Path(f).stat().st_size for f in files)
        cases.append(
            IngestCase(name, uri, episodes, count * FRAMES_PER_EPISODE, files, size)
        )
    return cases


def _ingest(uri: str) -> None:
    validate_dataset(uri)
    read_dataset(uri)


def _plain_read(files: list[str]) -> None:
    for f in files:
        pq.read_table(f)


def _require_happy_path(case: IngestCase) -> None:
    """The dataset must validate clean and read back whole, or the figure is meaningless."""
    info, issues = validate_dataset(case.uri)
    if issues or info is None:
        listing = "\n".join(i.describe() for i in issues[:10])
        raise RuntimeError(
            f"benchmark dataset '{case.name}' is not valid; the validator found {len(issues)} issue(s):\n{listing}"
        )
    info, episodes = read_dataset(case.uri)
    if info.total_frames != case.frames or len(episodes) != len(case.episodes):
        raise RuntimeError(
            f"read_dataset returned {len(episodes)} episodes / {info.total_frames} frames for '{case.name}'"
        )
    for got, want in zip(episodes, case.episodes):
        if not (
            np.array_equal(got.observation_state, want.observation_state)
            and np.array_equal(got.action, want.action)
        ):
            raise RuntimeError(
                f"'{case.name}': an episode read back differs from the one written"
            )
    rows = pq.read_table(case.files[0]).num_rows
    if rows != case.frames:
        raise RuntimeError(
            f"pyarrow read {rows} frames from the data file of '{case.name}', expected {case.frames}"
        )


def run(repeats: int = REPEATS) -> list[IngestResult]:
    root = Path(tempfile.mkdtemp(prefix="sinewgrid-bench-ingest-"))
    results = []
    try:
        for case in build_cases(root):
            _require_happy_path(case)
            validate, read, both, plain = time_group(
                [
                    lambda uri=case.uri: validate_dataset(uri),
                    lambda uri=case.uri: read_dataset(uri),
                    lambda uri=case.uri: _ingest(uri),
                    lambda files=case.files: _plain_read(files),
                ],
                repeats=repeats,
            )
            results.append(IngestResult(case, validate, read, both, plain))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results
