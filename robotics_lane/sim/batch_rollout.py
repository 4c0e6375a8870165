"""Roll a policy out over many seeds on a vector simulator, yielding each episode as it ends.

``run_episodes(sim, policy, seeds)`` keeps every env busy: each env takes the next seed as soon
as its episode ends, and each finished episode is yielded at once (the rollout workload commits
it there, so a preemption loses only the episodes still running). Episodes come out in the order
they finish, not in seed order; each one depends only on its seed (see ``vector.py``).

When the simulator has cameras, each running env's frames are rendered before every step (the
frame the camera saw when the policy saw ``observations[t]``) and come out in ``Episode.images``;
they cost ``num_envs x max_steps`` frames of memory (128x96: 7.4 MB per env at 200 steps).

The policy acts on all envs at once: a ``BatchPolicy`` maps the (N, 4) observations to (N, 1)
actions, and hears when envs start new episodes (a noisy operator seeds its noise per episode).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import numpy as np

from robotics_lane.sim.base import ACTION_NAMES, STATE_NAMES, Episode
from robotics_lane.sim.camera import image_shape
from robotics_lane.sim.vector import VectorSimulatorBase, failure_mode


class BatchPolicy(Protocol):
    """A policy over all envs: ``start`` is told of new episodes, ``__call__`` acts."""

    def start(self, envs: np.ndarray, seeds: np.ndarray) -> None:
        """New episodes began in the envs of the boolean mask ``envs``, with these seeds."""

    def __call__(self, observations: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """(N, 4) observations and each env's step index in its episode -> (N, 1) actions."""


def run_episodes(
    sim: VectorSimulatorBase, policy: BatchPolicy, seeds: Sequence[int]
) -> Iterator[Episode]:
    """Run one episode per seed, ``sim.num_envs`` at a time; yield each as it finishes."""
    seeds = [int(s) for s in seeds]
    if len(set(seeds)) != len(seeds):
        raise ValueError(
            "run_episodes: seeds must be distinct (an episode is named by its seed)"
        )
    n, horizon = sim.num_envs, sim.task.max_steps
    rows = np.arange(n)
    observations = np.zeros((n, horizon, len(STATE_NAMES)), dtype=np.float32)
    actions = np.zeros((n, horizon, len(ACTION_NAMES)), dtype=np.float32)
    rewards = np.zeros((n, horizon), dtype=np.float32)
    frames = {camera: np.zeros((n, horizon, *image_shape(camera)), dtype=np.uint8) for camera in sim.cameras}
    slot_seed = np.full(n, -1, dtype=np.int64)
    running = np.zeros(n, dtype=bool)  # the env runs one of our seeds
    next_seed = 0

    def assign(free: np.ndarray) -> np.ndarray:
        """Give the next seeds to the free envs (in env order); the mask of envs that got one."""
        nonlocal next_seed
        envs = np.flatnonzero(free)[: len(seeds) - next_seed]
        slot_seed[envs] = seeds[next_seed : next_seed + len(envs)]
        next_seed += len(envs)
        started = np.zeros(n, dtype=bool)
        started[envs] = True
        return started

    started = assign(np.ones(n, dtype=bool))
    obs = sim.reset(slot_seed, started)
    policy.start(started, slot_seed)
    running |= started
    while running.any():
        steps = sim.episode_steps
        t = np.minimum(steps, horizon - 1)
        if frames:
            shown = np.flatnonzero(running)
            for camera, images in sim.render(running).items():
                frames[camera][shown, t[shown]] = images
        action = np.asarray(policy(obs, steps), dtype=np.float32).reshape(
            n, len(ACTION_NAMES)
        )
        result = sim.step(action)
        observations[rows, t] = obs
        actions[rows, t] = action
        rewards[rows, t] = result.rewards
        ended = running & (result.terminated | result.truncated)
        obs = result.observations
        if not ended.any():
            continue
        for env in np.flatnonzero(ended):  # once per finished episode, not per step
            length = int(steps[env]) + 1
            code = int(result.failure_codes[env])
            yield Episode(
                seed=int(slot_seed[env]),
                observations=observations[env, :length].copy(),
                actions=actions[env, :length].copy(),
                rewards=rewards[env, :length].copy(),
                final_observation=obs[env].copy(),
                success=not bool(result.terminated[env]),
                failure_mode=failure_mode(code),
                images={camera: f[env, :length].copy() for camera, f in frames.items()},
            )
        running &= ~ended
        started = assign(ended)
        if started.any():
            obs = sim.reset(slot_seed, started)
            policy.start(started, slot_seed)
            running |= started
