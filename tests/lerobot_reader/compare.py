"""Hold what LeRobot's reader sees (check_dataset.py's dumps) against what our reader returns.

Our side is `robotics_lane.episodes.read_dataset`: its episodes give each frame's
`observation.state`, `action`, `task`, reward and success, and the v3 contract gives the rest
(frames numbered 0..T-1 in each episode, episodes 0..E-1, `index` 0..N-1 across the dataset,
`timestamp` = frame_index / fps). Video features (`dtype: video` in info.json) are compared frame by
frame with our own decode, within `IMAGE_TOLERANCE` (two builds of FFmpeg may round the YUV to RGB
conversion differently by a level).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from robotics_lane.episodes import read_dataset

REPO = Path(__file__).resolve().parents[2]
CHECKER = REPO / "tests" / "lerobot_reader" / "check_dataset.py"
ADD_CAMERA = REPO / "tests" / "lerobot_reader" / "add_camera.py"
# `make test` names the runtime's interpreter here, and then the tests must run (never skip).
RUNTIME_VARIABLE = "SINEWGRID_LEROBOT_PYTHON"
DEFAULT_RUNTIME = REPO / ".venv-lerobot" / "bin" / "python"
BUILD_HINT = "build it with `make lerobot-runtime` (Python 3.12, about 90 s and 5 GB; `make test` builds it itself)"
# Images: largest difference of one pixel value (0-255) between two decodes of the same file, and
# the largest mean difference over a frame.
IMAGE_TOLERANCE = (3, 0.5)
# The stamp of a frame within the v3 contract's `frame_index / fps` (LeRobot's own tolerance_s is 1e-4).
TIMESTAMP_TOLERANCE = 1e-5


@dataclass(frozen=True)
class Runtime:
    """LeRobot's runtime: its interpreter, and whether the caller demanded it (`make test`)."""

    python: Path
    required: bool

    @classmethod
    def find(cls) -> Runtime:
        named = os.environ.get(RUNTIME_VARIABLE)
        return cls(Path(named), True) if named else cls(DEFAULT_RUNTIME, False)

    @property
    def present(self) -> bool:
        return self.python.is_file()

    def env(self, scratch: Path) -> dict[str, str]:
        """Offline (a file LeRobot misses must fail, not go to the Hub), Hugging Face's caches in
        `scratch`, and no PYTHONPATH: the runtime imports only its own packages (a path meant for
        the project's Python 3.11 venv would shadow them)."""
        inherited = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        return {**inherited, "HF_HUB_OFFLINE": "1", "HF_HOME": str(scratch / "hf-home"), "PYTHONNOUSERSITE": "1"}

    def run(self, script: Path, args: list[str], scratch: Path, timeout: float = 900) -> subprocess.CompletedProcess:
        """`script ARGS` in the runtime, working in `scratch`; fails with its output when it fails."""
        scratch.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([str(self.python), str(script), *args], cwd=scratch, env=self.env(scratch), capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise AssertionError(f"{script.name} exited with {done.returncode} in {self.python}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
        return done

    def check(self, datasets: list[Path], scratch: Path) -> list[dict]:
        """Open every dataset with LeRobot in one process (its import costs ~5 s); the report per dataset."""
        done = self.run(CHECKER, ["--out", str(scratch / "dumps"), *map(str, datasets)], scratch)
        return json.loads(done.stdout.strip().splitlines()[-1])["datasets"]


def find_datasets(root: Path) -> list[Path]:
    """Every LeRobot dataset folder under `root` (a folder holding meta/info.json), sorted."""
    return sorted(p.parent.parent for p in root.rglob("meta/info.json"))


def video_keys(dataset: Path) -> list[str]:
    info = json.loads((dataset / "meta" / "info.json").read_text())
    return [name for name, feature in info["features"].items() if feature.get("dtype") == "video"]


def our_view(dataset: Path, images: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """What our reader returns, laid out as check_dataset.py dumps LeRobot's view (one row per frame).

    `images` (camera -> uint8 (N, H, W, 3), every frame of the dataset) stand in for our reader's
    decode, for a camera dataset our writer did not make.
    """
    cameras = video_keys(dataset)
    decode = bool(cameras) and images is None
    info, episodes = read_dataset(str(dataset), decode_images=True) if decode else read_dataset(str(dataset))
    lengths = np.asarray([ep.length for ep in episodes], dtype=np.int64)
    frame = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths])
    last = np.concatenate([np.arange(n) == n - 1 for n in lengths])
    view = {
        "observation.state": np.concatenate([ep.observation_state for ep in episodes]),
        "action": np.concatenate([ep.action for ep in episodes]),
        "timestamp": frame / info.fps,
        "frame_index": frame,
        "episode_index": np.repeat(np.arange(len(episodes), dtype=np.int64), lengths),
        "index": np.arange(int(lengths.sum()), dtype=np.int64),
        "task": np.repeat(np.array([ep.task for ep in episodes], dtype=np.str_), lengths),
        "episode_length": lengths,
    }
    if "next.done" in info.features:
        view["next.done"] = last
    if episodes[0].reward is not None:
        view["next.reward"] = np.concatenate([ep.reward for ep in episodes])
    if episodes[0].success is not None:
        view["next.success"] = last & np.repeat([bool(ep.success) for ep in episodes], lengths)
    for key in cameras:
        view[f"video:{key}"] = images[key] if images is not None else np.concatenate([ep.images[key] for ep in episodes])
    return view


def _first_difference(name: str, ours: np.ndarray, theirs: np.ndarray, episode: np.ndarray) -> str | None:
    """The first frame where a column differs, said as episode and frame; None when all agree."""
    if name.startswith("video:"):
        if ours.shape != theirs.shape:
            return f"`{name[6:]}`: LeRobot decoded frames of shape {theirs.shape}, ours are {ours.shape}"
        diff = np.abs(ours.astype(np.int16) - theirs.astype(np.int16)).reshape(len(ours), -1)
        bad = np.flatnonzero((diff.max(1) > IMAGE_TOLERANCE[0]) | (diff.mean(1) > IMAGE_TOLERANCE[1]))
        if len(bad):
            i = int(bad[0])
            return (f"`{name[6:]}` frame {i} (episode {episode[i]}): max |difference| {diff[i].max()}, mean {diff[i].mean():.2f} "
                    f"(tolerance {IMAGE_TOLERANCE[0]} and {IMAGE_TOLERANCE[1]}); {len(bad)} frames differ")
        return None
    if name != "task" and ours.dtype.kind in "fiub":
        ours, theirs = ours.reshape(len(ours), -1), theirs.reshape(len(theirs), -1)
    if ours.shape != theirs.shape:
        return f"`{name}`: LeRobot reads shape {theirs.shape}, ours {ours.shape}"
    if name == "timestamp":
        same = np.isclose(ours, theirs, rtol=0, atol=TIMESTAMP_TOLERANCE)
    elif ours.dtype.kind == "f":
        same = (ours == theirs) | (np.isnan(ours) & np.isnan(theirs))
    else:
        same = ours == theirs
    rows = np.flatnonzero(~same.reshape(len(same), -1).all(1)) if same.ndim else np.flatnonzero(~np.atleast_1d(same))
    if len(rows):
        i = int(rows[0])
        where = f"frame {i} (episode {episode[i]})" if name != "episode_length" else f"episode {i}"
        return f"`{name}` at {where}: LeRobot reads {theirs[i].tolist()!r}, our reader {ours[i].tolist()!r}; {len(rows)} rows differ"
    return None


def differences(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> list[str]:
    """Every column of ours that LeRobot lacks or reads differently, one line each (first mismatch)."""
    episode = ours["episode_index"]
    found = []
    for name, values in ours.items():
        if name not in theirs:
            found.append(f"`{name}`: LeRobot's reader has no such column (it has {sorted(theirs)})")
        elif len(theirs[name]) != len(values):
            found.append(f"`{name}`: LeRobot reads {len(theirs[name])} rows, ours {len(values)}")
        elif (line := _first_difference(name, values, theirs[name], episode)) is not None:
            found.append(line)
    return found


def load_dump(path: str) -> dict[str, np.ndarray]:
    with np.load(path) as dump:
        return {name: dump[name] for name in dump.files}
