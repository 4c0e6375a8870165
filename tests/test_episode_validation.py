"""Episode validation: a valid dataset passes; each rule catches the damage it names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from robotics_lane.episodes import Episode, validate_dataset, write_dataset
from workload_runtime.data_issues import DropIssue

DATA = "data/chunk-000/file-000.parquet"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"
LENGTHS = [20, 22, 24]  # episode 1 starts at global index 20, episode 2 at 42
FPS = 10


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    rng = np.random.default_rng(7)
    episodes = [
        Episode(
            task=["pick", "place"][i % 2],
            observation_state=rng.normal(size=(n, 3)).astype(np.float32),
            action=rng.uniform(-0.9, 0.9, size=(n, 2)).astype(np.float32),
            reward=np.zeros(n, np.float32),
            success=True,
        )
        for i, n in enumerate(LENGTHS)
    ]
    root = tmp_path / "session-1"
    write_dataset(str(root), episodes, fps=FPS, robot_type="arm", state_names=["q0", "q1", "q2"], action_names=["dq0", "dq1"])
    return root


def edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def set_cell(path: Path, column: str, row: int, value: Any, dim: int | None = None) -> None:
    """Rewrite one value of a parquet column in place (keeping the column's arrow type)."""
    table = pq.read_table(path)
    values = table.column(column).to_pylist()
    if dim is None:
        values[row] = value
    else:
        values[row][dim] = value
    i = table.schema.get_field_index(column)
    pq.write_table(table.set_column(i, table.schema.field(column), pa.array(values, table.schema.field(column).type)), path)


def issues_for(root: Path, rule: str, **kwargs: Any) -> list[DropIssue]:
    _, issues = validate_dataset(str(root), **kwargs)
    found = [i for i in issues if i.rule == rule]
    assert found, f"expected a `{rule}` issue, got {[i.describe() for i in issues]}"
    return found


def test_valid_dataset_passes(dataset: Path) -> None:
    info, issues = validate_dataset(str(dataset), expected_state_dim=3, expected_action_dim=2)
    assert issues == []
    assert info is not None and info.total_episodes == 3 and info.tasks == ["pick", "place"]


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda p: p.unlink(), "missing"),
        (lambda p: p.write_text("{not json"), "not valid UTF-8 JSON"),
        (lambda p: edit_json(p, lambda d: d.update(codebase_version="v2.1")), "'v2.1'"),
        (lambda p: edit_json(p, lambda d: d.pop("fps")), "fps"),
    ],
    ids=["missing", "not-json", "old-version", "missing-key"],
)
def test_info_json(dataset: Path, damage, needle: str) -> None:
    damage(dataset / "meta/info.json")
    info, issues = validate_dataset(str(dataset))
    assert info is None
    assert [i.rule for i in issues] == ["info_json"]
    assert needle in issues[0].message and issues[0].file == "meta/info.json"


def test_features_missing_or_wrong_dtype(dataset: Path) -> None:
    edit_json(dataset / "meta/info.json", lambda d: d["features"].pop("observation.state"))
    (issue,) = issues_for(dataset, "features")
    assert issue.column == "observation.state" and "required feature" in issue.message


def test_features_declared_dtype_unlike_data(dataset: Path) -> None:
    edit_json(dataset / "meta/info.json", lambda d: d["features"]["timestamp"].update(dtype="float64"))
    issues = issues_for(dataset, "features")
    assert any(i.column == "timestamp" and "float32" in i.message for i in issues)


def test_features_state_width_unlike_info(dataset: Path) -> None:
    edit_json(dataset / "meta/info.json", lambda d: d["features"]["observation.state"].update(shape=[5], names=None))
    (issue,) = issues_for(dataset, "features")
    assert issue.column == "observation.state" and "3 values" in issue.message and issue.file == DATA


def test_features_expected_dimensions(dataset: Path) -> None:
    issues = issues_for(dataset, "features", expected_state_dim=7, expected_action_dim=2)
    assert [(i.column, "expects 7" in i.message) for i in issues] == [("observation.state", True)]


