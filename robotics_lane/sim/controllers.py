"""Scripted cart-pole controllers on the common state layout (``STATE_NAMES``).

``BalancingController`` is linear state feedback (LQR-shaped) on the pole angle, its angular
velocity, the cart's position and velocity; its output is the normalised cart force, clipped to
[-1, 1]. With the default gains it keeps the pole up for 200 steps on both backends at the
default task parameters. ``NoisyOperator`` wraps any controller with Gaussian "hand" noise: the
teleoperation stand-in records demonstrations with it, so demonstrations are good but not
perfect, like a human's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from robotics_lane.sim.base import Policy, TaskSpec


@dataclass
class BalancingController:
    """u = clip(k_angle·θ + k_angular_velocity·ω + k_position·(x - target) + k_velocity·v, ±1).

    Signs follow the common layout (positive pole angle leans towards +cart_position): the cart
    is pushed under a falling pole, and the position terms, positive as in LQR, first tip the
    pole towards the target so that the cart can follow it there.
    """

    # Tuned on both backends: 20/20 seeds on MuJoCo (also with noise, ±50% masses, half
    # actuator gain, 1.3 g) and 400/400 initial states of Isaac Lab's Direct task.
    k_angle: float = 6.0
    k_angular_velocity: float = 1.0
    k_position: float = 0.3
    k_velocity: float = 1.0
    target_position: float = 0.0  # metres; a target past the rail's end drives the cart out of bounds

    def adapted_to(self, task: TaskSpec) -> BalancingController:
        """This controller as an expert who knows the robot's actuator drives it: a teleoperator
        at a robot whose motor is weaker feels the cart respond late and pushes harder; a
        privileged expert in a randomised simulation is told each episode's actuator gain. Every
        gain is divided by the task's ``actuator_gain`` (the force commanded is then the force the
        nominal controller would have asked for, up to the actuator's limit)."""
        gain = task.param("actuator_gain")
        if gain <= 0:
            raise ValueError(f"task {task.key()}: actuator_gain is 0; no operator can balance a robot whose motor gives no force")
        return replace(
            self, k_angle=self.k_angle / gain, k_angular_velocity=self.k_angular_velocity / gain,
            k_position=self.k_position / gain, k_velocity=self.k_velocity / gain,
        )

    def __call__(self, observation: np.ndarray) -> np.ndarray:
        """One observation (4,) -> one action (1,)."""
        return self.batch(np.asarray(observation).reshape(1, 4))[0]

    def batch(self, observations: np.ndarray) -> np.ndarray:
        """(N, 4) observations -> (N, 1) actions, in one numpy expression over all envs."""
        obs = np.asarray(observations, dtype=np.float64)
        x, theta, v, omega = obs[:, 0], obs[:, 1], obs[:, 2], obs[:, 3]
        u = (
            self.k_angle * theta
            + self.k_angular_velocity * omega
            + self.k_position * (x - self.target_position)
            + self.k_velocity * v
        )
        return np.clip(u, -1.0, 1.0).astype(np.float32).reshape(-1, 1)


class NoisyOperator:
    """A controller plus Gaussian operator noise (std ``noise_std`` in normalised force units).

    Seeded, so the same seed and observations give the same actions; ``reseed`` starts a fresh,
    reproducible noise stream (e.g. one per episode).
    """

    def __init__(self, controller: Policy, noise_std: float, seed: int) -> None:
        if noise_std < 0:
            raise ValueError(f"NoisyOperator.noise_std must be >= 0, got {noise_std}")
        self.controller = controller
        self.noise_std = float(noise_std)
        self._rng = np.random.default_rng(seed)

    def reseed(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def __call__(self, observation: np.ndarray) -> np.ndarray:
        action = np.asarray(self.controller(observation), dtype=np.float64)
        noisy = action + self._rng.normal(0.0, self.noise_std, size=action.shape)
        return np.clip(noisy, -1.0, 1.0).astype(np.float32)


class ScriptedOperator:
    """The batch form of ``NoisyOperator`` (a ``BatchPolicy`` for ``run_episodes``): the
    controller over all envs at once, plus operator noise seeded per episode.

    Each episode's noise is drawn when it starts, from a Generator seeded with the episode's
    seed: the same draws, in the same order, as ``NoisyOperator(controller, noise_std, seed)``
    acting once per step, so an episode gets the same actions in any env slot.
    """

    def __init__(self, controller: BalancingController, noise_std: float, num_envs: int, max_steps: int) -> None:
        if noise_std < 0:
            raise ValueError(f"ScriptedOperator.noise_std must be >= 0, got {noise_std}")
        self.controller = controller
        self.noise_std = float(noise_std)
        self._rows = np.arange(num_envs)
        self._noise = np.zeros((num_envs, max_steps)) if noise_std > 0 else None

    def start(self, envs: np.ndarray, seeds: np.ndarray) -> None:
        if self._noise is None:
            return
        for env in np.flatnonzero(envs):  # once per episode
            self._noise[env] = np.random.default_rng(int(seeds[env])).normal(0.0, self.noise_std, self._noise.shape[1])

    def __call__(self, observations: np.ndarray, steps: np.ndarray) -> np.ndarray:
        action = self.controller.batch(observations)
        if self._noise is None:
            return action
        noise = self._noise[self._rows, np.minimum(steps, self._noise.shape[1] - 1)]
        return np.clip(action[:, 0].astype(np.float64) + noise, -1.0, 1.0).astype(np.float32).reshape(-1, 1)


def zero_policy(observation: np.ndarray) -> np.ndarray:
    """No force at all: the pole falls within a few dozen steps."""
    return np.zeros(1, dtype=np.float32)
