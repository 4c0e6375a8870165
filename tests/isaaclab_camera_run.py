"""The Isaac Lab camera runs that tests/test_isaaclab_cameras.py asserts on, in one Isaac Lab process.

Run by the test in the Isaac Lab runtime: ``.venv-isaaclab/bin/python -m tests.isaaclab_camera_run OUT.npz``.
It records raw outcomes only (each episode's observations, actions and ``front`` frames), the
test judges them:

- ``slots``: 3 envs with the front camera over ``SEEDS`` (envs take new seeds mid-run, after the
  adapter's own seeded reset);
- ``single``: 1 env with the camera over the same seeds in reverse order, then two episodes
  balancing the cart towards ±``DRIVE_TO`` metres (the cart crosses the image);
- ``no_camera``: ``slots`` again without cameras.
"""

from __future__ import annotations

import sys

import numpy as np

from robotics_lane.sim.base import TaskSpec, run_episode
from robotics_lane.sim.batch_rollout import run_episodes
from robotics_lane.sim.controllers import BalancingController, ScriptedOperator
from robotics_lane.sim.factory import make_vector_simulator
from robotics_lane.sim.vector import SingleEnv

TASK = TaskSpec(max_steps=150)
SEEDS = [3, 8, 5, 13]
OPERATOR_NOISE = 0.3
DRIVE_TO = 2.5  # metres; the front camera shows ±3.2 m
DRIVE_SEEDS = {"drive_right": (101, DRIVE_TO), "drive_left": (102, -DRIVE_TO)}


def _record(out: dict, run: str, episode) -> None:
    key = f"{run}/{episode.seed}"
    out[f"{key}/observations"] = episode.observations
    out[f"{key}/actions"] = episode.actions
    out[f"{key}/cameras"] = np.array(sorted(episode.images), dtype=str)
    for camera, frames in episode.images.items():
        out[f"{key}/{camera}"] = frames


def _rollout(out: dict, run: str, num_envs: int, seeds: list[int], cameras: tuple[str, ...]):
    with make_vector_simulator("isaaclab", TASK, num_envs=num_envs, cameras=cameras) as sim:
        policy = ScriptedOperator(BalancingController(), OPERATOR_NOISE, num_envs, TASK.max_steps)
        for episode in run_episodes(sim, policy, seeds):
            _record(out, run, episode)
        if num_envs == 1:
            single = SingleEnv(sim)
            for run_name, (seed, target) in DRIVE_SEEDS.items():
                _record(out, run_name, run_episode(single, BalancingController(target_position=target), seed))


def main(path: str) -> None:
    out: dict[str, np.ndarray] = {}
    _rollout(out, "slots", 3, SEEDS, ("front",))
    _rollout(out, "single", 1, list(reversed(SEEDS)), ("front",))
    _rollout(out, "no_camera", 3, SEEDS, ())
    np.savez(path, **out)


if __name__ == "__main__":
    main(sys.argv[1])