def test_features_scalar_feature_stored_as_list(dataset: Path) -> None:
    table = pq.read_table(dataset / DATA)
    i = table.schema.get_field_index("frame_index")
    listed = pa.array([[v] for v in table.column("frame_index").to_pylist()], pa.list_(pa.int64()))
    pq.write_table(table.set_column(i, "frame_index", listed), dataset / DATA)
    (issue,) = issues_for(dataset, "features")
    assert issue.column == "frame_index" and "plain scalar column" in issue.message


def test_unreadable_parquet(dataset: Path) -> None:
    (dataset / DATA).write_bytes(b"PAR1 this is not parquet")
    (issue,) = issues_for(dataset, "unreadable_parquet")
    assert issue.file == DATA and "episodes [0, 1, 2]" in issue.message


def test_timestamps_off_the_frame_clock(dataset: Path) -> None:
    set_cell(dataset / DATA, "timestamp", 20 + 5, 0.5 + 0.01)  # episode 1, frame 5 should be 0.5 s
    (issue,) = issues_for(dataset, "timestamps")
    assert "episode 1, frame 5" in issue.message and issue.row == 25 and issue.column == "timestamp"


def test_timestamps_not_increasing(dataset: Path) -> None:
    set_cell(dataset / DATA, "timestamp", 42 + 3, 0.1)  # episode 2, frame 3 goes back in time
    issues = issues_for(dataset, "timestamps")
    assert any("episode 2, frame 3" in i.message and "does not increase" in i.message and i.row == 45 for i in issues)


def test_episode_index_not_contiguous(dataset: Path) -> None:
    set_cell(dataset / EPISODES, "episode_index", 2, 5)
    issues = issues_for(dataset, "episode_index")
    assert any("[0, 1, 5]" in i.message and "0..2" in i.message for i in issues)
    assert any("episode 2" in i.message and "does not list it" in i.message for i in issues)


def test_episode_length_disagrees_with_data(dataset: Path) -> None:
    set_cell(dataset / EPISODES, "length", 1, 30)
    issues = issues_for(dataset, "episode_index")
    assert any("episode 1 has 22 frames" in i.message and "length 30" in i.message for i in issues)


def test_frame_index_not_counting(dataset: Path) -> None:
    set_cell(dataset / DATA, "frame_index", 42 + 4, 40)
    issues = issues_for(dataset, "frame_index")
    assert [(i.row, "episode 2" in i.message, "position 4" in i.message) for i in issues] == [(46, True, True)]


@pytest.mark.parametrize(("column", "dim", "value"), [("observation.state", 2, float("nan")), ("action", 0, float("inf")), ("next.reward", None, float("nan"))])
def test_non_finite(dataset: Path, column: str, dim: int | None, value: float) -> None:
    set_cell(dataset / DATA, column, 4, value, dim)  # episode 0, frame 4
    (issue,) = issues_for(dataset, "non_finite")
    assert issue.column == column and "episode 0, frame 4" in issue.message and issue.row == 4


def test_action_bounds(dataset: Path) -> None:
    set_cell(dataset / DATA, "action", 20 + 2, 1.5, dim=1)
    (issue,) = issues_for(dataset, "action_bounds")
    assert "episode 1, frame 2" in issue.message and "dq1" in issue.message and issue.column == "action"
    assert validate_dataset(str(dataset), action_low=-2, action_high=2)[1] == []


def test_episode_length_bounds(dataset: Path) -> None:
    too_short = issues_for(dataset, "episode_length", min_length=21)
    assert [("episode 0 has 20 frames" in i.message, i.row) for i in too_short] == [(True, 0)]
    too_long = issues_for(dataset, "episode_length", max_length=21)
    assert sorted(int(i.message.split()[1]) for i in too_long) == [1, 2]


def test_tasks_unknown_task_index(dataset: Path) -> None:
    set_cell(dataset / DATA, "task_index", 42 + 7, 9)
    (issue,) = issues_for(dataset, "tasks")
    assert "episode 2, frame 7" in issue.message and "task_index 9" in issue.message and issue.row == 49


def test_tasks_table_missing(dataset: Path) -> None:
    (dataset / "meta/tasks.parquet").unlink()
    (issue,) = issues_for(dataset, "tasks")
    assert issue.file == "meta/tasks.parquet"


