"""Per-frame rules of a LeRobot v3.0 data file, checked for every episode at once.

A data file's frames are grouped by `episode_index` once (they are already grouped when
LeRobot or `write_dataset` wrote them); each rule is then one numpy expression over all
frames, reduced per episode to its first offending frame and a count. Python looks only at
the episodes that break a rule, to say which frame and what to fix (first offence per rule,
as `validate_dataset` documents).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from robotics_lane.episodes.layout import ACTION, REWARD, STATE, TASKS_PATH
from workload_runtime.data_issues import DropIssue

TIMESTAMP_TOLERANCE_S = 1e-3


@dataclass(frozen=True)
class Limits:
    """What one dataset's frames are checked against."""

    fps: int
    action_bounds: tuple[float, float]
    length_range: tuple[int, int]
    dim_names: dict[str, list[str]]
    task_indices: set[int] | None  # None when tasks.parquet could not be read
    dataset: str  # the folder, named in messages about a whole episode


class _Groups:
    """Frames grouped by episode: the file's columns in episode order, and where each episode starts."""

    def __init__(self, data: dict[str, np.ndarray]) -> None:
        episode = data["episode_index"]
        if episode.size and not np.all(
            episode[1:] >= episode[:-1]
        ):  # stable: frames keep their file order
            order = np.argsort(episode, kind="stable")
            data = {name: values[order] for name, values in data.items()}
            episode = data["episode_index"]
        self.data = data
        self.ids, self.starts, self.counts = np.unique(
            episode, return_index=True, return_counts=True
        )
        self.group = np.repeat(
            np.arange(self.ids.size), self.counts
        )  # group number of each frame
        self.position = (
            np.arange(episode.size) - self.starts[self.group]
        )  # frame's place within its episode

    def first(self, bad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per group: the first offending frame (-1 when none) and how many offend."""
        at = np.flatnonzero(bad)
        first = np.full(self.ids.size, -1, dtype=np.int64)
        first[self.group[at][::-1]] = at[
            ::-1
        ]  # the last write wins: write the earliest frame last
        return first, np.bincount(self.group[at], minlength=self.ids.size)


def check_frames(
    data: dict[str, np.ndarray], ep_rows: list[dict], rel: str, limits: Limits
) -> list[DropIssue]:
    """Every per-episode and per-frame rule for the episodes `ep_rows` says live in this data file."""
    groups = _Groups(data)
    issues: list[DropIssue] = []
    table = {
        key: np.array([r[key] for r in ep_rows], dtype=np.int64)
        for key in ("episode_index", "length", "dataset_from_index", "dataset_to_index")
    }
    for g in np.flatnonzero(~np.isin(groups.ids, table["episode_index"])):
        msg = f"frames of episode {int(groups.ids[g])} are in this file but the episode table does not list it here; add its row or remove the frames."
        issues.append(
            DropIssue(
                "episode_index",
                msg,
                rel,
                int(groups.data["index"][groups.starts[g]]),
                column="episode_index",
            )
        )
    offences = _offences(groups, limits)
    # Each listed episode's group, and whether anything about it is wrong: all episodes at once.
    g = np.searchsorted(groups.ids, table["episode_index"])
    present = (
        (g < groups.ids.size)
        & (groups.ids[np.minimum(g, groups.ids.size - 1)] == table["episode_index"])
        if groups.ids.size
        else np.zeros(len(ep_rows), dtype=bool)
    )
    g = np.where(present, np.minimum(g, max(groups.ids.size - 1, 0)), 0)
    n = np.where(present, groups.counts[g] if groups.ids.size else 0, 0)
    low, high = limits.length_range
    wrong = ~present | (n != table["length"]) | (n < low) | (n > high)
    if groups.ids.size:
        index = groups.data["index"]
        first, last = (
            np.minimum.reduceat(index, groups.starts),
            np.maximum.reduceat(index, groups.starts) + 1,
        )
        wrong |= (
            (first[g] != table["dataset_from_index"])
            | (last[g] != table["dataset_to_index"])
            | (last[g] - first[g] != n)
        )
        for offending, _ in offences.values():
            wrong |= offending[g] >= 0
    for position in np.flatnonzero(
        wrong
    ):  # only the episodes that break a rule are looked at one by one
        row = ep_rows[position]
        issues += (
            _episode_issues(row, groups, int(g[position]), offences, rel, limits)
            if present[position]
            else _no_frames(row, rel, limits)
        )
    return issues


def _offences(
    groups: _Groups, limits: Limits
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per rule: the first offending frame of each episode (-1: none) and the count the message gives."""
    data, same_episode = groups.data, groups.position[1:] > 0
    fi, ts = data["frame_index"], data["timestamp"].astype(np.float64)
    found = {
        "frame_index": groups.first(fi != groups.position),
        "timestamps_back": groups.first(
            np.concatenate(([False], (np.diff(ts) <= 0) & same_episode))
        ),
        "timestamps_off": groups.first(
            np.abs(ts - fi / limits.fps) > TIMESTAMP_TOLERANCE_S
        ),
    }
    for name in (f for f in (STATE, ACTION, REWARD) if f in data):
        values = data[name].reshape(len(fi), -1)
        bad = ~np.isfinite(values)
        first, _ = groups.first(bad.any(axis=1))
        found[f"non_finite:{name}"] = (
            first,
            np.bincount(
                groups.group, weights=bad.sum(axis=1), minlength=groups.ids.size
            ).astype(np.int64),
        )
    lo, hi = limits.action_bounds
    with np.errstate(invalid="ignore"):
        outside = (data[ACTION].reshape(len(fi), -1) < lo) | (
            data[ACTION].reshape(len(fi), -1) > hi
        )
    first, _ = groups.first(outside.any(axis=1))
    found["action_bounds"] = (
        first,
        np.bincount(
            groups.group, weights=outside.sum(axis=1), minlength=groups.ids.size
        ).astype(np.int64),
    )
    if limits.task_indices is not None:
        found["tasks"] = groups.first(
            ~np.isin(data["task_index"], list(limits.task_indices))
        )
    return found


def _no_frames(row: dict, rel: str, limits: Limits) -> list[DropIssue]:
    """Zero frames: nothing to learn from, and LeRobot cannot index it."""
    ep = row["episode_index"]
    msg = (
        f"episode {ep} of {limits.dataset} has no frames in this file (the episode table says length {row['length']}); an "
        "episode needs at least one frame: write its frames, or remove its row and renumber the later episodes."
    )
    return [
        DropIssue("episode_length" if row["length"] == 0 else "episode_index", msg, rel)
    ]


def _span(groups: _Groups, g: int) -> tuple[int, int]:
    index = groups.data["index"][groups.starts[g] : groups.starts[g] + groups.counts[g]]
    return int(index.min()), int(index.max()) + 1


def _episode_issues(
    row: dict, groups: _Groups, g: int, offences: dict, rel: str, limits: Limits
) -> list[DropIssue]:
    """The issues of one episode that breaks a rule, in the order the rules are documented."""
    ep, n, start = row["episode_index"], int(groups.counts[g]), int(groups.starts[g])
    data = groups.data
    index, fi, ts = (
        data["index"],
        data["frame_index"],
        data["timestamp"].astype(np.float64),
    )
    issues: list[DropIssue] = []

    def at(
        rule: str, k: int, column: str | None, msg: str
    ) -> None:  # a problem at frame k of the file
        issues.append(
            DropIssue(
                rule,
                f"episode {ep}, frame {int(fi[k])}: {msg}",
                rel,
                int(index[k]),
                column=column,
            )
        )

    def whole(
        rule: str, column: str | None, msg: str
    ) -> None:  # a problem with the whole episode
        issues.append(
            DropIssue(
                rule, f"episode {ep} {msg}", rel, int(index[start]), column=column
            )
        )

    if n != row["length"]:
        whole(
            "episode_index",
            None,
            f"has {n} frames but the episode table says length {row['length']}; make the table match the data.",
        )
    span = _span(groups, g)
    if (
        span != (row["dataset_from_index"], row["dataset_to_index"])
        or span[1] - span[0] != n
    ):
        whole(
            "episode_index",
            "index",
            f"has frames with index {span[0]}..{span[1] - 1} but the episode table says dataset_from_index "
            f"{row['dataset_from_index']} / dataset_to_index {row['dataset_to_index']}; "
            "`index` must count frames across the dataset without gaps.",
        )
    low, high = limits.length_range
    if not low <= n <= high:
        whole(
            "episode_length",
            None,
            f"has {n} frames ({n / limits.fps:.2f} s); episodes must have {low}..{high} frames. "
            "Drop it or split/merge the recording.",
        )
    if (k := int(offences["frame_index"][0][g])) >= 0:
        p = k - start
        at(
            "frame_index",
            k,
            "frame_index",
            f"frame_index at position {p} is {int(fi[k])}, expected {p}; "
            f"frame_index must count 0..{n - 1} within each episode, in recording order.",
        )
    if (k := int(offences["timestamps_back"][0][g])) >= 0:
        at(
            "timestamps",
            k,
            "timestamp",
            f"timestamp {ts[k]:.4f} s does not increase after {ts[k - 1]:.4f} s; "
            "timestamps must be strictly increasing within an episode.",
        )
    first, count = offences["timestamps_off"]
    if (k := int(first[g])) >= 0:
        at(
            "timestamps",
            k,
            "timestamp",
            f"timestamp {ts[k]:.4f} s but frame_index / fps = {fi[k] / limits.fps:.4f} s ({int(count[g])} frames off "
            f"by more than {TIMESTAMP_TOLERANCE_S} s); record at a fixed {limits.fps} Hz and stamp frames frame_index / fps.",
        )
    for name in (f for f in (STATE, ACTION, REWARD) if f in data):
        first, count = offences[f"non_finite:{name}"]
        if (k := int(first[g])) >= 0:
            values = data[name].reshape(len(fi), -1)[k]
            d = int(np.flatnonzero(~np.isfinite(values))[0])
            at(
                "non_finite",
                k,
                name,
                f"`{name}` {_dim(limits, name, d)} is {values[d]} ({int(count[g])} non-finite values in this "
                "episode); drop the episode or fix the sensor/controller that produced NaN/inf.",
            )
    first, count = offences["action_bounds"]
    if (k := int(first[g])) >= 0:
        (lo, hi), action = limits.action_bounds, data[ACTION].reshape(len(fi), -1)[k]
        d = int(np.flatnonzero((action < lo) | (action > hi))[0])
        at(
            "action_bounds",
            k,
            ACTION,
            f"action {_dim(limits, ACTION, d)} = {action[d]:.4g} is outside [{lo}, {hi}] ({int(count[g])} "
            "values out of bounds); normalise actions to the policy's range or clip them in the teleop mapping.",
        )
    if "tasks" in offences and (k := int(offences["tasks"][0][g])) >= 0:
        known = sorted(limits.task_indices or ())
        at(
            "tasks",
            k,
            "task_index",
            f"task_index {int(data['task_index'][k])} is not in {TASKS_PATH} (it has {known}); "
            "add the task string there or fix the frame's task_index.",
        )
    return issues


def _dim(limits: Limits, feature: str, d: int) -> str:
    labels = limits.dim_names.get(feature) or []
    return f"dim {d} ({labels[d]})" if d < len(labels) else f"dim {d}"
