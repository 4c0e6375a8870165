"""Camera episodes in LeRobot v3: MP4 video per episode per camera — written, read back decoded,
assembled from shards without re-encoding, and every kind of bad camera data caught by
`validate_dataset` and quarantined by the teleop asset with its reason.

Frames are synthetic (a moving gradient and a white box), so nothing here depends on a renderer.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from control_plane.intake.landing import seal_drop
from control_plane.settings import REPO_ROOT, child_env
from robotics_lane.defs.assets.teleop import teleop_episodes
from robotics_lane.episodes import Episode, assemble_dataset, read_dataset, read_episode_file, validate_dataset, write_dataset, write_episode_file
from robotics_lane.episodes.video import ENCODER_OPTIONS, encode_video
from workload_runtime.codecs import keep_scheduling

FPS = 25
FRONT, WRIST = "observation.images.front", "observation.images.wrist"
SIZES = {FRONT: (96, 96), WRIST: (96, 128)}  # (height, width)
LENGTHS = (30, 34, 38)  # episode 1 starts at global index 30
EPISODES_TABLE = "meta/episodes/chunk-000/file-000.parquet"
MAE_BOUND = 4.0  # grey levels: AV1 at crf 30 loses about 2 on these frames


def camera_frames(length: int, height: int, width: int, phase: int = 0) -> np.ndarray:
    """(T, H, W, 3) uint8: a gradient sliding right and a white box sliding down, one step a frame."""
    t = np.arange(length)[:, None, None]
    y, x = np.mgrid[:height, :width]
    frames = np.empty((length, height, width, 3), np.uint8)
    frames[..., 0] = (2 * x + 3 * t + phase) % 256
    frames[..., 1] = (2 * y + phase) % 256
    frames[..., 2] = 60
    for k in range(length):
        top = (2 * k + phase) % (height - 16)
        frames[k, top : top + 16, 8:24] = 255
    return frames


def camera_episodes(lengths=LENGTHS, sizes=SIZES, seed: int = 0) -> list[Episode]:
    rng = np.random.default_rng(seed)
    return [
        Episode(
            task="stack the cube",
            observation_state=rng.normal(size=(n, 4)).astype(np.float32),
            action=rng.uniform(-0.9, 0.9, size=(n, 2)).astype(np.float32),
            reward=np.zeros(n, np.float32),
            success=i % 2 == 0,
            metadata={"seed": 100 + i},
            images={key: camera_frames(n, h, w, phase=7 * i) for key, (h, w) in sizes.items()},
        )
        for i, n in enumerate(lengths)
    ]


def write(folder: Path, episodes: list[Episode]) -> Path:
    write_dataset(str(folder), episodes, fps=FPS, robot_type="arm", state_names=["q0", "q1", "q2", "q3"], action_names=["dq0", "dq1"])
    return folder


def video(folder: Path, key: str = FRONT, episode: int = 1) -> Path:
    return folder / f"videos/{key}/chunk-000/file-{episode:03d}.mp4"


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def mae(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


# --- writing and reading ----------------------------------------------------------------------


def test_cameras_read_back_decoded_close_to_the_frames_written(tmp_path: Path) -> None:
    episodes = camera_episodes()
    written = write(tmp_path / "ds", episodes)
    info, back = read_dataset(str(written), decode_images=True)
    assert info.cameras == SIZES
    for got, want in zip(back, episodes, strict=True):
        np.testing.assert_array_equal(got.observation_state, want.observation_state)
        assert set(got.images) == set(SIZES)
        for key, frames in want.images.items():
            assert got.images[key].shape == frames.shape and got.images[key].dtype == np.uint8
            assert mae(got.images[key], frames) < MAE_BOUND, key
            # each decoded frame is closest to the frame written at its own index: none lost or shifted
            errors = [mae(got.images[key][k], frames[j]) for k in (3, 17) for j in (k - 1, k, k + 1)]
            assert errors[1] < min(errors[0], errors[2]) and errors[4] < min(errors[3], errors[5])
    _, plain = read_dataset(str(written))
    assert all(ep.images == {} for ep in plain), "no video is opened unless asked"
    assert validate_dataset(str(written)) == (info, [])


def test_the_layout_is_lerobot_0_6_1s(tmp_path: Path) -> None:
    folder = write(tmp_path / "ds", camera_episodes())
    assert sorted(files(folder)) == [
        "data/chunk-000/file-000.parquet", EPISODES_TABLE, "meta/info.json", "meta/stats.json", "meta/tasks.parquet",
        *(f"videos/{key}/chunk-000/file-{i:03d}.mp4" for key in (FRONT, WRIST) for i in range(3)),
    ]  # fmt: skip
    info = json.loads((folder / "meta/info.json").read_text())
    assert info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    front = info["features"][FRONT]
    assert (front["dtype"], front["shape"], front["names"]) == ("video", [96, 96, 3], ["height", "width", "channels"])
    assert front["info"] == {
        "video.height": 96, "video.width": 96, "video.codec": "av1", "video.pix_fmt": "yuv420p", "video.fps": FPS,
        "video.channels": 3, "has_audio": False, "video.g": 2, "video.crf": 30, "video.preset": 12, "video.fast_decode": 0,
        "video.video_backend": "pyav", "video.extra_options": {}, "is_depth_map": False,
    }  # fmt: skip
    with av.open(str(video(folder, WRIST))) as container:  # the info block says what the file holds
        stream = container.streams.video[0]
        assert stream.codec.canonical_name == "av1"
        assert (stream.height, stream.width, stream.pix_fmt, int(stream.base_rate)) == (96, 128, "yuv420p", FPS)
        assert not container.streams.audio
    assert FRONT not in pq.read_schema(folder / "data/chunk-000/file-000.parquet").names, "frames live in the videos"

    table = pq.read_table(folder / EPISODES_TABLE)
    for key in (FRONT, WRIST):
        assert table.schema.field(f"videos/{key}/chunk_index").type == pa.int64()
        assert table.schema.field(f"videos/{key}/from_timestamp").type == pa.float64()
        assert table.column(f"videos/{key}/file_index").to_pylist() == [0, 1, 2]
        assert table.column(f"videos/{key}/from_timestamp").to_pylist() == [0.0, 0.0, 0.0]
        assert table.column(f"videos/{key}/to_timestamp").to_pylist() == [n / FPS for n in LENGTHS]


def test_image_stats_are_exact_per_channel_in_lerobots_layout(tmp_path: Path) -> None:
    episodes = camera_episodes(lengths=(12, 15), sizes={FRONT: (32, 48)})
    stats = json.loads((write(tmp_path / "ds", episodes) / "meta/stats.json").read_text())[FRONT]
    pixels = np.concatenate([ep.images[FRONT] for ep in episodes]).reshape(-1, 3).astype(np.float64) / 255
    expected = {"min": pixels.min(0), "max": pixels.max(0), "mean": pixels.mean(0), "std": pixels.std(0)}
    expected |= {name: np.quantile(pixels, q, axis=0) for name, q in {"q01": 0.01, "q10": 0.1, "q50": 0.5, "q90": 0.9, "q99": 0.99}.items()}
    for name, values in expected.items():
        assert np.asarray(stats[name]).shape == (3, 1, 1), name
        np.testing.assert_allclose(np.asarray(stats[name]).ravel(), values, rtol=1e-9, atol=1e-12, err_msg=name)
    assert stats["count"] == [27]


def test_encoding_is_deterministic_here_and_in_another_process(tmp_path: Path) -> None:
    frames = camera_frames(40, 96, 128)
    first = encode_video(frames, FPS)
    assert encode_video(frames.copy(), FPS) == first
    script = (
        "import sys, numpy as np; from tests.test_camera_episodes import camera_frames; "
        "from robotics_lane.episodes.video import encode_video; sys.stdout.buffer.write(encode_video(camera_frames(40, 96, 128), 25))"
    )
    child = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=child_env({"PYTHONPATH": str(REPO_ROOT)}), capture_output=True, timeout=120, check=True)
    assert child.stdout == first
    assert encode_video(camera_frames(40, 96, 128, phase=1), FPS) != first, "different frames, different bytes"
    assert files(write(tmp_path / "a", camera_episodes())) == files(write(tmp_path / "b", camera_episodes()))


def test_inconsistent_cameras_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    cases = {
        "episode 1 has cameras": lambda eps: eps[1].images.pop(WRIST),
        "a camera keeps one resolution": lambda eps: eps[2].images.update({FRONT: camera_frames(12, 64, 64)}),
        "with T = 12": lambda eps: eps[0].images.update({FRONT: eps[0].images[FRONT][:-1]}),
        "must be uint8 RGB frames": lambda eps: eps[0].images.update({FRONT: eps[0].images[FRONT].astype(np.float32)}),
        "must be named `observation.images.<camera>`": lambda eps: [ep.images.update({"front_cam": ep.images.pop(FRONT)}) for ep in eps],
    }
    for says, damage in cases.items():
        episodes = camera_episodes(lengths=(12, 12, 12))
        damage(episodes)
        with pytest.raises(ValueError, match=r"episode \d") as caught:
            write(tmp_path / says.replace(" ", "-"), episodes)
        assert says in str(caught.value)
        assert not (tmp_path / says.replace(" ", "-")).exists()


def test_a_camera_dataset_on_an_fsspec_filesystem(tmp_path: Path) -> None:
    uri = f"memory://camera-{tmp_path.name}"
    episodes = camera_episodes(lengths=(12, 14), sizes={FRONT: (32, 32)})
    write_dataset(uri, episodes, fps=FPS, robot_type="arm", state_names=["a", "b", "c", "d"], action_names=["x", "y"])
    assert validate_dataset(uri)[1] == []
    _, back = read_dataset(uri, decode_images=True)
    assert [mae(b.images[FRONT], e.images[FRONT]) < MAE_BOUND for b, e in zip(back, episodes, strict=True)] == [True, True]


# --- rollout shards ----------------------------------------------------------------------------


def test_shards_assemble_their_videos_byte_for_byte_into_the_dataset_write_dataset_writes(tmp_path: Path) -> None:
    episodes = camera_episodes()
    shard = tmp_path / "shard"
    seeds = [42, 7, 19]  # a shard names files by seed; assembly renumbers in list order
    paths = [write_episode_file(str(shard), ep, episode_index=s, global_index_start=0, task_index=0, fps=FPS) for ep, s in zip(episodes, seeds, strict=True)]
    assert (shard / f"episode-000042.{FRONT}.mp4").is_file() and (shard / f"episode-000007.{WRIST}.mp4").is_file()

    back = read_episode_file(paths[1], ["stack the cube"], decode_images=True)
    assert mae(back.images[WRIST], episodes[1].images[WRIST]) < MAE_BOUND
    assert read_episode_file(paths[1], ["stack the cube"]).images == {}

    folder = tmp_path / "assembled"
    assemble_dataset(str(folder), paths, ["stack the cube"], FPS, "arm", ["q0", "q1", "q2", "q3"], ["dq0", "dq1"])
    for i, seed in enumerate(seeds):
        for key in (FRONT, WRIST):
            assert video(folder, key, i).read_bytes() == (shard / f"episode-{seed:06d}.{key}.mp4").read_bytes(), "copied, not re-encoded"
    assert files(folder) == files(write(tmp_path / "direct", episodes)), "the same dataset as write_dataset, file for file"
    assert validate_dataset(str(folder))[1] == []


def test_shards_with_different_cameras_are_not_assembled(tmp_path: Path) -> None:
    shard = tmp_path / "shard"
    small = camera_episodes(lengths=(12,), sizes={FRONT: (32, 32)})[0]
    other = camera_episodes(lengths=(12,), sizes={FRONT: (32, 48)})[0]
    paths = [write_episode_file(str(shard), ep, i, 0, 0, FPS) for i, ep in enumerate((small, other))]
    with pytest.raises(ValueError, match=r"episode-000001.parquet has cameras \{'observation.images.front': '32×48'\}"):
        assemble_dataset(str(tmp_path / "ds"), paths, ["stack the cube"], FPS, "arm", ["a", "b", "c", "d"], ["x", "y"])


def test_encoding_a_video_leaves_every_thread_scheduled_as_it_was():
    """SVT-AV1 run as root (as here and in many containers) makes the thread that opens an encoder
    real-time and leaves it so (workload_runtime/codecs.py); the writer undoes it. Run as another
    user, the encoder changes nothing and this holds trivially."""
    before = os.sched_getscheduler(0), os.sched_getparam(0)
    assert len(encode_video(camera_frames(4, 32, 48), FPS)) > 0
    threads = {int(t.name): os.sched_getscheduler(int(t.name)) for t in Path("/proc/self/task").iterdir()}
    assert (os.sched_getscheduler(0), os.sched_getparam(0)) == before
    assert set(threads.values()) == {before[0]}, f"threads left on another policy: {threads}"


# --- bad camera data ---------------------------------------------------------------------------


def encode_at(frames: np.ndarray, times_in_frames: list[float], fps: int) -> bytes:
    """What a faulty recorder writes: `frames` presented at `times_in_frames` (in frame periods)."""
    time_base = Fraction(1, fps * 10)
    sink = io.BytesIO()
    with keep_scheduling(), av.open(sink, "w", format="mp4") as container:  # SVT-AV1 as root: see workload_runtime/codecs.py
        stream = container.add_stream("libsvtav1", rate=fps, options=dict(ENCODER_OPTIONS))
        stream.pix_fmt, stream.height, stream.width = "yuv420p", frames.shape[1], frames.shape[2]
        stream.codec_context.time_base = time_base
        for image, at in zip(frames, times_in_frames, strict=True):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = round(at * 10), time_base
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return sink.getvalue()


def missing_frames(folder: Path) -> None:
    video(folder).write_bytes(encode_video(camera_frames(31, 96, 96, phase=7), FPS))  # episode 1 has 34 rows


def undecodable(folder: Path) -> None:
    data = video(folder).read_bytes()
    video(folder).write_bytes(data[: len(data) // 2])  # the copy broke off half way


def garbage(folder: Path) -> None:
    video(folder).write_bytes(b"\x00\x00\x00\x18ftypisom" + bytes(range(256)) * 20)


def wrong_fps(folder: Path) -> None:
    video(folder).write_bytes(encode_video(camera_frames(34, 96, 96, phase=7), 30))


def out_of_step(folder: Path) -> None:
    """From frame 10 on, every camera frame comes 0.6 of a frame early (as many frames as rows)."""
    video(folder).write_bytes(encode_at(camera_frames(34, 96, 96, phase=7), [k if k < 10 else k - 0.6 for k in range(34)], FPS))


def wrong_resolution(folder: Path) -> None:
    video(folder).write_bytes(encode_video(camera_frames(34, 64, 64, phase=7), FPS))


def missing_file(folder: Path) -> None:
    video(folder).unlink()


BAD_CAMERA_DATA = {  # damage to episode 1's front camera -> what the issue must say
    "missing_frames": (missing_frames, ["holds 31 frames in [0.000 s, 1.360 s)", "has 34 rows (3 missing)", "re-export the episode"]),
    "undecodable": (undecodable, ["cannot be decoded", "truncated or not an MP4", "copy it again"]),
    "garbage": (garbage, ["cannot be decoded", "FFmpeg cannot open it"]),
    "wrong_fps": (wrong_fps, ["plays at 30 fps but the dataset records at 25 fps", "re-encode the camera at 25 fps"]),
    "out_of_step": (out_of_step, ["frame 10: presented 0.3760 s into the episode but frame_index / fps = 0.4000 s", "24 frames out of step"]),
    "wrong_resolution": (wrong_resolution, ["the video is 64×64 (H×W) but info.json declares shape [96, 96, 3]"]),
    "missing_file": (missing_file, ["the video file is missing", "send it with the session"]),
}


@pytest.mark.parametrize("case", sorted(BAD_CAMERA_DATA))
def test_bad_camera_data_is_reported_naming_file_episode_camera_and_fix(tmp_path: Path, case: str) -> None:
    folder = write(tmp_path / "session", camera_episodes(sizes={FRONT: (96, 96)}))
    damage, says = BAD_CAMERA_DATA[case]
    damage(folder)
    sent = files(folder)
    _, issues = validate_dataset(str(folder))
    [issue] = issues  # one problem, one issue: nothing else in the dataset is blamed
    assert (issue.rule, issue.file, issue.column) == ("video", f"videos/{FRONT}/chunk-000/file-001.mp4", FRONT)
    assert "episode 1" in issue.message and f"`{FRONT}`" in issue.message
    for phrase in says:
        assert phrase in issue.message, issue.message
    assert issue.row == (30 + 10 if case == "out_of_step" else 30), "the global index of the frame (or episode) to look at"
    assert files(folder) == sent, "validation only reads"


def test_an_episode_table_without_video_columns_is_reported(tmp_path: Path) -> None:
    folder = write(tmp_path / "session", camera_episodes(sizes={FRONT: (32, 32)}))
    table = pq.read_table(folder / EPISODES_TABLE)
    pq.write_table(table.drop_columns([f"videos/{FRONT}/from_timestamp", f"videos/{FRONT}/to_timestamp"]), folder / EPISODES_TABLE)
    [issue] = validate_dataset(str(folder))[1]
    assert issue.rule == "video" and issue.column == FRONT
    assert f"videos/{FRONT}/from_timestamp" in issue.message and "which file holds its" in issue.message


# --- through the teleop asset: quarantined with the reason ------------------------------------


def ingest(instance, resources, session: str):
    import dagster as dg

    instance.add_dynamic_partitions("teleop_sessions", [session])
    return dg.materialize([teleop_episodes], instance=instance, resources=resources, partition_key=session, raise_on_error=False)


@pytest.mark.parametrize("case", ["missing_frames", "undecodable", "wrong_fps", "out_of_step"])
def test_a_teleop_session_with_bad_camera_data_is_quarantined_with_its_reason(instance, resources, home, storage, case):
    session = f"session-{case.replace('_', '-')}"
    folder = write(home / "landing" / "teleop" / session, camera_episodes(sizes={FRONT: (96, 96)}))
    damage, says = BAD_CAMERA_DATA[case]
    damage(folder)
    seal_drop(storage, "teleop", session, robot="arm-1", operator="alice", project="p")
    sent = files(folder)

    assert not ingest(instance, resources, session).success

    report = json.loads((home / "quarantine" / "teleop" / session / "QUARANTINE.json").read_text())
    assert report["stage"] == "validation"
    [issue] = report["issues"]
    assert issue["rule"] == "video" and issue["file"] == f"videos/{FRONT}/chunk-000/file-001.mp4"
    assert all(phrase in issue["message"] for phrase in says), issue["message"]
    assert files(folder) == sent == files(home / "quarantine" / "teleop" / session / "original"), "kept intact"
    assert not (home / "curated" / "teleop" / session).exists()


def test_a_good_camera_session_flows(instance, resources, home, storage) -> None:
    write(home / "landing" / "teleop" / "session-cameras", camera_episodes())
    seal_drop(storage, "teleop", "session-cameras", robot="arm-1", operator="alice", project="p")
    result = ingest(instance, resources, "session-cameras")
    assert result.success
    [materialization] = result.asset_materializations_for_node("robotics__teleop_episodes")
    assert materialization.metadata["frames"].value == sum(LENGTHS)
    assert json.loads((home / "curated" / "teleop" / "session-cameras" / "dataset.json").read_text())["episodes"] == len(LENGTHS)
