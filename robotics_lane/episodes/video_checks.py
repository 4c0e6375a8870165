"""The `video` rule of `validate_dataset`: every camera of every episode against its MP4 file.

Each video file is decoded once with PyAV (every frame, threaded, never converted to RGB: the
check needs each frame's presentation time, not its pixels), whatever number of episodes it
holds. Per camera and file, then per episode, the rule reports:

- a file that is missing, or that FFmpeg cannot open or decode to the end (truncated, garbage);
- a resolution other than the feature's declared shape [H, W, 3];
- a frame rate other than the dataset's fps (1 / the median interval between frames);
- a number of frames in the episode's [from_timestamp, to_timestamp) span other than its number
  of rows (missing or extra frames);
- frames out of step: frame k presented half a frame or more away from from_timestamp + k / fps
  (a dropped, duplicated or late camera frame; only checked when the frame rate is right).

The episodes table must say where each camera's frames are (`videos/<camera>/chunk_index`,
`file_index`, `from_timestamp`, `to_timestamp`) and info.json how to find the file (`video_path`).
"""

from __future__ import annotations

import math
import posixpath
from collections import defaultdict
from typing import Any

import numpy as np

from robotics_lane.episodes.layout import INFO_PATH, VIDEO_COLUMNS, VIDEO_PATH
from robotics_lane.episodes.video import VideoUnreadable, in_span, probe_video
from workload_runtime.data_issues import DropIssue

RULE = "video"
FPS_TOLERANCE = 0.01  # relative: 25 fps against 25.2 passes, 24 or 30 does not


def declared_camera_problem(feature: dict) -> str | None:
    """What is wrong with a camera feature's declaration in info.json, or None."""
    if feature.get("dtype") == "image":
        return ("is an `image` feature (frames stored as images in the data files); only video features are accepted: "
                "record with videos on (LeRobot's `use_videos=True`) so each camera is stored as MP4.")  # fmt: skip
    shape = feature.get("shape")
    if not (isinstance(shape, list | tuple) and len(shape) == 3 and all(isinstance(d, int) and d > 0 for d in shape) and shape[2] == 3):
        return f"is declared with shape {shape!r}; a video feature's shape is [height, width, 3]."
    return None


def check_videos(fs: Any, root: str, info: dict, rows: list[dict], dataset: str) -> list[DropIssue]:
    """Every `video` issue of the dataset; `rows` are the episode table's rows (episode_index order)."""
    cameras = {name: ft for name, ft in info["features"].items() if ft.get("dtype") == "video" and declared_camera_problem(ft) is None}
    if not cameras:
        return []
    template = info.get("video_path")
    try:
        template.format(video_key="x", chunk_index=0, file_index=0)
    except (AttributeError, KeyError, IndexError, ValueError):
        msg = f"video_path is {template!r}; with video features it must be a template like {VIDEO_PATH!r} ({{video_key}}, {{chunk_index}}, {{file_index}})."
        return [DropIssue(RULE, msg, INFO_PATH)]
    issues: list[DropIssue] = []
    for camera, feature in cameras.items():
        columns = [f"videos/{camera}/{c}" for c in VIDEO_COLUMNS]
        missing = sorted({c for r in rows for c in columns if not _number(r.get(c))})
        if missing:
            msg = (f"the episode table has no (or empty, or non-numeric) {missing}; each episode row must say which file holds its "
                   f"`{camera}` frames and their span in seconds, as LeRobot v3 writes them.")  # fmt: skip
            issues.append(DropIssue(RULE, msg, "meta/episodes", column=camera))
            continue
        by_file: dict[tuple[int, int], list[dict]] = defaultdict(list)
        for r in rows:
            by_file[(int(r[columns[0]]), int(r[columns[1]]))].append(r)
        for (chunk, file), ep_rows in sorted(by_file.items()):
            rel = template.format(video_key=camera, chunk_index=chunk, file_index=file)
            issues += _check_file(fs, root, rel, camera, feature, ep_rows, int(info["fps"]), dataset)
    return issues


