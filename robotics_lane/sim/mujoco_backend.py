"""MuJoCo cart-pole: gymnasium's ``InvertedPendulum-v5``, vectorised, behind the common interface.

The model (the ``cartpole-mujoco`` scene, gymnasium's ``inverted_pendulum.xml``; a registered
version of it when the workload passes one, see ``robotics_lane/scenes``): a 10.5 kg cart on a 2 m rail (slider joint
limited to ±1 m), a 0.6 m, 5 kg pole on a hinge; one motor on the slider with control range
[-3, 3] and gear 100, i.e. up to 300 N. A control step is 0.04 s (timestep 0.02 s, frame
skip 2). Its observation is already [cart_pos, pole_angle, cart_vel, pole_ang_vel] with the
pole angle positive towards +x, which is ``STATE_NAMES`` as is.

``num_envs`` copies run through gymnasium's vector API, ``gymnasium.make_vec(...,
vectorization_mode="sync")`` (a ``SyncVectorEnv``: one process, the envs stepped one after the
other in C). Each copy is a separate MuJoCo model and data, seeded on its own, so an episode
depends only on its seed. Many envs per process pay the adapter's per-step numpy work once for
all of them; to use more cores, run more shards.

Termination: gymnasium ends the episode when |pole_angle| > 0.2 rad (``"pole_fell"``); the
adapter also ends it when the cart reaches the rail's end stops, |cart_position| >=
``CART_LIMIT_M`` (``"cart_out_of_bounds"``), since past that the joint limit, not the
controller, holds the cart.

Cameras (``cameras=("front",)``): one offscreen renderer (``camera.MujocoCameras``, EGL) for
all the envs, drawing each env's own model and data in turn; asked for nothing, nothing renders.

Runs in the main venv (``pip install mujoco gymnasium[mujoco]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from robotics_lane.sim.base import TaskSpec
from robotics_lane.sim.camera import MujocoCameras
from robotics_lane.sim.vector import CART_OUT_OF_BOUNDS, NO_FAILURE, POLE_FELL, VectorSimulatorBase

ENV_ID = "InvertedPendulum-v5"
POLE_FELL_RAD = 0.2  # gymnasium's own termination threshold for this env
CART_LIMIT_M = 0.95  # the slider's range is ±1 m; stop just before the end stop takes over
RESET_NOISE = 0.01  # gymnasium's own half-width of the uniform initial state (positions and velocities)


def make_vector_env(num_envs: int, max_steps: int, scene: Path | None = None, start_disturbance_scale: float = 1.0):  # -> gymnasium.vector.SyncVectorEnv
    """gymnasium's own vector env of ``num_envs`` InvertedPendulum-v5 copies (what the adapter steps),
    loading the MJCF ``scene`` (default: the catalog's ``cartpole-mujoco`` as committed), with its
    initial state drawn ``start_disturbance_scale`` times as far from upright and rest as gymnasium's."""
    try:
        import gymnasium as gym
    except ImportError as exc:  # pragma: no cover - depends on the venv
        raise RuntimeError(
            "The MuJoCo backend needs `mujoco` and `gymnasium[mujoco]` in this venv "
            f"({exc}); install them with `pip install mujoco 'gymnasium[mujoco]'`"
        ) from exc
    # gymnasium's TimeLimit must never end an episode before the adapter does.
    from robotics_lane.scenes.catalog import scene_for
    from robotics_lane.scenes.files import catalog_scene

    xml_file = str(scene if scene is not None else catalog_scene(scene_for("mujoco")))
    return gym.make_vec(
        ENV_ID, num_envs=num_envs, vectorization_mode="sync", max_episode_steps=max_steps + 1,
        xml_file=xml_file, reset_noise_scale=RESET_NOISE * start_disturbance_scale,
    )


class MujocoCartpoleVec(VectorSimulatorBase):
    """``num_envs`` cart-poles on MuJoCo (gymnasium ``InvertedPendulum-v5``); every physics param."""

    backend = "mujoco"
    supported_physics_params = frozenset({"pole_mass_scale", "cart_mass_scale", "gravity_scale", "start_disturbance_scale"})

    def __init__(self, task: TaskSpec, num_envs: int = 1, cameras: Sequence[str] = (), scene: Path | None = None) -> None:
        super().__init__(task, num_envs, cameras)
        self._env = make_vector_env(self.num_envs, task.max_steps, scene, task.param("start_disturbance_scale"))
        first = self._env.envs[0].unwrapped
        self.control_dt = float(first.dt)
        low, high = self._env.single_action_space.low[0], self._env.single_action_space.high[0]
        self._force_scale = float(min(-low, high))  # normalised 1.0 -> full motor control
        for env in self._env.envs:
            self._apply_physics(env.unwrapped.model)
        # Every copy must have been reset before the vector env steps it (parked envs included).
        obs, _ = self._env.reset(seed=[0] * self.num_envs)
        self._state = np.asarray(obs, dtype=np.float64)
        self._cameras = MujocoCameras(first.model, self.cameras) if self.cameras else None

    def _apply_physics(self, model: object) -> None:
        import mujoco

        for body, param in (("pole", "pole_mass_scale"), ("cart", "cart_mass_scale")):
            body_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, body)
            scale = self.task.param(param)
            # Same shape, heavier material: mass and inertia scale together.
            model.body_mass[body_id] *= scale
            model.body_inertia[body_id] *= scale
        model.opt.gravity[:] = model.opt.gravity * self.task.param("gravity_scale")

    @property
    def models(self) -> list:
        """The MuJoCo models of the envs (``mujoco.MjModel``), e.g. to check the physics params."""
        return [env.unwrapped.model for env in self._env.envs]

    def _physics_reset(self, seeds: np.ndarray, envs: np.ndarray) -> np.ndarray:
        obs, _ = self._env.reset(seed=[int(s) for s in seeds], options={"reset_mask": envs.copy()})
        self._state = np.asarray(obs, dtype=np.float64)
        return self._state

    def _physics_step(self, forces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        actions = (forces * self._force_scale).astype(np.float32).reshape(-1, 1)
        obs, _, terminated, _, _ = self._env.step(actions)
        state = np.asarray(obs, dtype=np.float64)
        fell = terminated | (np.abs(state[:, 1]) > POLE_FELL_RAD) | ~np.isfinite(state).all(axis=1)
        out = np.abs(state[:, 0]) >= CART_LIMIT_M
        codes = np.where(fell, POLE_FELL, np.where(out, CART_OUT_OF_BOUNDS, NO_FAILURE)).astype(np.int8)
        return state, codes

    def _physics_render(self, envs: np.ndarray) -> dict[str, np.ndarray]:
        import mujoco

        frames = {
            name: np.empty((len(envs), spec.height, spec.width, 3), dtype=np.uint8)
            for name, spec in self._cameras.specs.items()
        }
        for row, env in enumerate(envs):
            sim = self._env.envs[int(env)].unwrapped
            # After mj_step, the body poses are those of the step's start; recompute them from the
            # state the observation reports. Only derived fields change: the next mj_step
            # recomputes them anyway, so rendering leaves the physics bit for bit as it was.
            mujoco.mj_kinematics(sim.model, sim.data)
            self._cameras.render(sim.model, sim.data, out={name: f[row] for name, f in frames.items()})
        return frames

    def _physics_close(self) -> None:
        if self._cameras is not None:
            self._cameras.close()
        self._env.close()
