"""LeRobot's own reader opens every dataset we write, and sees what our reader sees.

LeRobot 0.6.1 (`LeRobotDataset`, offline, video backend pyav) runs in its own Python 3.12 runtime
(`.venv-lerobot`, mk/lerobot.mk) through tests/lerobot_reader/check_dataset.py; its view of each
dataset (every frame's state, action, timestamp, indices and task, every video frame decoded) is
held against `read_dataset`'s (tests/lerobot_reader/compare.py).

- The demo's datasets (e2e, on the demo's worker): every folder holding `meta/info.json` under
  its storage root, which must include each kind the demo writes, with the front camera's video
  where the demo films; LeRobot reads each distinct one (a drop's raw and quarantined copies hold
  the very bytes of the landed drop, and are checked to).
- Fast, without the demo: datasets our writer writes (a camera included: AV1, one MP4 per
  episode; and over several chunk folders); a camera dataset laid out as LeRobot records one (every episode in one MP4, H.264
  made with PyAV in LeRobot's runtime), which both readers must read the same; and a broken copy
  of it, which the check must catch. Under `make test-fast` these skip only when the runtime is
  missing; `make test` builds it and names it, and then they must run.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
import pyarrow.parquet as pq
import pytest

from robotics_lane.episodes import Episode, layout, validate_dataset, write_dataset, writing
from tests.lerobot_reader.compare import ADD_CAMERA, BUILD_HINT, IMAGE_TOLERANCE, Runtime, differences, find_datasets, load_dump, our_view, video_keys

# What the demo writes, by where it lies under the storage root: a kind missing from a demo run,
# or a dataset of no known kind, fails the test (a new kind gets a line here).
DEMO_DATASET_KINDS = {
    "teleop session, landed": "landing/teleop/teleop-session-*",
    "teleop session, raw (curated points at it)": "raw/teleop/teleop-session-*",
    "relabelling session, landed": "landing/teleop/relabel-*",
    "relabelling session, raw": "raw/teleop/relabel-*",
    "quarantined teleop session": "quarantine/teleop/*/original",
    "robot cell trials, landed": "landing/robot_eval/*/episodes",
    "robot cell trials, raw": "raw/robot_eval/*/episodes",
    "assembled sweep rollouts": "rollouts/*/*/dataset",
}
CAMERA = "observation.images.front"
# The kinds that carry the front camera's video (both sweeps film it: docs/simulators.md).
FILMED_KINDS = {"teleop session, landed", "relabelling session, landed", "robot cell trials, landed", "assembled sweep rollouts"}


def kind_of(home: Path, dataset: Path) -> str | None:
    rel = PurePosixPath(dataset.relative_to(home).as_posix())
    for kind, pattern in DEMO_DATASET_KINDS.items():
        if len(rel.parts) == len(PurePosixPath(pattern).parts) and rel.match(pattern):
            return kind
    return None


@pytest.fixture(scope="module")
def runtime() -> Runtime:
    """LeRobot's runtime; the fast tests skip without it unless `make test` demanded it."""
    found = Runtime.find()
    if not found.present:
        message = f"LeRobot's runtime is missing ({found.python}): {BUILD_HINT}"
        if found.required:
            pytest.fail(message)
        pytest.skip(message)
    return found


def check_against_ours(
    runtime: Runtime, datasets: list[Path], scratch: Path, images: dict[Path, dict[str, np.ndarray]] | None = None, reports: list[dict] | None = None
) -> dict[Path, list[str]]:
    """Open `datasets` with LeRobot in one process; what differs from our reader, per dataset.

    `images[dataset]` gives the camera frames to hold LeRobot's decode against, for a dataset
    whose video our reader did not write; otherwise our reader decodes them. LeRobot's report per
    dataset (frames, episodes, cameras, seconds) is appended to `reports` when given.
    """
    problems: dict[Path, list[str]] = {}
    for dataset, report in zip(datasets, runtime.check(datasets, scratch), strict=True):
        if reports is not None:
            reports.append(report)
        if not report["ok"]:
            problems[dataset] = [f"LeRobot cannot open it: {report['error']}\n{report.get('traceback', '')}"]
            continue
        ours = our_view(dataset, images=(images or {}).get(dataset))
        found = differences(ours, load_dump(report["dump"]))
        if report["frames"] != len(ours["index"]):
            found.append(f"LeRobot counts {report['frames']} frames, our reader {len(ours['index'])}")
        problems[dataset] = found
    return problems


def failures(problems: dict[Path, list[str]]) -> str:
    return "\n".join(f"{dataset}:\n  " + "\n  ".join(lines) for dataset, lines in problems.items() if lines)


# --- the demo's datasets ---------------------------------------------------------------------------


