"""The LeRobot v3.0 reader/writer: round trips, the on-disk layout LeRobot expects, shards, fsspec."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from robotics_lane.episodes import (
    Episode,
    assemble_dataset,
    dataset_files,
    read_dataset,
    write_dataset,
    write_episode_file,
)

STATE_NAMES = ["cart_x", "cart_v", "pole_theta", "pole_omega"]
ACTION_NAMES = ["force_x", "force_y"]
FPS = 30


def make_episodes(n: int = 3, action_dim: int = 2, seed: int = 0) -> list[Episode]:
    rng = np.random.default_rng(seed)
    episodes = []
    for i in range(n):
        t = 20 + 3 * i
        episodes.append(
            Episode(
                task=["balance the pole", "swing up"][i % 2],
                observation_state=rng.normal(size=(t, 4)).astype(np.float32),
                action=rng.uniform(-1, 1, size=(t, action_dim)).astype(np.float32),
                reward=rng.normal(size=t).astype(np.float32),
                success=i % 2 == 1,
                metadata={"seed": 100 + i, "failure_mode": "none" if i % 2 else "pole_fell", "friction": 0.1 * i},
            )
        )
    return episodes


def write(uri: str, episodes: list[Episode], action_names: list[str] = ACTION_NAMES):
    return write_dataset(uri, episodes, fps=FPS, robot_type="cartpole", state_names=STATE_NAMES, action_names=action_names)


def assert_same_episodes(got: list[Episode], want: list[Episode]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.task == w.task
        np.testing.assert_array_equal(g.observation_state, w.observation_state)
        np.testing.assert_array_equal(g.action, w.action)
        assert g.observation_state.dtype == np.float32 and g.action.dtype == np.float32
        if w.reward is None:
            assert g.reward is None
        else:
            np.testing.assert_array_equal(g.reward, w.reward)
        assert g.success == w.success
        assert g.metadata == w.metadata


def test_round_trip_keeps_arrays_tasks_success_and_metadata(tmp_path: Path) -> None:
    episodes = make_episodes()
    written = write(str(tmp_path / "ds"), episodes)
    info, back = read_dataset(str(tmp_path / "ds"))
    assert info == written
    assert info.fps == FPS and info.robot_type == "cartpole"
    assert info.state_names == STATE_NAMES and info.action_names == ACTION_NAMES
    assert info.tasks == ["balance the pole", "swing up"]
    assert (info.total_episodes, info.total_frames) == (3, 20 + 23 + 26)
    assert [e.success for e in back] == [False, True, False]
    assert_same_episodes(back, episodes)


def test_episodes_without_reward_or_success_read_back_as_none(tmp_path: Path) -> None:
    episodes = [Episode(e.task, e.observation_state, e.action) for e in make_episodes(2)]
    info = write(str(tmp_path / "ds"), episodes)
    assert "next.reward" not in info.features and "next.success" not in info.features
    _, back = read_dataset(str(tmp_path / "ds"))
    assert_same_episodes(back, episodes)


def test_files_are_laid_out_as_lerobot_v3_expects(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write(str(root), make_episodes())
    assert dataset_files(str(root)) == [
        "data/chunk-000/file-000.parquet",
        "meta/episodes/chunk-000/file-000.parquet",
        "meta/info.json",
        "meta/stats.json",
        "meta/tasks.parquet",
    ]
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["video_path"] is None and info["splits"] == {"train": "0:3"}
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (3, 69, 2)
    assert {"chunks_size", "data_files_size_in_mb", "video_files_size_in_mb", "robot_type", "fps"} <= set(info)
    features = info["features"]
    assert features["observation.state"] == {"dtype": "float32", "shape": [4], "names": STATE_NAMES}
    assert features["action"] == {"dtype": "float32", "shape": [2], "names": ACTION_NAMES}
    for name, dtype in [("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"), ("index", "int64"),
                        ("task_index", "int64"), ("next.reward", "float32"), ("next.done", "bool"), ("next.success", "bool")]:  # fmt: skip
        assert features[name] == {"dtype": dtype, "shape": [1], "names": None}, name

    data = pq.read_table(root / "data/chunk-000/file-000.parquet")
    schema = data.schema
    for name, typ in [("timestamp", pa.float32()), ("frame_index", pa.int64()), ("index", pa.int64()),
                      ("next.reward", pa.float32()), ("next.done", pa.bool_())]:  # fmt: skip
        assert schema.field(name).type == typ, f"{name} must be a plain scalar column, got {schema.field(name).type}"
    assert schema.field("observation.state").type == pa.list_(pa.float32(), 4)
    assert pq.ParquetFile(root / "data/chunk-000/file-000.parquet").num_row_groups == 3  # one per episode
    frame = data.column("frame_index").to_numpy()
    np.testing.assert_array_equal(frame[:20], np.arange(20))
    np.testing.assert_array_equal(frame[20:43], np.arange(23))
    np.testing.assert_array_equal(data.column("index").to_numpy(), np.arange(69))
    np.testing.assert_array_equal(data.column("timestamp").to_numpy(), (frame / FPS).astype(np.float32))
    done = data.column("next.done").to_numpy(zero_copy_only=False)
    assert np.flatnonzero(done).tolist() == [19, 42, 68]
    assert np.flatnonzero(data.column("next.success").to_numpy(zero_copy_only=False)).tolist() == [42]
    assert data.column("task_index").to_pylist()[18:22] == [0, 0, 1, 1]

    tasks = pd.read_parquet(root / "meta/tasks.parquet")
    assert tasks.index.name == "task"
    assert tasks.to_dict()["task_index"] == {"balance the pole": 0, "swing up": 1}

    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pydict()
    assert episodes["episode_index"] == [0, 1, 2]
    assert episodes["length"] == [20, 23, 26]
    assert episodes["tasks"] == [["balance the pole"], ["swing up"], ["balance the pole"]]
    assert episodes["dataset_from_index"] == [0, 20, 43] and episodes["dataset_to_index"] == [20, 43, 69]
    assert episodes["data/chunk_index"] == episodes["data/file_index"] == [0, 0, 0]
    assert episodes["meta/episodes/chunk_index"] == episodes["meta/episodes/file_index"] == [0, 0, 0]
    assert episodes["sinewgrid/seed"] == [100, 101, 102]

    stats = json.loads((root / "meta/stats.json").read_text())
    state = np.concatenate([e.observation_state for e in make_episodes()])
    np.testing.assert_allclose(stats["observation.state"]["mean"], state.mean(0), rtol=1e-5)
    assert stats["action"]["count"] == [69]


def test_one_dimensional_action_is_a_scalar_column(tmp_path: Path) -> None:
    """LeRobot reads a shape-[1] feature as a plain column; a one-element list breaks its loader."""
    episodes = make_episodes(2, action_dim=1)
    write(str(tmp_path / "ds"), episodes, action_names=["force"])
    schema = pq.read_schema(tmp_path / "ds/data/chunk-000/file-000.parquet")
    assert schema.field("action").type == pa.float32()
    info, back = read_dataset(str(tmp_path / "ds"))
    assert info.action_names == ["force"] and back[0].action.shape == (20, 1)
    assert_same_episodes(back, episodes)


def test_reads_episodes_spread_over_several_data_files(tmp_path: Path) -> None:
    """LeRobot starts a new data file (and chunk) as files grow; the episode table says where."""
    root = tmp_path / "ds"
    episodes = make_episodes(3)
    write(str(root), episodes)
    data = pq.read_table(root / "data/chunk-000/file-000.parquet")
    pq.write_table(data.slice(0, 43), root / "data/chunk-000/file-000.parquet")
    (root / "data/chunk-001").mkdir()
    pq.write_table(data.slice(43), root / "data/chunk-001/file-004.parquet")
    ep_path = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(ep_path)
    table = table.set_column(table.schema.get_field_index("data/chunk_index"), "data/chunk_index", pa.array([0, 0, 1]))
    table = table.set_column(table.schema.get_field_index("data/file_index"), "data/file_index", pa.array([0, 0, 4]))
    pq.write_table(table, ep_path)
    _, back = read_dataset(str(root))
    assert_same_episodes(back, episodes)


def test_refuses_to_overwrite_a_finished_dataset(tmp_path: Path) -> None:
    write(str(tmp_path / "ds"), make_episodes(1))
    with pytest.raises(FileExistsError, match="already holds a dataset"):
        write(str(tmp_path / "ds"), make_episodes(1))


def test_rejects_inconsistent_episodes(tmp_path: Path) -> None:
    episodes = make_episodes(2)
    episodes[1].reward = None
    with pytest.raises(ValueError, match="reward"):
        write(str(tmp_path / "a"), episodes)
    with pytest.raises(ValueError, match="state_names"):
        write_dataset(str(tmp_path / "b"), make_episodes(1), fps=FPS, robot_type="r", state_names=["x"], action_names=ACTION_NAMES)
    bad = make_episodes(1)
    bad[0].action = bad[0].action[:-1]
    with pytest.raises(ValueError, match="same T"):
        write(str(tmp_path / "c"), bad)
    assert not (tmp_path / "c/meta/info.json").exists()


def test_assemble_from_episode_files_equals_write_dataset(tmp_path: Path) -> None:
    episodes = make_episodes(4)
    direct = tmp_path / "direct"
    write(str(direct), episodes)
    tasks = ["balance the pole", "swing up"]
    # Two shards number their own episodes from 0; assembly renumbers them in list order.
    files = []
    for shard, eps in (("shard-a", episodes[:2]), ("shard-b", episodes[2:])):
        start = 0
        for i, ep in enumerate(eps):
            files.append(write_episode_file(str(tmp_path / shard), ep, i, start, tasks.index(ep.task), FPS))
            start += ep.length
    assert files[0] == str(tmp_path / "shard-a" / "episode-000000.parquet")
    assert pq.read_schema(files[0]).names == pq.read_schema(direct / "data/chunk-000/file-000.parquet").names
    info = assemble_dataset(str(tmp_path / "assembled"), files, tasks, FPS, "cartpole", STATE_NAMES, ACTION_NAMES)
    assert info == read_dataset(str(direct))[0]
    _, back = read_dataset(str(tmp_path / "assembled"))
    assert_same_episodes(back, episodes)
    for rel in dataset_files(str(direct)):
        if rel.endswith(".parquet"):
            assert pq.read_table(tmp_path / "assembled" / rel).equals(pq.read_table(direct / rel)), rel
        else:
            assert (tmp_path / "assembled" / rel).read_text() == (direct / rel).read_text(), rel
    with pytest.raises(ValueError, match="more than once"):
        assemble_dataset(str(tmp_path / "dup"), [files[0], files[0]], tasks, FPS, "cartpole", STATE_NAMES, ACTION_NAMES)


def test_works_on_an_fsspec_memory_uri() -> None:
    name = f"lerobot-test-{uuid.uuid4().hex}"
    uri = f"memory://{name}/ds"
    fs = fsspec.filesystem("memory")
    try:
        episodes = make_episodes(2)
        write(uri, episodes)
        assert "meta/info.json" in dataset_files(uri)
        _, back = read_dataset(uri)
        assert_same_episodes(back, episodes)
        path = write_episode_file(f"memory://{name}/shard", episodes[0], 0, 0, 0, FPS)
        assert path.startswith("memory://") and fs.exists(path)
        assemble_dataset(f"memory://{name}/assembled", [path], ["balance the pole"], FPS, "cartpole", STATE_NAMES, ACTION_NAMES)
        assert_same_episodes(read_dataset(f"memory://{name}/assembled")[1], episodes[:1])
    finally:
        fs.rm(f"/{name}", recursive=True)


def test_reads_frames_stored_out_of_episode_order_and_list_columns(tmp_path: Path) -> None:
    """Frames of different episodes interleaved in the data file, vectors as variable-size lists
    (how other writers may store them): every episode still reads back whole, in its frames' order."""
    episodes = make_episodes(3)
    uri = str(tmp_path / "ds")
    write(uri, episodes)
    data = tmp_path / "ds" / "data/chunk-000/file-000.parquet"
    table = pq.read_table(data)
    order = np.lexsort((table["episode_index"].to_numpy(), table["frame_index"].to_numpy()))  # frame 0 of each episode, then frame 1, …
    table = table.take(pa.array(order))
    for name in ("observation.state", "action"):
        i = table.schema.get_field_index(name)
        table = table.set_column(i, name, table.column(name).cast(pa.list_(pa.float32())))
    pq.write_table(table, data)
    _, back = read_dataset(uri)
    assert_same_episodes(back, episodes)
