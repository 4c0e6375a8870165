"""Vectorised simulation: many envs per process, each episode depending only on its seed.

MuJoCo runs here in the main venv (gymnasium's vector env); Isaac Lab's vectorised path is
checked by its self-test in tests/test_simulators.py.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pydantic
import pytest

from robotics_lane.sim import BalancingController, NoisyOperator, TaskSpec
from robotics_lane.sim.batch_rollout import run_episodes
from robotics_lane.sim.controllers import ScriptedOperator
from robotics_lane.sim.factory import (
    default_num_envs,
    make_vector_simulator,
    resolve_device,
)
from robotics_lane.sim.mujoco_backend import ENV_ID
from robotics_lane.workloads.config import RolloutConfig

TASK = TaskSpec(
    max_steps=60, params={"pole_mass_scale": 1.2, "observation_noise": 0.01}
)


def rollout(
    num_envs: int, seeds: list[int], noise: float = 0.2, task: TaskSpec = TASK
) -> dict:
    with make_vector_simulator("mujoco", task, num_envs=num_envs) as sim:
        policy = ScriptedOperator(
            BalancingController(), noise, num_envs, task.max_steps
        )
        return {e.seed: e for e in run_episodes(sim, policy, seeds)}


def same(a, b) -> bool:
    return (
        np.array_equal(a.observations, b.observations)
        and np.array_equal(a.actions, b.actions)
        and np.array_equal(a.rewards, b.rewards)
        and np.array_equal(a.final_observation, b.final_observation)
        and (a.success, a.failure_mode) == (b.success, b.failure_mode)
    )


def test_an_episode_depends_only_on_its_seed_not_on_env_slot_or_count():
    seeds = [11, 3, 7, 20, 5, 8, 13]
    one, three = rollout(1, seeds), rollout(3, seeds)
    reordered = rollout(4, list(reversed(seeds)))  # other slots, other neighbours
    assert sorted(one) == sorted(three) == sorted(reordered) == sorted(seeds)
    assert all(same(one[s], three[s]) and same(one[s], reordered[s]) for s in seeds)
    assert not same(one[11], one[3])


def test_vectorised_episodes_equal_plain_gymnasium_stepping_with_the_noisy_operator():
    # The reference is gymnasium's single env and the one-env NoisyOperator, no project adapter.
    task = TaskSpec(max_steps=60)
    seeds = [4, 9, 2]
    vector = rollout(2, seeds, noise=0.3, task=task)
    env = gym.make(ENV_ID)
    try:
        for seed in seeds:
            operator = NoisyOperator(BalancingController(), 0.3, seed=seed)
            obs, _ = env.reset(seed=seed)
            for t in range(task.max_steps):
                assert np.array_equal(
                    vector[seed].observations[t], obs.astype(np.float32)
                )
                action = operator(obs.astype(np.float32))
                assert np.array_equal(vector[seed].actions[t], action)
                obs, _, terminated, _, _ = env.step(
                    np.array([float(action[0]) * 3.0], dtype=np.float32)
                )
                assert not terminated
    finally:
        env.close()
    assert all(e.success and e.length == task.max_steps for e in vector.values())


class HalfFailing:
    """Pushes hard one way in envs running an even seed (they fail fast), balances the others."""

    def __init__(self, num_envs: int) -> None:
        self.seeds = np.zeros(num_envs, dtype=np.int64)

    def start(self, envs: np.ndarray, seeds: np.ndarray) -> None:
        self.seeds[envs] = seeds[envs]

    def __call__(self, observations: np.ndarray, steps: np.ndarray) -> np.ndarray:
        balance = BalancingController().batch(observations)
        return np.where((self.seeds % 2 == 0)[:, None], np.float32(1.0), balance)


def test_episodes_come_out_as_they_end_and_every_seed_exactly_once():
    seeds = list(range(10))
    with make_vector_simulator("mujoco", TaskSpec(max_steps=80), num_envs=4) as sim:
        episodes = list(run_episodes(sim, HalfFailing(4), seeds))
    assert sorted(e.seed for e in episodes) == seeds
    # the first episodes out are the failing ones of the first four seeds: they ended first
    assert {e.seed for e in episodes[:2]} == {0, 2}
    for e in episodes:
        if e.seed % 2 == 0:
            assert (
                not e.success
                and e.failure_mode in ("pole_fell", "cart_out_of_bounds")
                and e.length < 80
            )
            assert e.rewards[-1] == 0 and e.rewards[:-1].sum() == e.length - 1
        else:
            assert e.success and e.length == 80 and e.failure_mode is None


def test_more_envs_than_seeds_leaves_the_spare_envs_parked():
    episodes = rollout(5, [1, 2], task=TaskSpec(max_steps=30))
    assert sorted(episodes) == [1, 2] and all(e.length == 30 for e in episodes.values())
    assert same(episodes[1], rollout(1, [1], task=TaskSpec(max_steps=30))[1])


def test_bad_inputs_get_clear_errors():
    for bad in (0, -3, True, "4", 2.0):
        with pytest.raises(ValueError, match="num_envs must be an integer from 1"):
            make_vector_simulator("mujoco", TaskSpec(), num_envs=bad)  # type: ignore[arg-type]
    with make_vector_simulator("mujoco", TaskSpec(), num_envs=3) as sim:
        with pytest.raises(RuntimeError, match="call reset"):
            sim.step(np.zeros((3, 1)))
        sim.reset(np.array([1, 2, 3]))
        with pytest.raises(ValueError, match=r"shape \(3, 1\)"):
            sim.step(np.zeros((2, 1)))
        with pytest.raises(ValueError, match=r"envs \[1\]"):
            sim.step(np.array([[0.0], [np.nan], [0.0]]))
        with pytest.raises(ValueError, match="one entry per env"):
            sim.reset(np.array([1, 2]))
        with pytest.raises(ValueError, match="distinct"):
            next(
                run_episodes(
                    sim, ScriptedOperator(BalancingController(), 0.0, 3, 200), [1, 1]
                )
            )


def test_device_and_env_count_choice():
    assert resolve_device("mujoco", "auto") == "cpu"
    with pytest.raises(ValueError, match="CPU only"):
        resolve_device("mujoco", "cuda:0")
    with pytest.raises(ValueError, match="'auto', 'cpu', 'cuda' or 'cuda:<index>'"):
        resolve_device("isaaclab", "gpu")
    import torch

    assert resolve_device("isaaclab", "auto") == (
        "cuda:0" if torch.cuda.is_available() else "cpu"
    )
    assert resolve_device("isaaclab", "cuda:1") == "cuda:1"
    assert (
        default_num_envs("isaaclab", "cuda:0") == 4096
        and default_num_envs("isaaclab", "cpu") == 256
    )
    assert (
        default_num_envs("mujoco", "cpu", episodes=5) == 5
    )  # never more envs than episodes


def test_rollout_config_refuses_bad_env_counts_and_devices():
    base = {"backend": "mujoco", "seeds": [1], "output_uri": "/tmp/x"}
    assert (
        RolloutConfig(**base).num_envs is None
        and RolloutConfig(**base).device == "auto"
    )
    for field, value in (("num_envs", 0), ("num_envs", 1.5), ("device", "gpu")):
        with pytest.raises(pydantic.ValidationError, match=field):
            RolloutConfig(**base, **{field: value})
    with pytest.raises(
        pydantic.ValidationError, match="MuJoCo backend runs on the CPU only"
    ):
        RolloutConfig(**base, device="cuda")
    assert (
        RolloutConfig(
            **{**base, "backend": "isaaclab"}, device="cuda:0", num_envs=4096
        ).num_envs
        == 4096
    )


def test_observation_noise_is_drawn_from_each_episodes_seed_step_by_step():
    noisy, clean = (
        TaskSpec(max_steps=20, params={"observation_noise": 0.05}),
        TaskSpec(max_steps=20),
    )
    seeds, zeros = np.array([5, 6]), np.zeros((2, 1))
    with (
        make_vector_simulator("mujoco", noisy, num_envs=2) as a,
        make_vector_simulator("mujoco", clean, num_envs=2) as b,
    ):
        differences = [a.reset(seeds) - b.reset(seeds)]
        differences += [
            a.step(zeros).observations - b.step(zeros).observations for _ in range(10)
        ]
    got = np.stack(differences)  # (steps + 1, envs, 4)
    for env, seed in enumerate(seeds):
        expected = np.random.default_rng(int(seed)).normal(0.0, 0.05, (21, 4))[:11]
        assert np.allclose(got[:, env], expected, atol=1e-6)
