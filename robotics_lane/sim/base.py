"""The simulator interface the Robotics lane codes against, whatever physics runs underneath.

Every backend speaks the same cart-pole language:

- state: a (4,) float32 vector in ``STATE_NAMES`` order (metres, radians, m/s, rad/s). The pole
  angle is 0 when upright and positive when the pole's tip leans towards +cart_position, so
  pushing the cart in the direction of a positive angle catches the pole.
- action: a (1,) vector in ``ACTION_NAMES`` order, normalised to [-1, 1] (clipped); each
  backend scales it to its own actuator's force.
- an episode succeeds when it reaches ``task.max_steps`` without termination; a terminated
  step names its ``failure_mode`` (``"pole_fell"`` or ``"cart_out_of_bounds"``).

``SimulatorBase`` does the backend-independent part (clipping, actuator gain, observation
noise, step counting, truncation, refusing to step a finished episode) so both backends treat
the task parameters identically. Nothing here imports Dagster, MuJoCo or Isaac Lab.
"""

from __future__ import annotations

import abc
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Callable, Literal, Protocol, runtime_checkable

import numpy as np

STATE_NAMES: list[str] = ["cart_position", "pole_angle", "cart_velocity", "pole_angular_velocity"]
ACTION_NAMES: list[str] = ["cart_force"]
FAILURE_MODES: tuple[str, ...] = ("pole_fell", "cart_out_of_bounds")

Backend = Literal["mujoco", "isaaclab"]
KNOWN_BACKENDS: tuple[str, ...] = ("mujoco", "isaaclab")


class BackendUnavailableError(RuntimeError):
    """The backend cannot run in this Python (wrong runtime, or its packages are missing)."""


# Parameters every backend applies the same way, in the adapter (not in the physics).
ADAPTER_PARAMS: dict[str, str] = {
    "actuator_gain": "multiplies the normalised action before the backend scales it (1.0 = nominal, 0 = no force)",
    "observation_noise": "std of Gaussian noise added to each observed state value (seeded at reset)",
}
# Parameters that change the physics; each backend says which of them it supports.
PHYSICS_PARAMS: dict[str, str] = {
    "pole_mass_scale": "multiplies the pole's mass",
    "cart_mass_scale": "multiplies the cart's mass",
    "gravity_scale": "multiplies gravity",
}
# The tasks that exist, with the parameters each accepts and their default values.
KNOWN_TASKS: dict[str, dict[str, float]] = {
    "cartpole": {
        "actuator_gain": 1.0,
        "observation_noise": 0.0,
        "pole_mass_scale": 1.0,
        "cart_mass_scale": 1.0,
        "gravity_scale": 1.0,
    },
}


@dataclass(frozen=True)
class TaskSpec:
    """What to simulate: the task, the episode length and its parameters (see ``KNOWN_TASKS``).

    Parameters left out take their defaults; ``key()`` names the spec in partition keys and
    file names, and is the same for the same task on every machine.
    """

    name: str = "cartpole"
    max_steps: int = 200
    params: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in KNOWN_TASKS:
            raise ValueError(f"TaskSpec.name: unknown task {self.name!r}; known tasks: {sorted(KNOWN_TASKS)}")
        if not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise ValueError(f"TaskSpec.max_steps must be a positive integer, got {self.max_steps!r}")
        known = KNOWN_TASKS[self.name]
        for key, value in self.params.items():
            if key not in known:
                raise ValueError(
                    f"TaskSpec.params[{key!r}]: not a parameter of task {self.name!r}; "
                    f"known parameters: {sorted(known)}"
                )
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"TaskSpec.params[{key!r}] must be a finite number, got {value!r}")
            if value < 0 or (key.endswith("_scale") and value == 0):
                raise ValueError(
                    f"TaskSpec.params[{key!r}] = {value}: must be {'> 0' if key.endswith('_scale') else '>= 0'}"
                )

    def param(self, key: str) -> float:
        """The value of one parameter: the one given, else the task's default."""
        return float(self.params.get(key, KNOWN_TASKS[self.name][key]))

    def non_default_params(self) -> dict[str, float]:
        """The parameters that differ from the task's defaults, sorted by name."""
        defaults = KNOWN_TASKS[self.name]
        return {k: float(v) for k, v in sorted(self.params.items()) if float(v) != defaults[k]}

    def key(self) -> str:
        """A short stable slug, e.g. ``cartpole-200-default`` or ``cartpole-200-3f9a1c2e``.

        Parameters equal to their defaults do not change the key.
        """
        params = self.non_default_params()
        if not params:
            return f"{self.name}-{self.max_steps}-default"
        digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:8]
        return f"{self.name}-{self.max_steps}-{digest}"


@dataclass
class StepResult:
    """One control step: the state after it, and whether (and why) the episode ended."""

    observation: np.ndarray
    reward: float
    terminated: bool
    truncated: bool
    failure_mode: str | None


