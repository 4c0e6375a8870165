"""The simulator interface the Robotics lane codes against, whatever physics runs underneath.

Every backend speaks the same cart-pole language:

- state: a (4,) float32 vector in ``STATE_NAMES`` order (metres, radians, m/s, rad/s). The pole
  angle is 0 when upright and positive when the pole's tip leans towards +cart_position, so
  pushing the cart in the direction of a positive angle catches the pole.
- action: a (1,) vector in ``ACTION_NAMES`` order, normalised to [-1, 1] (clipped); each
  backend scales it to its own actuator's force.
- an episode succeeds when it reaches ``task.max_steps`` without termination; a terminated
  step names its ``failure_mode`` (``"pole_fell"`` or ``"cart_out_of_bounds"``).
- cameras (``camera.CAMERAS``, asked for when the simulator is made): ``render()`` gives what
  each one sees now, uint8 (H, W, 3); an episode recorded with cameras holds one frame per step.

``vector.VectorSimulatorBase`` does the backend-independent part (clipping, actuator gain,
observation noise, step counting, truncation, refusing to step a finished episode), for many
envs at once, so both backends treat the task parameters identically; ``vector.SingleEnv`` is
the one-env ``Simulator`` over it. Nothing here imports Dagster, MuJoCo or Isaac Lab.
"""

from __future__ import annotations

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
    "start_disturbance_scale": "multiplies the spread of the random initial state (how far from upright and rest an episode starts)",
}
# The tasks that exist, with the parameters each accepts and their default values.
KNOWN_TASKS: dict[str, dict[str, float]] = {
    "cartpole": {
        "actuator_gain": 1.0,
        "observation_noise": 0.0,
        "pole_mass_scale": 1.0,
        "cart_mass_scale": 1.0,
        "gravity_scale": 1.0,
        "start_disturbance_scale": 1.0,
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
    cameras: tuple[str, ...]  # the cameras it renders (none unless asked for)

    def reset(self, seed: int) -> np.ndarray: ...

    def step(self, action: np.ndarray) -> StepResult: ...

    def render(self) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Simulator: ...

    def __exit__(self, *exc: object) -> None: ...


Policy = Callable[[np.ndarray], np.ndarray]


@dataclass
class Episode:
    """One rolled-out episode: observations[t] is what the policy saw before actions[t].

    ``images[camera][t]`` is what the camera saw at that instant (uint8 (T, H, W, 3)): the true
    state, without the observation noise; empty when the simulator had no cameras."""

    seed: int
    observations: np.ndarray  # (T, 4) float32
    actions: np.ndarray  # (T, 1) float32, as sent (before clipping)
    rewards: np.ndarray  # (T,) float32
    final_observation: np.ndarray  # (4,) float32, the state the episode ended in
    success: bool
    failure_mode: str | None
    images: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return int(len(self.actions))


def run_episode(sim: Simulator, policy: Policy, seed: int) -> Episode:
    """Reset ``sim`` with ``seed`` and step ``policy`` until the episode ends, recording the
    frames of the simulator's cameras (if it has any) before each step."""
    obs = sim.reset(seed)
    observations, actions, rewards = [], [], []
    frames: dict[str, list[np.ndarray]] = {camera: [] for camera in sim.cameras}
    while True:
        if frames:
            for camera, frame in sim.render().items():
                frames[camera].append(frame)
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
        images={camera: np.stack(shots) for camera, shots in frames.items()},
    )
