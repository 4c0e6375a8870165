"""Figure 3a: rollout harness overhead on MuJoCo, vectorised (env-steps per second).

The project's rollout harness, ``make_vector_simulator("mujoco", TaskSpec(max_steps=200),
num_envs=N)`` plus ``run_episodes(sim, ScriptedOperator(BalancingController(), 0, N, 200),
seeds)``, is timed against stepping **the same vectorised env** directly: gymnasium's own
``gymnasium.make_vec("InvertedPendulum-v5", num_envs=N, vectorization_mode="sync",
max_episode_steps=201)`` (what the adapter builds), ``env.reset(seed=[...N seeds])`` and
``env.step(actions)`` for 200 steps per round of N seeds, with the controller's gains applied
to the (N, 4) raw observation in one numpy expression and the action scaled as the adapter
scales it (normalised force × the motor's control range, ``min(-low, high)`` = 3.0). MuJoCo's
observation is already in the common layout, so the gains apply to it as is. Both build their
env inside the timed call, both run the same seeds for the same number of env steps (checked).

A third column adds what the rollout workload does per finished episode to stay
preemption-safe: ``robotics_lane.workloads.rollouts.commit_episode`` (the episode's frames as one
LeRobot parquet file, then its JSON trial record written atomically as the commit marker), into
a fresh local folder per repeat. Not included: the workload's ``committed_seeds`` listing and
``run.commit`` progress report after each episode.

Throughput is env steps (the episodes' lengths, summed over envs) ÷ median seconds.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from benchmarks import REPEATS, Timing, time_group
from robotics_lane.sim.base import TaskSpec
from robotics_lane.sim.batch_rollout import run_episodes
from robotics_lane.sim.controllers import BalancingController, ScriptedOperator
from robotics_lane.sim.factory import DEFAULT_NUM_ENVS, make_vector_simulator
from robotics_lane.sim.mujoco_backend import ENV_ID
from robotics_lane.workloads.config import RolloutConfig
from robotics_lane.workloads.rollouts import commit_episode

MAX_STEPS = 200
DEFAULT_ENVS = DEFAULT_NUM_ENVS[("mujoco", "cpu")]
# (envs, episodes): the default env count, fewer envs, and one env: the harness costs a fixed
# amount of numpy work per step, which more envs per step share.
CASES = ((DEFAULT_ENVS, 2 * DEFAULT_ENVS), (16, 64), (1, 20))


@dataclass
class RolloutCase:
    name: str
    num_envs: int
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
        return (
            (self.harness_commit.median - self.harness.median)
            / len(self.case.seeds)
            * 1e3
        )

    def to_dict(self) -> dict[str, Any]:
        n = self.case.num_envs
        return {
            "case": self.case.name,
            "backend": "mujoco",
            "env_id": ENV_ID,
            "num_envs": n,
            "episodes": len(self.case.seeds),
            "seeds": self.case.seeds,
            "max_steps": MAX_STEPS,
            "env_steps": self.case.steps,
            "harness": {
                "function": f'with make_vector_simulator("mujoco", TaskSpec(max_steps=200), num_envs={n}) as sim: '
                f"run_episodes(sim, ScriptedOperator(BalancingController(), 0.0, {n}, 200), seeds)",
                "env_steps_per_s": self.steps_per_s(self.harness),
                **self.harness.to_dict(),
            },
            "harness_and_commit": {
                "function": "harness + robotics_lane.workloads.rollouts.commit_episode(...) per finished episode "
                "(LeRobot parquet file, then the atomic JSON trial record)",
                "env_steps_per_s": self.steps_per_s(self.harness_commit),
                "commit_ms_per_episode": self.commit_ms_per_episode,
                **self.harness_commit.to_dict(),
            },
            "baseline": {
                "function": f'gymnasium.make_vec("{ENV_ID}", num_envs={n}, vectorization_mode="sync"); '
                f"env.reset(seed=[{n} seeds]); env.step(actions) x 200 per round, "
                "BalancingController gains on the (N, 4) raw observation in numpy",
                "env_steps_per_s": self.steps_per_s(self.raw),
                **self.raw.to_dict(),
            },
            "ratio_harness_over_baseline": self.harness_ratio,
            "ratio_harness_and_commit_over_baseline": self.commit_ratio,
        }


def _policy(num_envs: int) -> ScriptedOperator:
    return ScriptedOperator(BalancingController(), 0.0, num_envs, MAX_STEPS)


def _harness(num_envs: int, seeds: list[int]) -> int:
    with make_vector_simulator(
        "mujoco", TaskSpec(max_steps=MAX_STEPS), num_envs=num_envs
    ) as sim:
        return sum(
            episode.length for episode in run_episodes(sim, _policy(num_envs), seeds)
        )


def _harness_and_commit(num_envs: int, seeds: list[int], output_uri: str) -> int:
    """The harness plus the workload's own per-episode commit (episode file, then trial record)."""
    task = TaskSpec(max_steps=MAX_STEPS)
    cfg = RolloutConfig(
        backend="mujoco",
        seeds=seeds,
        output_uri=output_uri,
        task={"max_steps": MAX_STEPS},
    )
    steps = 0
    with make_vector_simulator("mujoco", task, num_envs=num_envs) as sim:
        fps = max(1, round(1.0 / sim.control_dt))
        index = {seed: i for i, seed in enumerate(seeds)}
        for episode in run_episodes(sim, _policy(num_envs), seeds):
            commit_episode(cfg, task, episode, index[episode.seed], fps)
            steps += episode.length
    return steps