@runtime_checkable
class Simulator(Protocol):
    """A cart-pole simulator in the common layout; make one with ``make_simulator``."""

    backend: str
    task: TaskSpec
    control_dt: float  # seconds of simulated time per step()

    def reset(self, seed: int) -> np.ndarray: ...

    def step(self, action: np.ndarray) -> StepResult: ...

    def close(self) -> None: ...

    def __enter__(self) -> Simulator: ...

    def __exit__(self, *exc: object) -> None: ...


class SimulatorBase(abc.ABC):
    """The adapter shared by the backends; a backend implements the three ``_physics_*`` hooks.

    Hooks see forces in normalised units (already clipped and multiplied by
    ``actuator_gain``) and return states in ``STATE_NAMES`` order, without noise.
    """

    backend: str = ""
    control_dt: float = 0.0
    supported_physics_params: frozenset[str] = frozenset()

    def __init__(self, task: TaskSpec) -> None:
        unsupported = sorted(set(task.non_default_params()) & (set(PHYSICS_PARAMS) - self.supported_physics_params))
        if unsupported:
            raise ValueError(
                f"TaskSpec.params {unsupported}: not supported by the {self.backend!r} backend "
                f"(it supports {sorted(self.supported_physics_params | set(ADAPTER_PARAMS))}); "
                "drop them or run this task on another backend"
            )
        self.task = task
        self._gain = task.param("actuator_gain")
        self._noise_std = task.param("observation_noise")
        self._rng = np.random.default_rng(0)
        self._steps = 0
        self._episode_open = False

    @abc.abstractmethod
    def _physics_reset(self, seed: int) -> np.ndarray: ...

    @abc.abstractmethod
    def _physics_step(self, force: float) -> tuple[np.ndarray, str | None]:
        """Advance one control step; return the new state and a failure mode or None."""

    @abc.abstractmethod
    def _physics_close(self) -> None: ...

    def reset(self, seed: int) -> np.ndarray:
        """Start an episode; the same seed gives the same initial state and noise."""
        self._rng = np.random.default_rng(seed)
        state = self._physics_reset(int(seed))
        self._steps = 0
        self._episode_open = True
        return self._observe(state)

    def step(self, action: np.ndarray) -> StepResult:
        """Apply one normalised action (clipped to [-1, 1]) for ``control_dt`` seconds."""
        if not self._episode_open:
            raise RuntimeError(
                f"{self.backend} simulator: step() called with no episode running "
                "(before the first reset() or after the episode ended); call reset(seed) first"
            )
        act = np.asarray(action, dtype=np.float64).reshape(-1)
        if act.shape != (len(ACTION_NAMES),) or not np.isfinite(act).all():
            raise ValueError(f"action must be {len(ACTION_NAMES)} finite value(s) {ACTION_NAMES}, got {action!r}")
        force = float(np.clip(act[0], -1.0, 1.0)) * self._gain
        state, failure_mode = self._physics_step(force)
        self._steps += 1
        terminated = failure_mode is not None
        truncated = not terminated and self._steps >= self.task.max_steps
        self._episode_open = not (terminated or truncated)
        return StepResult(self._observe(state), 0.0 if terminated else 1.0, terminated, truncated, failure_mode)

    def close(self) -> None:
        """Release the physics (for Isaac Lab, leave its simulation context)."""
        self._episode_open = False
        self._physics_close()

    def __enter__(self) -> SimulatorBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _observe(self, state: np.ndarray) -> np.ndarray:
        obs = np.asarray(state, dtype=np.float64).reshape(len(STATE_NAMES))
        if self._noise_std > 0:
            obs = obs + self._rng.normal(0.0, self._noise_std, size=obs.shape)
        return obs.astype(np.float32)


Policy = Callable[[np.ndarray], np.ndarray]


@dataclass
class Episode:
    """One rolled-out episode: observations[t] is what the policy saw before actions[t]."""

    seed: int
    observations: np.ndarray  # (T, 4) float32
    actions: np.ndarray  # (T, 1) float32, as sent (before clipping)
    rewards: np.ndarray  # (T,) float32
    final_observation: np.ndarray  # (4,) float32, the state the episode ended in
    success: bool
    failure_mode: str | None

    @property
    def length(self) -> int:
        return int(len(self.actions))


def run_episode(sim: Simulator, policy: Policy, seed: int) -> Episode:
    """Reset ``sim`` with ``seed`` and step ``policy`` until the episode ends."""
    obs = sim.reset(seed)
    observations, actions, rewards = [], [], []
    while True:
        action = np.asarray(policy(obs), dtype=np.float32).reshape(len(ACTION_NAMES))
        result = sim.step(action)
        observations.append(obs)
        actions.append(action)
        rewards.append(result.reward)
        obs = result.observation
        if result.terminated or result.truncated:
            break
    return Episode(
        seed=seed,
        observations=np.stack(observations).astype(np.float32),
        actions=np.stack(actions).astype(np.float32),
        rewards=np.asarray(rewards, dtype=np.float32),
        final_observation=obs,
        success=not result.terminated,
        failure_mode=result.failure_mode,
    )
