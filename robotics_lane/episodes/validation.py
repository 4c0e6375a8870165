"""Check a LeRobot v3.0 dataset folder (a teleop session, a rollout set) before anyone trains on it.

`validate_dataset` never raises on bad data: it returns every problem as a `DropIssue`
whose `rule` names the check, `file` is the dataset-relative file, `row` the global frame
index (the `index` column) and `column` the feature. Rules (docs/teleop-protocol.md):

- `info_json`: meta/info.json missing, not JSON, not codebase_version v3.0, keys missing.
- `features`: standard features missing or with the wrong dtype/shape; state/action
  width in the data unlike info.json or the expected dimensions; a camera declared as
  `image` (frames in the data files) or with a shape other than [H, W, 3].
- `unreadable_parquet`: a parquet file that is missing or cannot be read.
- `episode_index`: episodes not 0..N-1, or the episode table disagrees with the frames.
- `frame_index`: frame_index is not 0..length-1 within an episode.
- `timestamps`: not increasing, or not frame_index / fps within 1e-3 s.
- `non_finite`: NaN or inf in observation.state, action or next.reward.
- `action_bounds`: an action outside [action_low, action_high].
- `episode_length`: fewer than min_length or more than max_length frames; an episode with no frames.
- `no_episodes`: the dataset holds no episodes at all.
- `tasks`: tasks.parquet missing, or a frame's task_index not in it.
- `video`: a camera's MP4 file missing, undecodable, at another resolution or fps, or an
  episode's frames in it missing, extra or out of step with its rows (`video_checks`).

Each rule reports at most 20 issues, then one "… and N more". The per-frame rules run over
all frames of a data file at once (`frames`); only offending episodes are looked at one by one.
"""

from __future__ import annotations

import json
import posixpath
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa

from robotics_lane.episodes.frames import TIMESTAMP_TOLERANCE_S, Limits, check_frames  # noqa: F401 - TIMESTAMP_TOLERANCE_S is part of this module's API
from robotics_lane.episodes.layout import (
    ACTION,
    CODEBASE_VERSION,
    DATA_PATH,
    EPISODES_DIR,
    INFO_PATH,
    OPTIONAL_FEATURES,
    REWARD,
    SCALAR_FEATURES,
    STATE,
    TASKS_PATH,
    DatasetInfo,
    column_values,
    episode_table_paths,
    info_from_json,
    open_folder,
    read_info_json,
    read_table,
    read_tasks,
)
from robotics_lane.episodes.video_checks import check_videos, declared_camera_problem
from workload_runtime.data_issues import DropIssue

MAX_ISSUES_PER_RULE = 20
REQUIRED_INFO_KEYS = ("codebase_version", "fps", "features", "data_path", "total_episodes", "total_frames", "total_tasks")
REQUIRED_EPISODE_COLUMNS = ("episode_index", "length", "data/chunk_index", "data/file_index", "dataset_from_index", "dataset_to_index")
CAMERA_DTYPES = ("video", "image")