def _check_file(fs: Any, root: str, rel: str, camera: str, feature: dict, rows: list[dict], fps: int, dataset: str) -> list[DropIssue]:
    """The issues of one video file and of the episodes whose frames it holds."""
    held = _episodes(rows)
    first_row = int(rows[0]["dataset_from_index"])

    def issue(msg: str, row: int = first_row) -> DropIssue:
        return DropIssue(RULE, msg, rel, row, column=camera)

    try:
        probe = probe_video(fs, posixpath.join(root, rel))
    except FileNotFoundError:
        return [issue(f"camera `{camera}` of {held} of {dataset}: the video file is missing; send it with the session "
                      "(the episode table points here), or remove the camera from info.json and the episode table.")]  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - any read failure is reported, not raised
        reason = str(exc) if isinstance(exc, VideoUnreadable) else f"{type(exc).__name__}: {exc}"
        return [issue(f"camera `{camera}` of {held} of {dataset}: the video cannot be decoded: {reason}. The file is truncated or "
                      "not an MP4 video; copy it again from the recorder or re-export the session.")]  # fmt: skip
    issues = []
    height, width = feature["shape"][:2]
    if (probe.height, probe.width) != (height, width):
        issues.append(issue(f"camera `{camera}` of {held}: the video is {probe.height}×{probe.width} (H×W) but info.json declares "
                            f"shape {list(feature['shape'])}; declare the size the camera records, or re-encode at {height}×{width}."))  # fmt: skip
    rate_ok = probe.fps is not None and abs(probe.fps - fps) <= FPS_TOLERANCE * fps
    if not rate_ok:
        shown = "an unknown rate" if probe.fps is None else f"{probe.fps:.3g} fps"
        issues.append(issue(f"camera `{camera}` of {held}: the video plays at {shown} but the dataset records at {fps} fps; "
                            f"re-encode the camera at {fps} fps, one video frame per row of the episode."))  # fmt: skip
    for row in rows:
        issues += _check_episode(probe.times, row, camera, fps, rate_ok, issue)
    return issues


def _check_episode(times: np.ndarray, row: dict, camera: str, fps: int, rate_ok: bool, issue) -> list[DropIssue]:
    """Frame count and frame timing of one episode's span."""
    episode, length = int(row["episode_index"]), int(row["length"])
    start, end = (float(row[f"videos/{camera}/{c}"]) for c in ("from_timestamp", "to_timestamp"))
    span = times[in_span(times, start, end, fps)]
    found = []
    if len(span) != length:
        gap = f"{length - len(span)} missing" if len(span) < length else f"{len(span) - length} extra"
        found.append(issue(f"episode {episode}, camera `{camera}`: the video holds {len(span)} frames in [{start:.3f} s, {end:.3f} s) "
                           f"but the episode has {length} rows ({gap}); every row needs exactly one camera frame: "
                           "re-export the episode from the recording, or drop it."))  # fmt: skip
    if rate_ok:
        k = min(len(span), length)
        off = np.abs((span[:k] - start) - np.arange(k) / fps) >= 0.5 / fps
        if off.any():
            j = int(np.argmax(off))
            found.append(issue(f"episode {episode}, camera `{camera}`, frame {j}: presented {span[j] - start:.4f} s into the episode "
                               f"but frame_index / fps = {j / fps:.4f} s ({int(off.sum())} frames out of step by half a frame or more); "
                               "a dropped, repeated or late camera frame puts the images out of step with the rows: re-export the "
                               f"camera with one frame every 1/{fps} s, in step with the rows.", int(row["dataset_from_index"]) + j))  # fmt: skip
    return found


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _episodes(rows: list[dict]) -> str:
    ids = [int(r["episode_index"]) for r in rows]
    return f"episode {ids[0]}" if len(ids) == 1 else f"episodes {ids[:8]}{' …' if len(ids) > 8 else ''}"
