"""Scripted cart-pole controllers on the common state layout (``STATE_NAMES``).

``BalancingController`` is linear state feedback (LQR-shaped) on the pole angle, its angular
velocity, the cart's position and velocity; its output is the normalised cart force, clipped to
[-1, 1]. With the default gains it keeps the pole up for 200 steps on both backends at the
default task parameters. ``NoisyOperator`` wraps any controller with Gaussian "hand" noise: the
teleoperation stand-in records demonstrations with it, so demonstrations are good but not
perfect, like a human's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from robotics_lane.sim.base import Policy


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

    def __call__(self, observation: np.ndarray) -> np.ndarray:
        x, theta, v, omega = (float(s) for s in np.asarray(observation).reshape(4))
        u = (
            self.k_angle * theta
            + self.k_angular_velocity * omega
            + self.k_position * (x - self.target_position)
            + self.k_velocity * v
        )
        return np.array([np.clip(u, -1.0, 1.0)], dtype=np.float32)


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


def zero_policy(observation: np.ndarray) -> np.ndarray:
    """No force at all: the pole falls within a few dozen steps."""
    return np.zeros(1, dtype=np.float32)