def validate_dataset(
    uri: str,
    *,
    action_low: float = -1.0,
    action_high: float = 1.0,
    min_length: int = 10,
    max_length: int = 5000,
    expected_state_dim: int | None = None,
    expected_action_dim: int | None = None,
) -> tuple[DatasetInfo | None, list[DropIssue]]:
    """Every problem with the dataset at `uri`; the DatasetInfo when info.json is usable.

    An empty list means LeRobot can load the dataset and every episode is fit to train on.
    """
    fs, root = open_folder(uri)
    try:
        info = read_info_json(fs, root)
    except FileNotFoundError:
        return None, [DropIssue("info_json", f"{INFO_PATH} is missing; a LeRobot v3.0 dataset starts with it (write it last).", INFO_PATH)]
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, [DropIssue("info_json", f"{INFO_PATH} is not valid UTF-8 JSON ({exc}); rewrite it.", INFO_PATH)]
    issues = _check_info(info)
    if issues:
        return None, issues
    features: dict = info["features"]
    issues, fatal = _check_declared_features(features, expected_state_dim, expected_action_dim)
    task_by_index, task_issues = _read_task_table(fs, root)
    issues += task_issues
    ds_info = None if fatal else info_from_json(info, [task_by_index[i] for i in sorted(task_by_index)])
    episodes, ep_issues = _read_episode_table(fs, root)
    issues += ep_issues
    if episodes is not None and episodes.num_rows == 0:
        msg = (f"the dataset {uri} holds no episodes (its episode table has no rows); record at least one episode "
               "before sealing it, or do not send an empty session.")
        issues.append(DropIssue("no_episodes", msg, posixpath.relpath(episode_table_paths(fs, root)[0], root)))
    if fatal or episodes is None or episodes.num_rows == 0:
        return ds_info, _cap(issues)
    names = {n: features[n]["names"] for n in (STATE, ACTION) if isinstance(features[n].get("names"), list)}
    limits = Limits(
        int(info["fps"]), (action_low, action_high), (min_length, max_length), names, set(task_by_index) if not task_issues else None, uri
    )
    issues += _check_data(fs, root, info, episodes, limits)
    issues += check_videos(fs, root, info, episodes.to_pylist(), uri)
    return ds_info, _cap(issues)


def _cap(issues: list[DropIssue]) -> list[DropIssue]:
    """Keep the first MAX_ISSUES_PER_RULE issues of each rule, then one summary line."""
    by_rule: dict[str, list[DropIssue]] = defaultdict(list)
    for issue in issues:
        by_rule[issue.rule].append(issue)
    out: list[DropIssue] = []
    for rule, found in by_rule.items():
        out.extend(found[:MAX_ISSUES_PER_RULE])
        if len(found) > MAX_ISSUES_PER_RULE:
            more = len(found) - MAX_ISSUES_PER_RULE
            out.append(DropIssue(rule, f"… and {more} more `{rule}` problems like the ones above; fix those and validate again."))
    return out


# --- metadata: info.json, tasks.parquet, the episode table --------------------------------


def _check_info(info: Any) -> list[DropIssue]:
    def issue(msg: str) -> DropIssue:
        return DropIssue("info_json", msg, INFO_PATH)

    if not isinstance(info, dict):
        return [issue("info.json must hold a JSON object (LeRobot's DatasetInfo).")]
    if info.get("codebase_version") != CODEBASE_VERSION:
        return [
            issue(
                f"codebase_version is {info.get('codebase_version')!r}; only {CODEBASE_VERSION!r} is accepted. Convert it with "
                "`python -m lerobot.scripts.convert_dataset_v21_to_v30` (LeRobot) or re-export as v3.0."
            )
        ]
    missing = [k for k in REQUIRED_INFO_KEYS if k not in info]
    if missing:
        return [issue(f"info.json lacks {missing}; write every key LeRobot v3.0 expects (see docs/teleop-protocol.md).")]
    issues = []
    if not isinstance(info["fps"], int) or isinstance(info["fps"], bool) or info["fps"] <= 0:
        issues.append(issue(f"fps is {info['fps']!r}; it must be a positive whole number of frames per second."))
    if not isinstance(info["features"], dict) or not all(isinstance(f, dict) for f in info["features"].values()):
        issues.append(issue("`features` must be an object mapping each feature name to {dtype, shape, names}."))
    for key in ("total_episodes", "total_frames", "total_tasks"):
        if not isinstance(info[key], int) or info[key] < 0:
            issues.append(issue(f"{key} is {info[key]!r}; it must be a whole number >= 0."))
    try:
        info["data_path"].format(chunk_index=0, file_index=0)
    except (AttributeError, KeyError, IndexError, ValueError):
        issues.append(issue(f"data_path {info['data_path']!r} is not a template with {{chunk_index}} and {{file_index}}; use {DATA_PATH!r}."))
    return issues