def _raw(num_envs: int, seeds: list[int]) -> int:
    """The same vector env stepped directly: same seeds, same gains, same action scaling."""
    c = BalancingController()
    steps = 0
    env = gym.make_vec(
        ENV_ID,
        num_envs=num_envs,
        vectorization_mode="sync",
        max_episode_steps=MAX_STEPS + 1,
    )
    try:
        low, high = env.single_action_space.low[0], env.single_action_space.high[0]
        force_scale = float(min(-low, high))
        for start in range(0, len(seeds), num_envs):
            obs, _ = env.reset(seed=seeds[start : start + num_envs])
            ended = np.zeros(num_envs, dtype=bool)
            for _ in range(MAX_STEPS):
                u = (
                    c.k_angle * obs[:, 1]
                    + c.k_angular_velocity * obs[:, 3]
                    + c.k_position * (obs[:, 0] - c.target_position)
                    + c.k_velocity * obs[:, 2]
                )
                u = np.clip(u, -1.0, 1.0) * force_scale
                obs, _, terminated, truncated, _ = env.step(
                    u.astype(np.float32).reshape(-1, 1)
                )
                ended |= terminated | truncated
            steps += (
                num_envs * MAX_STEPS if not ended.any() else -1
            )  # -1: the check below refuses it
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


def _check_same_steps(case: RolloutCase, folder: Path) -> int:
    """All three must run every seed to the end (the controller balances) for the same steps."""
    harness = _harness(case.num_envs, case.seeds)
    committed = _harness_and_commit(case.num_envs, case.seeds, str(folder / "rollouts"))
    raw = _raw(case.num_envs, case.seeds)
    expected = len(case.seeds) * MAX_STEPS
    if not harness == committed == raw == expected:
        raise RuntimeError(
            f"'{case.name}': env steps differ (harness {harness}, harness + commit {committed}, "
            f"raw {raw}, expected {expected}); the figure would compare different work"
        )
    trials = list((folder / "rollouts" / "trials").glob("seed-*.json"))
    files = list((folder / "rollouts" / "episodes").glob("episode-*.parquet"))
    if len(trials) != len(case.seeds) or len(files) != len(case.seeds):
        raise RuntimeError(
            f"'{case.name}': {len(files)} episode files and {len(trials)} trial records for {len(case.seeds)} seeds"
        )
    return expected


def run(repeats: int = REPEATS) -> list[RolloutResult]:
    results = []
    root = Path(tempfile.mkdtemp(prefix="sinewgrid-bench-rollouts-"))
    try:
        for num_envs, episodes in CASES:
            seeds = list(range(episodes))
            case = RolloutCase(
                f"{num_envs} env{'s' if num_envs > 1 else ''} × {episodes} episodes",
                num_envs,
                seeds,
                0,
            )
            check_folder = Path(tempfile.mkdtemp(dir=root))
            case.steps = _check_same_steps(case, check_folder)
            shutil.rmtree(check_folder, ignore_errors=True)

            folder = _FreshFolder(root)
            harness, harness_commit, raw = time_group(
                [
                    lambda n=num_envs, s=seeds: _harness(n, s),
                    lambda n=num_envs, s=seeds, f=folder: _harness_and_commit(
                        n, s, f.uri
                    ),
                    lambda n=num_envs, s=seeds: _raw(n, s),
                ],
                repeats=repeats,
                before_each=folder.make,
                after_each=folder.remove,
            )
            results.append(RolloutResult(case, harness, harness_commit, raw))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results