def test_every_dataset_the_demo_writes_opens_in_lerobots_reader(tmp_path, demo_run):
    found = Runtime.find()
    assert found.present, f"LeRobot's runtime is missing ({found.python}): {BUILD_HINT}"
    demo_run.require_success()
    datasets = find_datasets(demo_run.home)
    kinds = {dataset: kind_of(demo_run.home, dataset) for dataset in datasets}
    unknown = [str(d.relative_to(demo_run.home)) for d, k in kinds.items() if k is None]
    assert not unknown, f"datasets of no known kind (add them to DEMO_DATASET_KINDS): {unknown}"
    missing = sorted(set(DEMO_DATASET_KINDS) - set(kinds.values()))
    assert not missing, f"the demo wrote no dataset of these kinds: {missing}; it wrote {sorted(map(str, datasets))}"
    curated = [Path(json.loads(p.read_text())["dataset"]) for p in sorted((demo_run.home / "curated").rglob("dataset.json"))]
    assert curated, "the demo curated no teleop session (no curated/**/dataset.json)"
    assert set(curated) <= set(datasets), f"curated datasets the walk did not find: {sorted(set(curated) - set(datasets))}"

    filmed = {kinds[d] for d in datasets if CAMERA in video_keys(d)}
    assert FILMED_KINDS <= filmed, f"no {CAMERA} video in the demo's {sorted(FILMED_KINDS - filmed)}"

    # A landed drop and its raw copy hold the same bytes: LeRobot reads one of them, the others must be copies.
    checked: dict[str, Path] = {}
    for dataset in datasets:
        checked.setdefault(content_digest(dataset), dataset)
    reports: list[dict] = []
    problems = check_against_ours(found, list(checked.values()), tmp_path, reports=reports)
    assert not failures(problems), "LeRobot's reader and ours disagree:\n" + failures(problems)
    opened = [f"{kinds[d]}: {d.relative_to(demo_run.home)} ({r['episodes']} episodes, {r['frames']} frames, cameras {r['video_keys']}, {r['seconds']} s)"
              for d, r in zip(checked.values(), reports, strict=True)]  # fmt: skip
    copies = [f"{kinds[d]}: {d.relative_to(demo_run.home)}, the same bytes as {checked[content_digest(d)].relative_to(demo_run.home)}"
              for d in datasets if d not in checked.values()]  # fmt: skip
    print(f"LeRobot opened {len(checked)} datasets:\n  " + "\n  ".join(opened) + f"\nand {len(copies)} byte-identical copies:\n  " + "\n  ".join(copies))


