"""Figure 11: ingest of camera episodes (video frames per second) against a plain PyAV decode.

What the teleop asset (``robotics_lane/defs/assets/teleop.py``) does with a session that has
cameras, ``validate_dataset(uri)``, decodes every frame of every MP4 file of the dataset (threaded,
never converted to RGB: the `video` rule needs each frame's presentation time) besides checking
the parquet files. Its baseline is a **plain PyAV decode of the same MP4 files**: open each file,
``thread_type = "AUTO"``, decode every frame, count it. What training with cameras does,
``read_dataset(uri, decode_images=True)`` (every camera frame as uint8 RGB numpy), is timed against
the same plain decode with ``frame.to_ndarray(format="rgb24")`` for each frame. All four alternate
in one group (``time_group``), in the same run, on the same files.

The datasets are written once with ``write_dataset`` (LeRobot v3.0, AV1 at LeRobot's settings, one
MP4 per episode per camera, 25 fps) into a local temporary folder, outside the timings; every
column reads from the OS page cache. Frames are synthetic (a sliding gradient and box, fixed seed),
sized like the MuJoCo cameras the rollouts render (96×96, 96×128). Before timing, the benchmark
checks that the validator finds no issue, that ``read_dataset`` returns every camera frame and
that the plain decode sees them all, so a fast rejection can never be measured by mistake.

Throughput is camera frames (episodes × frames × cameras) ÷ median seconds, for every column.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np
from rich.table import Table

from benchmarks import REPEATS, Timing, time_group
from robotics_lane.episodes.lerobot_v3 import Episode, read_dataset, write_dataset
from robotics_lane.episodes.validation import validate_dataset

SEED = 20261202
FPS = 25
FRAMES_PER_EPISODE = 200
CASES = ((10, {"observation.images.front": (96, 96)}), (20, {"observation.images.front": (96, 96), "observation.images.wrist": (96, 128)}))


@dataclass
class CameraCase:
    name: str
    uri: str
    episodes: int
    cameras: dict[str, tuple[int, int]]
    videos: list[str]  # every MP4 file of the dataset
    video_bytes: int

    @property
    def frames(self) -> int:
        """Camera frames: what every column decodes."""
        return self.episodes * FRAMES_PER_EPISODE * len(self.cameras)


@dataclass
class CameraResult:
    case: CameraCase
    validate: Timing
    read: Timing
    decode: Timing
    decode_rgb: Timing

    def to_dict(self) -> dict[str, Any]:
        def column(function: str, timing: Timing, baseline: Timing | None) -> dict[str, Any]:
            ratio = {"throughput_ratio_over_baseline": baseline.median / timing.median} if baseline else {}
            return {"function": function, "frames_per_s": self.case.frames / timing.median, **ratio, **timing.to_dict()}

        return {
            "case": self.case.name,
            "episodes": self.case.episodes,
            "frames_per_episode": FRAMES_PER_EPISODE,
            "cameras": {key: list(size) for key, size in self.case.cameras.items()},
            "camera_frames": self.case.frames,
            "fps": FPS,
            "video_files": len(self.case.videos),
            "video_bytes": self.case.video_bytes,
            "validate": column("validate_dataset(uri)", self.validate, self.decode),
            "read_decoded": column("read_dataset(uri, decode_images=True)", self.read, self.decode_rgb),
            "baseline": column("PyAV: decode every frame of every MP4 file (thread_type AUTO)", self.decode, None),
            "baseline_rgb": column("PyAV: the same, each frame to_ndarray(format='rgb24')", self.decode_rgb, None),
        }


def synthetic_frames(length: int, height: int, width: int, phase: int) -> np.ndarray:
    t = np.arange(length)[:, None, None]
    y, x = np.mgrid[:height, :width]
    frames = np.empty((length, height, width, 3), np.uint8)
    frames[..., 0], frames[..., 1], frames[..., 2] = (2 * x + 3 * t + phase) % 256, (2 * y + phase) % 256, 60
    for k in range(length):
        top = (2 * k + phase) % (height - 16)
        frames[k, top : top + 16, 8:24] = 255
    return frames


def build_cases(root: Path) -> list[CameraCase]:
    rng = np.random.default_rng(SEED)
    cases = []
    for count, cameras in CASES:
        uri = str(root / f"session-{count}x{len(cameras)}")
        episodes = [
            Episode(
                task="stack the cube",
                observation_state=rng.normal(size=(FRAMES_PER_EPISODE, 4)).astype(np.float32),
                action=rng.uniform(-1, 1, size=(FRAMES_PER_EPISODE, 1)).astype(np.float32),
                images={key: synthetic_frames(FRAMES_PER_EPISODE, h, w, phase=int(rng.integers(256))) for key, (h, w) in cameras.items()},
            )
            for _ in range(count)
        ]
        write_dataset(uri, episodes, fps=FPS, robot_type="arm", state_names=["a", "b", "c", "d"], action_names=["f"])
        videos = sorted(str(p) for p in Path(uri, "videos").rglob("*.mp4"))
        sizes = " + ".join(f"{h}×{w}" for h, w in cameras.values())
        name = f"{count} episodes × {FRAMES_PER_EPISODE} frames × {len(cameras)} camera{'s' if len(cameras) > 1 else ''} ({sizes})"
        cases.append(CameraCase(name, uri, count, dict(cameras), videos, sum(Path(v).stat().st_size for v in videos)))
    return cases


def plain_decode(videos: list[str], rgb: bool = False) -> int:
    """Decode every frame of every file with PyAV, threaded; the number of frames."""
    frames = 0
    for path in videos:
        with av.open(path) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for frame in container.decode(stream):
                if rgb:
                    frame.to_ndarray(format="rgb24")
                frames += 1
    return frames


def _require_happy_path(case: CameraCase) -> None:
    """Every column must see every frame of a valid dataset, or the figure is meaningless."""
    info, issues = validate_dataset(case.uri)
    if issues or info is None:
        listing = "\n".join(i.describe() for i in issues[:10])
        raise RuntimeError(f"benchmark dataset '{case.name}' is not valid; the validator found {len(issues)} issue(s):\n{listing}")
    _, episodes = read_dataset(case.uri, decode_images=True)
    decoded = sum(len(frames) for ep in episodes for frames in ep.images.values())
    for got, what in ((decoded, "read_dataset(decode_images=True)"), (plain_decode(case.videos), "the plain PyAV decode")):
        if got != case.frames:
            raise RuntimeError(f"{what} saw {got} camera frames of '{case.name}', expected {case.frames}")


def run(repeats: int = REPEATS) -> list[CameraResult]:
    root = Path(tempfile.mkdtemp(prefix="sinewgrid-bench-camera-"))
    results = []
    try:
        for case in build_cases(root):
            _require_happy_path(case)
            validate, read, decode, decode_rgb = time_group(
                [
                    lambda uri=case.uri: validate_dataset(uri),
                    lambda uri=case.uri: read_dataset(uri, decode_images=True),
                    lambda videos=case.videos: plain_decode(videos),
                    lambda videos=case.videos: plain_decode(videos, rgb=True),
                ],
                repeats=repeats,
            )
            results.append(CameraResult(case, validate, read, decode, decode_rgb))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results


def table(results: list[CameraResult], repeats: int) -> Table:
    out = Table(
        title="11. Camera episode ingest: validate_dataset vs a plain PyAV decode of the same MP4 files (read_dataset decoded vs decode + RGB)",
        caption=(
            f"Median of {repeats} repeats, the four alternating (time.perf_counter). Frames/s = camera frames (episodes × "
            f"{FRAMES_PER_EPISODE} × cameras) ÷ seconds. × decode = validate's frames/s ÷ the plain decode's (1.0 = validating "
            "a camera session costs no more than decoding its videos once); × RGB = read_dataset(decode_images=True)'s ÷ the "
            "plain decode's with to_ndarray('rgb24'). AV1 at LeRobot's settings, one MP4 per episode per camera, 25 fps."
        ),
        title_justify="left",
        caption_justify="left",
    )
    for column in ("Case", "Frames", "Video KB", "Validate ms", "Validate frames/s", "Decode ms", "Decode frames/s", "× decode",
                   "Read RGB ms", "Decode+RGB ms", "× RGB"):  # fmt: skip
        out.add_column(column, justify="left" if column == "Case" else "right", style="bold" if column.startswith("×") else None)
    for r in results:
        frames = r.case.frames
        out.add_row(
            r.case.name, f"{frames:,}", f"{r.case.video_bytes / 1000:,.0f}",
            f"{r.validate.median * 1e3:,.1f}", f"{frames / r.validate.median:,.0f}",
            f"{r.decode.median * 1e3:,.1f}", f"{frames / r.decode.median:,.0f}", f"{r.decode.median / r.validate.median:.2f}×",
            f"{r.read.median * 1e3:,.1f}", f"{r.decode_rgb.median * 1e3:,.1f}", f"{r.decode_rgb.median / r.read.median:.2f}×",
        )  # fmt: skip
    return out


def main(repeats: int = REPEATS) -> None:
    from rich.console import Console

    Console(width=200).print(table(run(repeats), repeats))


if __name__ == "__main__":
    main()
