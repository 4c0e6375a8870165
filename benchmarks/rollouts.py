"""Figure 3a: rollout harness overhead on MuJoCo (env-steps per second).

The project's rollout harness, ``make_simulator("mujoco", TaskSpec(max_steps=200))`` plus
``run_episode(sim, BalancingController(), seed)`` for N seeds, is timed against stepping the
same gymnasium environment directly: ``gymnasium.make("InvertedPendulum-v5")``,
``env.reset(seed=seed)`` and ``env.step(action)``, with the controller's gains applied to the
raw observation and the action scaled as the adapter scales it (normalised force × the motor's
control range, ``min(-low, high)`` of the action space = 3.0). MuJoCo's observation is already
in the common layout ``[cart_pos, pole_angle, cart_vel, pole_ang_vel]``, so the gains apply
to it as is. Both build their env inside the timed call (the harness builds it in
``make_simulator``), both run the same seeds for the same number of steps (checked).

A third column adds what the rollout workload (``robotics_lane/workloads/rollouts.py``) does
per finished episode to stay preemption-safe: the episode's frames as one LeRobot parquet file
(``write_episode_file``) and its JSON trial record, written atomically as the commit marker
(``write_bytes_atomic``), into a fresh local folder per repeat. Not included: the workload's
``committed_seeds`` listing and ``run.commit`` progress report after each episode.

Throughput is env steps (control steps, ``run_episode``'s episode lengths) ÷ median seconds.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from benchmarks import REPEATS, Timing, time_group
from robotics_lane.episodes.lerobot_v3 import Episode as LeRobotEpisode
from robotics_lane.episodes.shards import write_episode_file
from robotics_lane.sim.base import TaskSpec, run_episode
from robotics_lane.sim.factory import make_simulator
from robotics_lane.sim.controllers import BalancingController
from robotics_lane.sim.mujoco_backend import ENV_ID
from robotics_lane.workloads.rollout_output import episodes_folder, trial_uri
from shared_resources.runtime.storage import write_bytes_atomic

MAX_STEPS = 200
EPISODE_COUNTS = (1, 20)
TASK_LABEL = "balance the pole"  # RolloutConfig's default task label


@dataclass
class RolloutCase:
    name: str
    seeds: list[int]
    steps: int  # env steps of one call (same for harness, harness + commit and raw)


@dataclass
class RolloutResult:
    case: RolloutCase
    harness: Timing
    harness_commit: Timing
    raw: Timing

    def steps_per_s(self, timing: Timing) -> float:
        return self.case.steps / timing.median

    @property
    def harness_ratio(self) -> float:
        """Harness time as a multiple of raw stepping time (1.0 = no overhead)."""
        return self.harness.median / self.raw.median

    @property
    def commit_ratio(self) -> float:
        """Harness + per-episode commit time as a multiple of raw stepping time."""
        return self.harness_commit.median / self.raw.median

    @property
    def commit_ms_per_episode(self) -> float:
        """What committing one episode adds, from the two medians."""
        return (self.harness_commit.median - self.harness.median) / len(self.case.seeds) * 1e3

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.case.name,
            "backend": "mujoco",
            "env_id": ENV_ID,
            "episodes": len(self.case.seeds),
            "seeds": self.case.seeds,
            "max_steps": MAX_STEPS,
            "env_steps": self.case.steps,
            "harness": {
                "function": 'with make_simulator("mujoco", TaskSpec(max_steps=200)) as sim: '
                "run_episode(sim, BalancingController(), seed) for each seed",
                "env_steps_per_s": self.steps_per_s(self.harness),
                **self.harness.to_dict(),
            },
            "harness_and_commit": {
                "function": "harness + per episode write_episode_file(...) and "
                "write_bytes_atomic(trial JSON), as robotics_lane.workloads.rollouts does",
                "env_steps_per_s": self.steps_per_s(self.harness_commit),
                "commit_ms_per_episode": self.commit_ms_per_episode,
                **self.harness_commit.to_dict(),
            },
            "baseline": {
                "function": f'gymnasium.make("{ENV_ID}"); env.reset(seed); env.step(action) '
                "with BalancingController gains on the raw observation",
                "env_steps_per_s": self.steps_per_s(self.raw),
                **self.raw.to_dict(),
            },
            "ratio_harness_over_baseline": self.harness_ratio,
            "ratio_harness_and_commit_over_baseline": self.commit_ratio,
        }


def _harness(seeds: list[int]) -> int:
    steps = 0
    with make_simulator("mujoco", TaskSpec(max_steps=MAX_STEPS)) as sim:
        controller = BalancingController()
        for seed in seeds:
            steps += run_episode(sim, controller, seed).length
    return steps


def _harness_and_commit(seeds: list[int], output_uri: str) -> int:
    """The harness plus the workload's per-episode commit (episode file, then trial record)."""
    steps = 0
    task = TaskSpec(max_steps=MAX_STEPS)
    with make_simulator("mujoco", task) as sim:
        fps = max(1, round(1.0 / sim.control_dt))
        controller = BalancingController()
        for index, seed in enumerate(seeds):
            episode = run_episode(sim, controller, seed)
            steps += episode.length
            episode_file = write_episode_file(
                episodes_folder(output_uri),
                LeRobotEpisode(
                    task=TASK_LABEL,
                    observation_state=episode.observations,
                    action=episode.actions,
                    reward=episode.rewards,
                    success=episode.success,
                    metadata={"seed": seed, "failure_mode": episode.failure_mode or ""},
                ),
                episode_index=seed,
                global_index_start=0,
                task_index=0,
                fps=fps,
            )
            record = {
                "seed": seed,
                "episode_index": index,
                "episode_file": episode_file,
                "backend": "mujoco",
                "task": task.name,
                "task_key": task.key(),
                "task_params": dict(task.params),
                "success": bool(episode.success),
                "return": float(np.sum(episode.rewards)),
                "length": int(episode.length),
                "failure_mode": episode.failure_mode,
                "fps": fps,
            }
            write_bytes_atomic(trial_uri(output_uri, seed), json.dumps(record).encode())
    return steps