def test_issues_are_capped_per_rule(tmp_path: Path) -> None:
    episodes = [Episode("t", np.zeros((3, 1), np.float32), np.zeros((3, 1), np.float32)) for _ in range(30)]
    write_dataset(str(tmp_path / "ds"), episodes, fps=FPS, robot_type="r", state_names=["x"], action_names=["u"])
    issues = issues_for(tmp_path / "ds", "episode_length")
    assert len(issues) == 21
    assert "and 10 more" in issues[-1].message


def test_features_camera_stored_as_images_or_without_a_frame_size_is_refused(dataset: Path) -> None:
    cameras = {
        "observation.images.wrist": {"dtype": "image", "shape": [480, 640, 3], "names": ["height", "width", "channels"]},
        "observation.images.top": {"dtype": "video", "shape": [480, 640], "names": ["height", "width"]},
    }
    edit_json(dataset / "meta/info.json", lambda d: d["features"].update(cameras))
    issues = {i.column: i.message for i in issues_for(dataset, "features")}
    assert set(issues) == set(cameras)
    assert "only video features are accepted" in issues["observation.images.wrist"] and "use_videos=True" in issues["observation.images.wrist"]
    assert "[height, width, 3]" in issues["observation.images.top"]


def test_a_video_feature_needs_a_video_path(dataset: Path) -> None:
    camera = {"dtype": "video", "shape": [48, 64, 3], "names": ["height", "width", "channels"]}
    edit_json(dataset / "meta/info.json", lambda d: d["features"].update({"observation.images.wrist": camera}))
    (issue,) = issues_for(dataset, "video")
    assert issue.file == "meta/info.json" and "video_path is None" in issue.message and "{video_key}" in issue.message


def test_tasks_table_without_task_index(dataset: Path) -> None:
    pq.write_table(pa.table({"task": ["pick", "place"]}), dataset / "meta/tasks.parquet")
    (issue,) = issues_for(dataset, "tasks")
    assert "task_index" in issue.message


def test_unreadable_task_and_episode_tables(dataset: Path) -> None:
    (dataset / "meta/tasks.parquet").write_bytes(b"garbage")
    (dataset / EPISODES).write_bytes(b"garbage")
    issues = issues_for(dataset, "unreadable_parquet")
    assert sorted(i.file for i in issues) == [EPISODES, "meta/tasks.parquet"]


@pytest.mark.parametrize("rel", [DATA, EPISODES, "meta/tasks.parquet", "meta/info.json"])
def test_truncated_files_are_reported_not_raised(dataset: Path, rel: str) -> None:
    path = dataset / rel
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    _, issues = validate_dataset(str(dataset))
    assert issues and all(i.rule in {"info_json", "unreadable_parquet"} for i in issues), [i.describe() for i in issues]


def test_frames_out_of_episode_order_are_checked_per_episode(dataset: Path) -> None:
    """Frames of the episodes interleaved in the file: a clean dataset stays clean, and a broken
    frame is still named by its episode, its frame and its global index."""
    table = pq.read_table(dataset / DATA)
    order = np.lexsort((table["episode_index"].to_numpy(), table["frame_index"].to_numpy()))  # frame 0 of each episode, then frame 1, …
    pq.write_table(table.take(pa.array(order)), dataset / DATA)
    assert validate_dataset(str(dataset))[1] == []
    set_cell(dataset / DATA, "action", int(np.flatnonzero(order == 25)[0]), 3.0, dim=1)  # global frame 25: episode 1, frame 5
    (issue,) = issues_for(dataset, "action_bounds")
    assert issue.row == 25 and "episode 1, frame 5" in issue.message and "dim 1 (dq1)" in issue.message


def test_every_broken_episode_is_reported_once_per_rule(dataset: Path) -> None:
    for row in (3, 25, 26, 50):  # two in episode 1: one report, with the count
        set_cell(dataset / DATA, "observation.state", row, float("nan"), dim=0)
    issues = issues_for(dataset, "non_finite")
    assert [(i.row, i.message.split(":")[0]) for i in issues] == [(3, "episode 0, frame 3"), (25, "episode 1, frame 5"), (50, "episode 2, frame 8")]
    assert "(2 non-finite values in this episode)" in issues[1].message
