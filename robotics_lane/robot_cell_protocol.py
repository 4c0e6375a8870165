"""What the platform asks of the robot cell and of the teleoperators, as plain JSON requests.

- an evaluation request (`outbox/robot_eval/<eval_id>/request.json`): which policy checkpoint,
  which held-out tasks from which first seed, how many trials each;
- a relabelling request (`outbox/relabel/<eval_id>/request.json`): the failed trials of one
  evaluation, each with its task, seed and failure mode, for corrective demonstrations.

The Dagster assets write them (`defs/assets/real_robot.py`); the stand-ins and a rehearsal of the
loop without Dagster (`standins/loop_rehearsal.py`) write the same ones. No Dagster here.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

# Tasks the policy never trained on, run on the real robot only, from seeds no sweep or operator uses.
HELD_OUT_TASKS: list[dict[str, Any]] = [
    {"task_id": "balance-nominal", "task": {"name": "cartpole", "max_steps": 200, "params": {}}, "first_seed": 7_000_000},
    {"task_id": "balance-long-horizon", "task": {"name": "cartpole", "max_steps": 300, "params": {}}, "first_seed": 7_100_000},
]
SIM_EVAL_FIRST_SEED = 9_000_000  # `robotics/sim_evaluation`'s held-out seeds: never used by a sweep or an operator
# 20 per task: 40 trials give 95% intervals narrow enough (about ±15 points at 50%) to tell two
# policy versions apart when one is clearly better.
TRIALS_PER_TASK = 20


def eval_request(eval_id: str, policy_version: str, checkpoint_uri: str, trials_per_task: int, respond_to: str) -> dict[str, Any]:
    """The robot cell's next evaluation: every held-out task, ``trials_per_task`` trials each."""
    return {
        "eval_id": eval_id,
        "policy_version": policy_version,
        "policy_checkpoint_uri": checkpoint_uri,
        "trials_per_task": trials_per_task,
        "tasks": HELD_OUT_TASKS,
        "respond_to": respond_to,
    }


def relabel_request(eval_id: str, trials: pd.DataFrame, tasks: dict[str, dict]) -> dict[str, Any] | None:
    """The corrective demonstrations to ask for after one evaluation: one per failed trial, at its
    task (``tasks``: task id -> task). None when every trial succeeded."""
    failures = trials[~trials["success"].astype(bool)]
    if not len(failures):
        return None
    return {
        "request_id": eval_id,
        "reason": "failed real-robot trials",
        "trials": [
            {"task_id": r.task_id, "task": tasks.get(r.task_id, {}), "seed": int(r.seed), "failure_mode": r.failure_mode}
            for r in failures.itertuples()
        ],
    }