def _raw(seeds: list[int]) -> int:
    """The same env stepped directly: same seeds, same gains, same action scaling."""
    c = BalancingController()
    steps = 0
    env = gym.make(ENV_ID)
    try:
        low, high = env.action_space.low[0], env.action_space.high[0]
        force_scale = float(min(-low, high))
        for seed in seeds:
            obs, _ = env.reset(seed=seed)
            for _ in range(MAX_STEPS):
                x, theta, v, omega = (float(s) for s in obs)
                u = c.k_angle * theta + c.k_angular_velocity * omega + c.k_position * (x - c.target_position) + c.k_velocity * v
                u = min(1.0, max(-1.0, u))
                obs, _, terminated, truncated, _ = env.step(np.array([u * force_scale], dtype=np.float32))
                steps += 1
                if terminated or truncated:
                    break
    finally:
        env.close()
    return steps


class _FreshFolder:
    """A new empty output folder per repeat (made and removed outside the timed region)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.current: Path | None = None

    def make(self) -> None:
        self.current = Path(tempfile.mkdtemp(dir=self.root))

    def remove(self) -> None:
        if self.current is not None:
            shutil.rmtree(self.current, ignore_errors=True)
            self.current = None

    @property
    def uri(self) -> str:
        assert self.current is not None
        return str(self.current / "rollouts")


def _check_same_steps(case_name: str, seeds: list[int], folder: Path) -> int:
    """All three must run every seed to the end (the controller balances) for the same steps."""
    harness = _harness(seeds)
    committed = _harness_and_commit(seeds, str(folder / "rollouts"))
    raw = _raw(seeds)
    expected = len(seeds) * MAX_STEPS
    if not harness == committed == raw == expected:
        raise RuntimeError(
            f"'{case_name}': env steps differ (harness {harness}, harness + commit {committed}, "
            f"raw {raw}, expected {expected}); the figure would compare different work"
        )
    trials = sorted(p.name for p in (folder / "rollouts" / "trials").glob("seed-*.json"))
    files = sorted(p.name for p in (folder / "rollouts" / "episodes").glob("episode-*.parquet"))
    if len(trials) != len(seeds) or len(files) != len(seeds):
        raise RuntimeError(f"'{case_name}': {len(files)} episode files and {len(trials)} trial records for {len(seeds)} seeds")
    return expected


def run(repeats: int = REPEATS) -> list[RolloutResult]:
    results = []
    root = Path(tempfile.mkdtemp(prefix="sinewgrid-bench-rollouts-"))
    try:
        for count in EPISODE_COUNTS:
            seeds = list(range(count))
            name = f"{count} episode{'s' if count > 1 else ''}"
            check_folder = Path(tempfile.mkdtemp(dir=root))
            steps = _check_same_steps(name, seeds, check_folder)
            shutil.rmtree(check_folder, ignore_errors=True)

            folder = _FreshFolder(root)
            harness, harness_commit, raw = time_group(
                [
                    lambda: _harness(seeds),
                    lambda: _harness_and_commit(seeds, folder.uri),
                    lambda: _raw(seeds),
                ],
                repeats=repeats,
                before_each=folder.make,
                after_each=folder.remove,
            )
            results.append(RolloutResult(RolloutCase(name, seeds, steps), harness, harness_commit, raw))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results