def _check_declared_features(features: dict, state_dim: int | None, action_dim: int | None) -> tuple[list[DropIssue], bool]:
    """Issues with info.json's features, and whether they are too broken to check the data."""
    issues: list[DropIssue] = []
    fatal = False
    required = {**SCALAR_FEATURES, STATE: "float32", ACTION: "float32"}
    for name, dtype in {**required, **OPTIONAL_FEATURES}.items():
        ft = features.get(name)
        vector = name in (STATE, ACTION)
        if ft is None and name in required:
            msg = f"required feature `{name}` is not in info.json; add it with dtype {dtype}."
        elif ft is not None and (ft.get("dtype") != dtype or not _shape_ok(ft.get("shape"), vector)):
            msg = f"`{name}` is declared as {ft!r}; it must be dtype {dtype} with shape {'[D]' if vector else '[1]'}."
        else:
            continue
        issues.append(DropIssue("features", msg, INFO_PATH, column=name))
        fatal = True
    for name, ft in features.items():
        if ft.get("dtype") in CAMERA_DTYPES and (problem := declared_camera_problem(ft)):
            issues.append(DropIssue("features", f"`{name}` {problem}", INFO_PATH, column=name))
    for name, expected in ((STATE, state_dim), (ACTION, action_dim)):
        shape = (features.get(name) or {}).get("shape")
        if expected is not None and _shape_ok(shape, vector=True) and shape[0] != expected:
            msg = (
                f"`{name}` has {shape[0]} dimensions but this robot's pipeline expects {expected}; "
                "record with the right robot config or fix the expected dimension."
            )
            issues.append(DropIssue("features", msg, INFO_PATH, column=name))
    return issues, fatal


def _shape_ok(shape: Any, vector: bool) -> bool:
    if not isinstance(shape, list | tuple) or len(shape) != 1 or not isinstance(shape[0], int):
        return False
    return shape[0] >= 1 if vector else shape[0] == 1


def _read_task_table(fs: Any, root: str) -> tuple[dict[int, str], list[DropIssue]]:
    try:
        return read_tasks(fs, root), []
    except FileNotFoundError:
        msg = f"{TASKS_PATH} is missing; write the task strings (pandas index `task`) with their `task_index`."
        return {}, [DropIssue("tasks", msg, TASKS_PATH)]
    except Exception as exc:  # noqa: BLE001 - any read failure is reported, not raised
        if isinstance(exc, ValueError) and not isinstance(exc, pa.ArrowException):  # readable, but no task_index
            msg = f"{exc} Write the task strings as the pandas index `task` beside a `task_index` column."
            return {}, [DropIssue("tasks", msg, TASKS_PATH)]
        msg = f"cannot read the task table ({type(exc).__name__}: {exc}); rewrite it with pandas `to_parquet`."
        return {}, [DropIssue("unreadable_parquet", msg, TASKS_PATH)]


def _read_episode_table(fs: Any, root: str) -> tuple[pa.Table | None, list[DropIssue]]:
    paths = episode_table_paths(fs, root)
    if not paths:
        msg = f"no episode table: {EPISODES_DIR}/chunk-000/file-000.parquet is missing; write one row per episode."
        return None, [DropIssue("unreadable_parquet", msg, EPISODES_DIR)]
    tables, issues = [], []
    for path in paths:
        try:
            tables.append(read_table(fs, path))
        except Exception as exc:  # noqa: BLE001 - any read failure is reported, not raised
            msg = f"cannot read the episode table ({type(exc).__name__}: {exc}); re-export it."
            issues.append(DropIssue("unreadable_parquet", msg, posixpath.relpath(path, root)))
    if issues:
        return None, issues
    rel = posixpath.relpath(paths[0], root)
    try:
        table = pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        return None, [DropIssue("episode_index", f"the episode table files have clashing columns ({exc}); write them with one schema.", rel)]
    missing = [c for c in REQUIRED_EPISODE_COLUMNS if c not in table.column_names]
    bad = [c for c in REQUIRED_EPISODE_COLUMNS if c not in missing and (not pa.types.is_integer(table[c].type) or table[c].null_count)]
    if missing or bad:
        msg = (
            f"the episode table lacks columns {missing} or has non-integer/empty cells in {bad}; "
            "LeRobot v3.0 needs them to find each episode's frames. Regenerate the table."
        )
        return None, [DropIssue("episode_index", msg, rel)]
    return table.sort_by("episode_index"), []