def content_digest(dataset: Path) -> str:
    """One digest of every file of a dataset folder (paths and bytes), a drop's own manifest.json left out."""
    digest = hashlib.sha256()
    for path in sorted(p for p in dataset.rglob("*") if p.is_file() and p.relative_to(dataset).as_posix() != "manifest.json"):
        digest.update(path.relative_to(dataset).as_posix().encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


# --- fast: datasets made here ------------------------------------------------------------------------


def camera_frames(episode: int, length: int, height: int = 48, width: int = 64) -> np.ndarray:
    """A colour gradient with a bright box that moves with the frame: uint8 (T, H, W, 3)."""
    y, x = np.mgrid[0:height, 0:width]
    background = np.stack([x * 255 // (width - 1), y * 255 // (height - 1), np.full_like(x, 40 * episode)], axis=-1)
    frames = np.repeat(background[None], length, axis=0)
    for t in range(length):
        top, left = (3 * t) % (height - 12), (5 * t + 7 * episode) % (width - 12)
        frames[t, top : top + 12, left : left + 12] = 250
    return frames.astype(np.uint8)


def episodes(action_dim: int, camera: bool = False, n: int = 3, seed: int = 0) -> list[Episode]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        t = 17 + 5 * i
        action = rng.uniform(-1, 1, size=(t, action_dim)).astype(np.float32)
        if i == 2:
            action[t // 2 :] = np.nan  # a recorder glitch travels as NaN, as the demo's glitch session does
        out.append(Episode(task=["balance the pole", "swing up"][i % 2], observation_state=rng.normal(size=(t, 4)).astype(np.float32),
                           action=action, reward=rng.normal(size=t).astype(np.float32), success=i == 1, metadata={"seed": i},
                           images={CAMERA: camera_frames(i, t)} if camera else {}))  # fmt: skip
    return out


def write(folder: Path, action_dim: int, camera: bool = False, n: int = 3) -> Path:
    names = ["cart_x", "cart_v", "pole_theta", "pole_omega"]
    actions = [f"a{i}" for i in range(action_dim)]
    write_dataset(str(folder), episodes(action_dim, camera, n), fps=25, robot_type="cartpole", state_names=names, action_names=actions)
    return folder


@dataclass(frozen=True)
class MadeHere:
    """Datasets made in this module, all checked by LeRobot in one run (its import costs ~5 s)."""

    scalar_action: Path  # a one-dimensional action is a plain scalar column ...
    vector_action: Path  # ... a wider one a list column: both paths
    our_camera: Path  # a camera as our writer records it (AV1, one MP4 per episode)
    concatenated_camera: Path  # a camera as LeRobot records it: every episode in one MP4 (H.264 by PyAV, in LeRobot's runtime)
    broken_camera: Path  # the same, but every episode claims to start at second 0 of the video
    chunked_camera: Path  # our writer's videos over several chunk folders (2 files a chunk instead of 1,000)
    frames: dict[str, np.ndarray]  # the concatenated camera's frames as drawn (`source`) and decoded start to end (`decoded`)
    problems: dict[Path, list[str]]


@pytest.fixture(scope="module")
def made_here(runtime, tmp_path_factory) -> MadeHere:
    base = tmp_path_factory.mktemp("made-here")
    scalar_action, vector_action = write(base / "scalar-action", 1), write(base / "vector-action", 2)
    our_camera, concatenated = write(base / "our-camera", 2, camera=True), write(base / "concatenated-camera", 1)
    with pytest.MonkeyPatch.context() as mp:  # a chunk boundary without encoding 1,001 episodes
        mp.setattr(layout, "CHUNKS_SIZE", 2)
        mp.setattr(writing, "CHUNKS_SIZE", 2)
        chunked = write(base / "chunked-camera", 1, camera=True, n=5)
    runtime.run(ADD_CAMERA, [str(concatenated), "--frames-out", str(base / "frames.npz")], base)
    broken = base / "camera-wrong-from-timestamp"
    shutil.copytree(concatenated, broken)
    table_path = broken / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(table_path)
    column = f"videos/{CAMERA}/from_timestamp"
    pq.write_table(table.set_column(table.schema.get_field_index(column), column, [np.zeros(table.num_rows)]), table_path)
    frames = load_dump(str(base / "frames.npz"))
    # The broken copy is held against the independent decode: our reader follows its wrong from_timestamp as LeRobot's does.
    images = {broken: {CAMERA: frames["decoded"]}}
    datasets = [scalar_action, vector_action, our_camera, concatenated, broken, chunked]
    problems = check_against_ours(runtime, datasets, base / "check", images=images)
    return MadeHere(scalar_action, vector_action, our_camera, concatenated, broken, chunked, frames, problems)


def agree(made_here: MadeHere, *datasets: Path) -> None:
    problems = {d: made_here.problems[d] for d in datasets}
    assert not failures(problems), "LeRobot's reader and ours disagree:\n" + failures(problems)


def test_datasets_our_writer_writes_open_in_lerobots_reader(made_here):
    agree(made_here, made_here.scalar_action, made_here.vector_action)


def test_a_camera_dataset_our_writer_writes_opens_in_lerobots_reader_images_included(made_here):
    assert video_keys(made_here.our_camera) == [CAMERA]
    agree(made_here, made_here.our_camera)


def test_lerobots_layout_of_one_video_for_all_episodes_reads_the_same_in_both(made_here):
    assert video_keys(made_here.concatenated_camera) == [CAMERA]
    agree(made_here, made_here.concatenated_camera)
    # both readers see what an independent start-to-end decode sees, and that is the frames drawn
    # (H.264 at crf 18 on yuv420p: close to them, not equal)
    ours = our_view(made_here.concatenated_camera)[f"video:{CAMERA}"]
    source, decoded = made_here.frames["source"].astype(np.int16), made_here.frames["decoded"].astype(np.int16)
    assert ours.shape == decoded.shape and np.abs(ours - decoded).max() <= IMAGE_TOLERANCE[0]
    assert source.shape == decoded.shape and np.abs(source - decoded).mean() < 4


def test_the_check_catches_frames_from_the_wrong_place_in_the_video(made_here):
    found = made_here.problems[made_here.broken_camera]
    # episode 0 has 17 frames: episode 1 starts at frame 17, and LeRobot now shows it episode 0's first frame
    assert [line for line in found if line.startswith(f"`{CAMERA}` frame 17 (episode 1)")], found
    assert all(line.startswith(f"`{CAMERA}`") for line in found), "only the images are wrong in the broken copy"


def test_videos_past_a_chunk_boundary_are_found_by_both_readers(made_here):
    """Episode 2 of a 2-files-a-chunk dataset is chunk 1, file 0: both readers follow the episodes table there."""
    videos = made_here.chunked_camera / "videos" / CAMERA
    assert sorted(p.relative_to(videos).as_posix() for p in videos.rglob("*.mp4")) == [
        "chunk-000/file-000.mp4", "chunk-000/file-001.mp4", "chunk-001/file-000.mp4", "chunk-001/file-001.mp4", "chunk-002/file-000.mp4",
    ]
    assert json.loads((made_here.chunked_camera / "meta/info.json").read_text())["chunks_size"] == 2
    _, issues = validate_dataset(str(made_here.chunked_camera))
    assert [i.rule for i in issues] == ["non_finite"]  # episode 2's recorder glitch (NaN actions), nothing about its video
    agree(made_here, made_here.chunked_camera)
