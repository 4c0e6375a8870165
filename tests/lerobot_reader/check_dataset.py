"""Open datasets with LeRobot's own reader and dump what it sees — run inside `.venv-lerobot`.

    .venv-lerobot/bin/python tests/lerobot_reader/check_dataset.py --out DUMP_DIR DATASET [DATASET ...]

For each dataset folder, `LeRobotDataset("local/<name>", root=DATASET, video_backend="pyav")`
opens it (set HF_HUB_OFFLINE=1: a file it finds missing must fail here, not send it to the Hub).
Written to `DUMP_DIR/<n>.npz`, one file per dataset, in the order given:

- every column of LeRobot's frame table (`hf_dataset`, the table `dataset[i]` reads), as numpy,
  and `task`: each frame's task string, looked up in `meta.tasks` as `dataset[i]` does;
- `episode_length`: each episode's length from LeRobot's episodes table;
- `video:<key>` for each video feature: every frame decoded by LeRobot (pyav backend) at the
  frame's own timestamp plus its episode's `from_timestamp` (what `dataset[i]` asks for), as uint8
  (N, H, W, 3); LeRobot hands frames out as float32 CHW in [0, 1], and the checker turns them
  back into bytes only after checking that they are exactly k/255.

`dataset[i]` itself is called on each episode's first, middle and last frame and must agree with
the dump (columns, task, decoded images). Prints one JSON object on stdout:
`{"lerobot": VERSION, "import_seconds": S, "datasets": [{"root", "ok", "error", "frames", "episodes", "video_keys",
"dump", "seconds"}, ...]}`; a dataset that fails has `ok: false` and the error, the others go on.
Imports LeRobot, torch and numpy, nothing of the project.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np


def _to_bytes(frames, where: str) -> np.ndarray:
    """LeRobot's float32 (N, 3, H, W) frames in [0, 1] as uint8 (N, H, W, 3), checked exact."""
    values = frames.numpy() if hasattr(frames, "numpy") else np.asarray(frames)
    if values.dtype != np.float32 or values.ndim != 4 or values.shape[1] != 3:
        raise ValueError(f"{where}: LeRobot returned {values.dtype} {values.shape}, not float32 (N, 3, H, W)")
    scaled = values * 255.0
    levels = np.rint(scaled)
    if values.size and (values.min() < 0 or values.max() > 1 or np.abs(scaled - levels).max() > 1e-3):
        raise ValueError(f"{where}: LeRobot's frames are not 8-bit levels in [0, 1] (min {values.min()}, max {values.max()})")
    return levels.astype(np.uint8).transpose(0, 2, 3, 1)


def _decode_episode_frames(dataset, key: str, episode: int, timestamps: np.ndarray) -> np.ndarray:
    """Every frame of one episode for camera `key`, by LeRobot's decoder, as `dataset[i]` asks for them."""
    from lerobot.datasets.video_utils import decode_video_frames

    row = dataset.meta.episodes[episode]
    path = dataset.root / dataset.meta.get_video_file_path(episode, key)
    shifted = [float(row[f"videos/{key}/from_timestamp"]) + float(t) for t in timestamps]
    frames = decode_video_frames(path, shifted, dataset.tolerance_s, "pyav")
    return _to_bytes(frames, f"{path} (episode {episode}, {key})")


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))


def _spot_check(dataset, columns: dict[str, np.ndarray], videos: dict[str, np.ndarray], starts: np.ndarray, lengths: np.ndarray) -> None:
    """`dataset[i]` on each episode's first, middle and last frame agrees with the dump."""
    for start, length in zip(starts, lengths, strict=True):
        for i in sorted({int(start), int(start + length // 2), int(start + length - 1)}):
            item = dataset[i]
            for name, values in columns.items():
                got = item[name] if name != "task" else np.str_(item["task"])
                got = got.numpy() if hasattr(got, "numpy") else got
                if not _same(got, values[i]):
                    raise AssertionError(f"dataset[{i}][{name!r}] = {got!r} but hf_dataset row {i} holds {values[i]!r}")
            for key, frames in videos.items():
                got = _to_bytes(item[key][None], f"dataset[{i}][{key!r}]")[0]
                if not _same(got, frames[i]):
                    diff = np.abs(got.astype(int) - frames[i].astype(int)).max()
                    raise AssertionError(f"dataset[{i}][{key!r}] differs from the episode's bulk decode (max |diff| {diff})")


def check(root: Path, dump: Path) -> dict:
    """Open one dataset with LeRobot, dump its frames to `dump`; the report entry."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    dataset = LeRobotDataset(f"local/{root.name}", root=root, video_backend="pyav")
    video_keys = list(dataset.meta.video_keys)
    table = dataset.hf_dataset.with_format("numpy")[:]
    columns = {name: np.asarray(values) for name, values in table.items()}
    tasks = dataset.meta.tasks
    columns["task"] = np.array([tasks.iloc[int(t)].name for t in columns["task_index"]], dtype=np.str_)

    lengths = np.asarray([int(row["length"]) for row in dataset.meta.episodes], dtype=np.int64)
    starts = np.asarray([int(row["dataset_from_index"]) for row in dataset.meta.episodes], dtype=np.int64)
    videos: dict[str, np.ndarray] = {}
    for key in video_keys:
        parts = []
        for episode, (start, length) in enumerate(zip(starts, lengths, strict=True)):
            parts.append(_decode_episode_frames(dataset, key, episode, columns["timestamp"][start : start + length]))
        videos[key] = np.concatenate(parts) if parts else np.zeros((0, 0, 0, 3), np.uint8)
    _spot_check(dataset, columns, videos, starts, lengths)
    arrays = {**columns, "episode_length": lengths, **{f"video:{k}": v for k, v in videos.items()}}
    np.savez(dump, **arrays)
    return {"frames": len(dataset), "episodes": dataset.num_episodes, "video_keys": video_keys, "fps": dataset.fps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the per-dataset .npz dumps")
    parser.add_argument("datasets", nargs="+", type=Path, help="dataset folders (each holds meta/info.json)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    import lerobot
    import lerobot.datasets.lerobot_dataset  # noqa: F401  (the import is most of a small check's time: timed apart)

    report = {"lerobot": getattr(lerobot, "__version__", "unknown"), "import_seconds": round(time.perf_counter() - started, 3), "datasets": []}
    for n, root in enumerate(args.datasets):
        dump, started = args.out / f"{n:03d}.npz", time.perf_counter()
        entry = {"root": str(root), "dump": str(dump), "ok": True, "error": None}
        try:
            entry.update(check(root.resolve(), dump))
        except Exception as exc:  # one bad dataset must not hide the others: report it and go on
            entry.update(ok=False, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(limit=6))
        entry["seconds"] = round(time.perf_counter() - started, 3)
        report["datasets"].append(entry)
    json.dump(report, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
