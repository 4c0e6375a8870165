"""One real-robot trial summed up: the small JSON object a model labels with a failure mode.

The robot cell answers an evaluation with `trials.jsonl` (one record per trial: `trial`,
`task_id`, `seed`, `success`, `return`, `length`, `failure_mode`, `episode_index`) and the
trials' episodes as a LeRobot v3 dataset, where `observation.state[t]` is what the policy saw
before its action `t` (the real robot's sensor noise included: about 0.09 in every state
value) and `action[t]` the normalised cart force it commanded. `episode_summary` turns one
record and its episode into the payload of the `label-failure` task
(`robotics_lane/tasks/label-failure/`): numbers a person (or a model) can read a failure from.

Frames are the states *before* each step, so the last one is the state one control step
(0.04 s) before the episode ended, not the state it ended in (the cell does not record that).

Pure: no I/O, no Dagster, nothing of the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from robotics_lane.episodes.layout import Episode

# |action| at or above this is the actuator's full force (actions are clipped to [-1, 1]).
SATURATED_FORCE = 0.99
COMPLETED = "completed"  # `ended_by` of a trial that reached the task's last step
SUMMARY_FIELDS: tuple[str, ...] = (
    "trial_id",
    "policy_version",
    "task_id",
    "max_steps",
    "steps_survived",
    "seconds_survived",
    "ended_by",
    "final_cart_position_m",
    "final_pole_angle_rad",
    "final_cart_velocity_m_s",
    "final_pole_angular_velocity_rad_s",
    "max_abs_cart_position_m",
    "max_abs_pole_angle_rad",
    "force_saturated_fraction",
)


def trial_id(eval_id: str, trial: int) -> str:
    """`eval-<policy version>/trial-007`: one trial of one robot-cell evaluation."""
    return f"{eval_id}/trial-{int(trial):03d}"


def _round(value: float, digits: int = 3) -> float:
    return round(float(value), digits) + 0.0  # + 0.0: never a negative zero


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def episode_summary(
    trial: Mapping[str, Any], episode: Episode, *, eval_id: str, policy_version: str, max_steps: int, fps: int
) -> dict[str, Any]:
    """The `label-failure` payload of one trial.

    - `trial`: the trial's record from the cell's `trials.jsonl` (a dict, or a row of the
      asset's trials frame as a dict: `trials.to_dict("records")`); needs `trial`, `task_id`,
      `success`, `length`, `failure_mode`.
    - `episode`: its episode from the evaluation's LeRobot dataset
      (`read_dataset(.../episodes)[1][record["episode_index"]]`).
    - `eval_id` (the partition key), `policy_version` (the drop manifest's), `max_steps` (the
      task's, from the request: `tasks[record["task_id"]]["max_steps"]`), `fps` (the
      dataset's, `DatasetInfo.fps`: 25 for the cart-pole).

    Fields (floats rounded to 3 decimals; `final_*` are the last recorded frame):
    `trial_id`, `policy_version`, `task_id`, `max_steps`, `steps_survived` (frames),
    `seconds_survived` (frames / fps, 2 decimals), `ended_by` (the cell's failure mode,
    `pole_fell` or `cart_out_of_bounds`; `completed` for a success, `unknown` for a failure
    the record names no mode for), `final_cart_position_m`,
    `final_pole_angle_rad` (positive: the pole leans towards +x), `final_cart_velocity_m_s`,
    `final_pole_angular_velocity_rad_s` (positive: rotating towards +x),
    `max_abs_cart_position_m`, `max_abs_pole_angle_rad` (over every frame, noise included) and
    `force_saturated_fraction` (share of actions at the actuator's limit, |a| >= 0.99; 2 decimals).

    Raises ValueError when the record and the episode disagree (length, or no frames).
    """
    states = np.asarray(episode.observation_state, dtype=np.float64)
    actions = np.asarray(episode.action, dtype=np.float64).reshape(len(states), -1)
    length = int(trial["length"])
    if states.ndim != 2 or states.shape[1] != 4 or not len(states):
        raise ValueError(f"trial {trial.get('trial')}: the episode holds no (T, 4) cart-pole states (shape {states.shape})")
    if length != len(states):
        raise ValueError(f"trial {trial.get('trial')}: trials.jsonl says {length} steps, its episode holds {len(states)} frames; is it the episode at episode_index?")
    if int(fps) <= 0 or int(max_steps) <= 0:
        raise ValueError(f"fps and max_steps must be positive, got {fps} and {max_steps}")
    success = bool(trial["success"])
    mode = trial.get("failure_mode")
    ended_by = COMPLETED if success else ("unknown" if _missing(mode) or mode == "" else str(mode))
    x, theta, v, omega = (_round(value) for value in states[-1])
    return {
        "trial_id": trial_id(eval_id, int(trial["trial"])),
        "policy_version": str(policy_version),
        "task_id": str(trial["task_id"]),
        "max_steps": int(max_steps),
        "steps_survived": length,
        "seconds_survived": round(length / int(fps), 2),
        "ended_by": ended_by,
        "final_cart_position_m": x,
        "final_pole_angle_rad": theta,
        "final_cart_velocity_m_s": v,
        "final_pole_angular_velocity_rad_s": omega,
        "max_abs_cart_position_m": _round(np.abs(states[:, 0]).max()),
        "max_abs_pole_angle_rad": _round(np.abs(states[:, 1]).max()),
        "force_saturated_fraction": _round(np.mean(np.abs(actions[:, 0]) >= SATURATED_FORCE), 2),
    }