# --- frames ----------------------------------------------------------------------------


def _check_data(fs: Any, root: str, info: dict, episodes: pa.Table, limits: Limits) -> list[DropIssue]:
    """Read each data file the episode table points to and check every episode in it."""
    issues: list[DropIssue] = []
    rows = episodes.to_pylist()
    ids = [r["episode_index"] for r in rows]
    if ids != list(range(len(ids))):
        msg = f"episode indices are {_summary(ids)}; they must be 0..{len(ids) - 1}, each once."
        issues.append(DropIssue("episode_index", msg, posixpath.relpath(episode_table_paths(fs, root)[0], root)))
    frames_total = sum(r["length"] for r in rows)
    if (len(ids), frames_total) != (info["total_episodes"], info["total_frames"]):
        msg = (
            f"info.json says {info['total_episodes']} episodes / {info['total_frames']} frames but the episode table has "
            f"{len(ids)} / {frames_total}; update info.json's totals."
        )
        issues.append(DropIssue("episode_index", msg, INFO_PATH))
    features = info["features"]
    columns = [c for c in ("index", "frame_index", "timestamp", "episode_index", "task_index", STATE, ACTION, REWARD) if c in features]
    by_file: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for r in rows:
        by_file[(r["data/chunk_index"], r["data/file_index"])].append(r)
    for (chunk, file), ep_rows in sorted(by_file.items()):
        rel = info["data_path"].format(chunk_index=chunk, file_index=file)
        try:
            table = read_table(fs, posixpath.join(root, rel))
        except Exception as exc:  # noqa: BLE001 - any read failure is reported, not raised
            held = _summary([r["episode_index"] for r in ep_rows])
            msg = f"cannot read the data file holding episodes {held} ({type(exc).__name__}: {exc}); re-export it."
            issues.append(DropIssue("unreadable_parquet", msg, rel))
            continue
        column_issues = _check_columns(table, features, rel)
        issues += column_issues
        if column_issues:
            continue
        data = {c: column_values(table, c) for c in columns}
        issues += check_frames(data, ep_rows, rel, limits)
    return issues


def _check_columns(table: pa.Table, features: dict, rel: str) -> list[DropIssue]:
    """Declared columns missing, stored with another dtype, shape-[1] stored as lists, vector widths unlike info.json."""
    issues = []
    for name, ft in features.items():
        if ft.get("dtype") in CAMERA_DTYPES:
            continue
        if name not in table.column_names:
            msg = f"info.json declares `{name}` but the data file has no such column; write it for every frame or remove it from features."
            issues.append(DropIssue("features", msg, rel, column=name))
            continue
        typ = table.schema.field(name).type
        is_list = pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)
        leaf = typ.value_type if is_list else typ
        if _arrow_type(ft.get("dtype")) not in (None, leaf):
            msg = f"`{name}` is stored as {leaf} but info.json declares {ft.get('dtype')}; cast the column to {ft.get('dtype')}."
        elif list(ft.get("shape", [])) == [1] and is_list:
            msg = f"`{name}` (shape [1]) is stored as a list column ({typ}); LeRobot expects a plain scalar column."
        elif name in (STATE, ACTION) and table.num_rows:
            try:
                width = column_values(table, name).reshape(table.num_rows, -1).shape[1]
            except ValueError as exc:  # lists of different lengths
                width, msg = None, str(exc)
            if width == ft["shape"][0]:
                continue
            if width is not None:
                msg = f"`{name}` rows have {width} values but info.json declares shape {ft['shape']}; make them agree."
        else:
            continue
        issues.append(DropIssue("features", msg, rel, column=name))
    return issues


def _arrow_type(dtype: Any) -> pa.DataType | None:
    try:
        return pa.from_numpy_dtype(np.dtype(dtype))
    except (TypeError, pa.ArrowNotImplementedError):
        return None


def _summary(values: list[int]) -> str:
    return str(values) if len(values) <= 8 else f"[{', '.join(map(str, values[:8]))}, … ({len(values)} in all)]"
