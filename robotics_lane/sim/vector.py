"""Many cart-poles in one process: the vectorised simulator every backend implements.

A ``VectorSimulator`` holds ``num_envs`` environments that step together, one action row per
env per call, in the common layout of ``base.py`` (states ``(N, 4)`` in ``STATE_NAMES`` order,
normalised actions ``(N, 1)``). Each env runs its own episode, started with its own seed:

- ``reset(seeds, envs)`` starts a new episode in the envs named (a boolean mask), each with its
  seed; the other envs keep running.
- ``render(envs)`` gives what each camera (``cameras``, asked for when the simulator is made)
  sees now in the envs named: {camera: uint8 (k, H, W, 3)}, one frame per env of the mask.
- ``step(actions)`` advances every env by ``control_dt``. Envs with no episode open (finished
  and not reset, or never started) are *parked*: their action is ignored, their result is not
  part of any episode (``VectorStep.active`` is False for them).

Everything per step is numpy over all envs at once (clipping, gain, noise, termination and
truncation, step counting): nothing in the step loops over envs in Python. What a vectorised
run guarantees: **an episode depends only on its seed and the policy's actions** — not on the
env slot it ran in, nor on ``num_envs``, nor on what the other envs did — so a rollout resumed
with a different env count or another seed order commits the same episodes.

``SingleEnv`` is the one-env ``Simulator`` interface (``reset(seed)``, ``step(action)``) over a
vector simulator with one env; ``make_simulator`` returns one.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

import numpy as np

from robotics_lane.sim.base import (
    ACTION_NAMES,
    ADAPTER_PARAMS,
    FAILURE_MODES,
    PHYSICS_PARAMS,
    STATE_NAMES,
    StepResult,
    TaskSpec,
)
from robotics_lane.sim.camera import check_cameras

NO_FAILURE = 0  # failure codes: 0 = none, i + 1 = FAILURE_MODES[i]
POLE_FELL = 1 + FAILURE_MODES.index("pole_fell")
CART_OUT_OF_BOUNDS = 1 + FAILURE_MODES.index("cart_out_of_bounds")


def failure_mode(code: int) -> str | None:
    """The failure mode a failure code stands for (``None`` for 0)."""
    return FAILURE_MODES[code - 1] if code else None


@dataclass
class VectorStep:
    """One control step of every env. Rows of parked envs (``active`` False) mean nothing."""

    observations: (
        np.ndarray
    )  # (N, 4) float32; a terminated env's row is the state it ended in
    rewards: np.ndarray  # (N,) float32: 1 per step survived, 0 on the terminating step
    terminated: np.ndarray  # (N,) bool
    truncated: np.ndarray  # (N,) bool: reached task.max_steps without terminating
    failure_codes: np.ndarray  # (N,) int8, see ``failure_mode``
    active: np.ndarray  # (N,) bool: the env had an episode open during this step


class VectorSimulatorBase(abc.ABC):
    """The vectorised adapter shared by the backends; a backend implements three hooks.

    Hooks see forces in normalised units (clipped, times ``actuator_gain``; 0 for parked envs)
    and return states in ``STATE_NAMES`` order as float64, without noise.
    """

    backend: str = ""
    control_dt: float = 0.0
    device: str = "cpu"
    supported_physics_params: frozenset[str] = frozenset()

    def __init__(self, task: TaskSpec, num_envs: int, cameras: Sequence[str] = ()) -> None:
        self.cameras = check_cameras(cameras)
        unsupported = sorted(
            set(task.non_default_params())
            & (set(PHYSICS_PARAMS) - self.supported_physics_params)
        )
        if unsupported:
            raise ValueError(
                f"TaskSpec.params {unsupported}: not supported by the {self.backend!r} backend "
                f"(it supports {sorted(self.supported_physics_params | set(ADAPTER_PARAMS))}); "
                "drop them or run this task on another backend"
            )
        if (
            isinstance(num_envs, bool)
            or not isinstance(num_envs, (int, np.integer))
            or num_envs < 1
        ):
            raise ValueError(
                f"num_envs must be a positive integer (envs stepped together), got {num_envs!r}"
            )
        self.task = task
        self.num_envs = int(num_envs)
        self._gain = task.param("actuator_gain")
        self._noise_std = task.param("observation_noise")
        n, width = self.num_envs, len(STATE_NAMES)
        self._rows = np.arange(n)
        self._steps = np.zeros(n, dtype=np.int64)
        self._open = np.zeros(n, dtype=bool)
        self._obs = np.zeros((n, width), dtype=np.float32)
        # Observation noise, drawn per episode at reset from the episode's seed: row t is the
        # noise on the observation after t steps (the same draws, in the same order, as one
        # numpy Generator seeded with the seed and sampled once per step).
        self._noise = (
            np.zeros((n, task.max_steps + 1, width)) if self._noise_std > 0 else None
        )

    # --- backend hooks ---------------------------------------------------------------------

    @abc.abstractmethod
    def _physics_reset(self, seeds: np.ndarray, envs: np.ndarray) -> np.ndarray:
        """Start episodes in the envs of the mask ``envs`` with their ``seeds``; all N states."""

    @abc.abstractmethod
    def _physics_step(self, forces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Advance every env one control step: (N, 4) states and (N,) int8 failure codes.

        A terminated env's state is the one it ended in (before any backend auto-reset)."""

    @abc.abstractmethod
    def _physics_close(self) -> None: ...

    @abc.abstractmethod
    def _physics_render(self, envs: np.ndarray) -> dict[str, np.ndarray]:
        """Each camera's frames of the envs at the indices ``envs``: {camera: (k, H, W, 3) uint8}."""

    # --- the interface ---------------------------------------------------------------------

    @property
    def episode_open(self) -> np.ndarray:
        """(N,) bool: which envs have an episode running (a copy)."""
        return self._open.copy()

    @property
    def episode_steps(self) -> np.ndarray:
        """(N,) int: steps taken in each env's current (or last) episode (a copy)."""
        return self._steps.copy()

    def reset(
        self, seeds: np.ndarray | list[int], envs: np.ndarray | None = None
    ) -> np.ndarray:
        """Start a new episode, seeded, in each env of the boolean mask ``envs`` (all if None).

        ``seeds`` has one entry per env (entries outside the mask are ignored). Returns the
        (N, 4) observations; rows outside the mask are the envs' latest observations.
        """
        n = self.num_envs
        mask = np.ones(n, dtype=bool) if envs is None else np.asarray(envs, dtype=bool)
        seeds = np.asarray(seeds, dtype=np.int64)
        if mask.shape != (n,) or seeds.shape != (n,):
            raise ValueError(
                f"reset: seeds and envs need one entry per env ({n}), got shapes {seeds.shape} and {mask.shape}"
            )
        if not mask.any():
            return self._obs.copy()
        states = self._physics_reset(seeds, mask)
        self._steps[mask] = 0
        self._open[mask] = True
        if self._noise is not None:
            for env in np.flatnonzero(mask):  # once per episode, not per step
                self._noise[env] = np.random.default_rng(int(seeds[env])).normal(
                    0.0, self._noise_std, self._noise.shape[1:]
                )
        self._observe(states, mask)
        return self._obs.copy()

    def render(self, envs: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """What each camera sees now in the envs of the boolean mask ``envs`` (all if None):
        {camera: uint8 (k, H, W, 3)}, the k envs in env order. Empty without cameras."""
        if not self.cameras:
            return {}
        mask = np.ones(self.num_envs, dtype=bool) if envs is None else np.asarray(envs, dtype=bool)
        if mask.shape != (self.num_envs,):
            raise ValueError(f"render: envs needs one entry per env ({self.num_envs}), got shape {mask.shape}")
        return self._physics_render(np.flatnonzero(mask))

    def step(self, actions: np.ndarray) -> VectorStep:
        """Apply one normalised action per env (clipped to [-1, 1]) for ``control_dt`` seconds."""
        active = self._open.copy()
        if not active.any():
            raise RuntimeError(
                f"{self.backend} simulator: step() called with no episode running in any env "
                "(before the first reset() or after every episode ended); call reset(seeds) first"
            )
        act = np.asarray(actions, dtype=np.float64)
        if act.shape not in ((self.num_envs, len(ACTION_NAMES)), (self.num_envs,)):
            raise ValueError(
                f"actions must have shape ({self.num_envs}, {len(ACTION_NAMES)}) {ACTION_NAMES}, one row per env, got {act.shape}"
            )
        act = act.reshape(self.num_envs)
        bad = active & ~np.isfinite(act)
        if bad.any():
            raise ValueError(
                f"actions must be finite; envs {np.flatnonzero(bad).tolist()[:10]} got {act[bad][:10].tolist()}"
            )
        forces = np.where(active, np.clip(act, -1.0, 1.0) * self._gain, 0.0)
        states, codes = self._physics_step(forces)
        codes = np.where(active, codes, NO_FAILURE).astype(np.int8)
        self._steps += active
        terminated = codes != NO_FAILURE
        truncated = active & ~terminated & (self._steps >= self.task.max_steps)
        self._open = active & ~(terminated | truncated)
        self._observe(states, active)
        rewards = np.where(active & ~terminated, 1.0, 0.0).astype(np.float32)
        return VectorStep(
            self._obs.copy(), rewards, terminated, truncated, codes, active
        )

    def close(self) -> None:
        """Release the physics (for Isaac Lab, leave its simulation context)."""
        self._open[:] = False
        self._physics_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _observe(self, states: np.ndarray, envs: np.ndarray) -> None:
        obs = np.asarray(states, dtype=np.float64)
        if self._noise is not None:
            obs = (
                obs
                + self._noise[self._rows, np.minimum(self._steps, self.task.max_steps)]
            )
        self._obs[envs] = obs[envs]


class SingleEnv:
    """The one-env ``Simulator`` interface over a vector simulator built with ``num_envs=1``."""

    def __init__(self, vector: VectorSimulatorBase) -> None:
        if vector.num_envs != 1:
            raise ValueError(
                f"SingleEnv wraps a vector simulator with one env, got num_envs={vector.num_envs}"
            )
        self.vector = vector
        self.backend = vector.backend
        self.task = vector.task
        self.control_dt = vector.control_dt
        self.cameras = vector.cameras

    def reset(self, seed: int) -> np.ndarray:
        """Start an episode; the same seed gives the same initial state and noise."""
        return self.vector.reset(np.array([seed]))[0]

    def step(self, action: np.ndarray) -> StepResult:
        """Apply one normalised action (clipped to [-1, 1]) for ``control_dt`` seconds."""
        if not self.vector.episode_open[0]:
            raise RuntimeError(
                f"{self.backend} simulator: step() called with no episode running "
                "(before the first reset() or after the episode ended); call reset(seed) first"
            )
        act = np.asarray(action, dtype=np.float64).reshape(-1)
        if act.shape != (len(ACTION_NAMES),) or not np.isfinite(act).all():
            raise ValueError(
                f"action must be {len(ACTION_NAMES)} finite value(s) {ACTION_NAMES}, got {action!r}"
            )
        out = self.vector.step(act.reshape(1, 1))
        code = int(out.failure_codes[0])
        return StepResult(
            out.observations[0],
            float(out.rewards[0]),
            bool(out.terminated[0]),
            bool(out.truncated[0]),
            failure_mode(code),
        )

    def render(self) -> dict[str, np.ndarray]:
        """What each camera sees now: {camera: uint8 (H, W, 3)}; empty without cameras."""
        return {camera: frames[0] for camera, frames in self.vector.render().items()}

    def close(self) -> None:
        self.vector.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
