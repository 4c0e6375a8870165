"""MuJoCo cart-pole: gymnasium's ``InvertedPendulum-v5`` behind the common simulator interface.

The model (gymnasium's ``inverted_pendulum.xml``): a 10.5 kg cart on a 2 m rail (slider joint
limited to ±1 m), a 0.6 m, 5 kg pole on a hinge; one motor on the slider with control range
[-3, 3] and gear 100, i.e. up to 300 N. A control step is 0.04 s (timestep 0.02 s, frame
skip 2). Its observation is already [cart_pos, pole_angle, cart_vel, pole_ang_vel] with the
pole angle positive towards +x, which is ``STATE_NAMES`` as is.

Termination: gymnasium ends the episode when |pole_angle| > 0.2 rad (``"pole_fell"``); the
adapter also ends it when the cart reaches the rail's end stops, |cart_position| >=
``CART_LIMIT_M`` (``"cart_out_of_bounds"``), since past that the joint limit, not the
controller, holds the cart.

Runs in the main venv (``pip install mujoco gymnasium[mujoco]``), about 30k steps/s on one core.
"""

from __future__ import annotations

import numpy as np

from robotics_lane.sim.base import SimulatorBase, TaskSpec

ENV_ID = "InvertedPendulum-v5"
POLE_FELL_RAD = 0.2  # gymnasium's own termination threshold for this env
CART_LIMIT_M = 0.95  # the slider's range is ±1 m; stop just before the end stop takes over


class MujocoCartpole(SimulatorBase):
    """Cart-pole on MuJoCo (gymnasium ``InvertedPendulum-v5``); supports every physics param."""

    backend = "mujoco"
    supported_physics_params = frozenset({"pole_mass_scale", "cart_mass_scale", "gravity_scale"})

    def __init__(self, task: TaskSpec) -> None:
        super().__init__(task)
        try:
            import gymnasium as gym
        except ImportError as exc:  # pragma: no cover - depends on the venv
            raise RuntimeError(
                "The MuJoCo backend needs `mujoco` and `gymnasium[mujoco]` in this venv "
                f"({exc}); install them with `pip install mujoco 'gymnasium[mujoco]'`"
            ) from exc
        # gymnasium's TimeLimit must never end an episode before the adapter does.
        self._env = gym.make(ENV_ID, max_episode_steps=task.max_steps + 1)
        model = self._env.unwrapped.model
        self.control_dt = float(self._env.unwrapped.dt)
        low, high = self._env.action_space.low[0], self._env.action_space.high[0]
        self._force_scale = float(min(-low, high))  # normalised 1.0 -> full motor control
        self._apply_physics(model)

    def _apply_physics(self, model: object) -> None:
        import mujoco

        for body, param in (("pole", "pole_mass_scale"), ("cart", "cart_mass_scale")):
            body_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, body)
            scale = self.task.param(param)
            # Same shape, heavier material: mass and inertia scale together.
            model.body_mass[body_id] *= scale
            model.body_inertia[body_id] *= scale
        model.opt.gravity[:] = model.opt.gravity * self.task.param("gravity_scale")

    def _physics_reset(self, seed: int) -> np.ndarray:
        obs, _ = self._env.reset(seed=seed)
        return np.asarray(obs, dtype=np.float64)

    def _physics_step(self, force: float) -> tuple[np.ndarray, str | None]:
        obs, _, terminated, _, _ = self._env.step(np.array([force * self._force_scale], dtype=np.float32))
        state = np.asarray(obs, dtype=np.float64)
        if terminated or abs(state[1]) > POLE_FELL_RAD or not np.isfinite(state).all():
            return state, "pole_fell"
        if abs(state[0]) >= CART_LIMIT_M:
            return state, "cart_out_of_bounds"
        return state, None

    def _physics_close(self) -> None:
        self._env.close()
