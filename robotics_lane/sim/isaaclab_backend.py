"""Isaac Lab cart-pole (``Isaac-Cartpole-Direct``, Newton + MuJoCo-Warp), vectorised, behind the common interface.

Runs only in the Isaac Lab runtime (Python 3.12, ``make isaaclab-runtime``), kit-less: on the CPU
here (``device="cpu"``), on the GPU of a GPU node (``device="cuda:0"``). ``num_envs`` cart-poles
live in one Isaac Lab scene and step in one physics call (``env.step`` of a ``(N, 1)`` action
tensor): about 8 ms per step on this CPU for 1 to a few hundred envs. The simulator enters
``isaaclab.app.launch_simulation`` when it is built and leaves it on ``close()``, so a whole
rollout pays the start-up once: ~45 s cold (Warp compiles its kernels into the user cache),
~10 s warm.

Mapping to the common layout, as Isaac Lab 3.0's Direct task defines it:

- observation ``obs["policy"]`` = ``[cart_pos, pole_pos, cart_vel, pole_vel]`` (joint positions
  and velocities of ``slider_to_cart`` and ``cart_to_pole`` relative to their defaults, which
  the adapter adds back). Its pole angle is positive when the tip leans towards -cart_position,
  so the adapter flips the sign of the pole angle and its velocity.
- action: normalised force × ``cfg.action_scale`` (100 N) on the cart; ``actuator_gain`` scales it.
- termination: the task itself ends an episode only when |cart_pos| > ``cfg.max_cart_pos`` (3 m)
  -> ``"cart_out_of_bounds"``; the adapter adds ``"pole_fell"`` at |pole_angle| > π/2 (the pole
  below horizontal), as Isaac Lab's earlier Cartpole did.
- auto-reset: Isaac Lab resets a terminated env inside ``step()``; with ``cfg.compute_final_obs``
  it keeps the observation from just before (``extras["final_obs"]``), which the adapter reports
  as the state the episode ended in. Its own time-out is pushed past ``task.max_steps``:
  truncation is the adapter's.
- seeded resets: ``reset(seeds, envs)`` resets the envs named through the task's own
  ``_reset_idx`` (scene, events, episode counters), then writes each env's initial joint state
  drawn from the task's own ranges (``cfg.initial_*_range``, clamped to the joint limits) by a
  numpy Generator seeded with that env's seed: an episode's start depends on its seed only.
- scene: the USD it is given (a registered ``robotics/scenes`` version, fetched by the workload),
  else the catalog's ``cartpole-isaaclab`` made here from ``newton`` (hand runs, the self-test).
- physics params: ``pole_mass_scale``/``cart_mass_scale`` written into a copy of the scene at
  load time (see ``isaaclab_assets``), ``gravity_scale`` through ``cfg.sim.gravity``.
- cameras (``cameras=("front",)``): Isaac Lab camera sensors ray-traced by Newton's Warp
  renderer, added to the scene only when asked (``isaaclab_camera``); ``render(envs)`` traces
  the state now.

Self-test (a real rollout, JSON on the last line): ``python -m robotics_lane.sim.isaaclab_backend --selftest``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from robotics_lane.sim.base import BackendUnavailableError, TaskSpec
from robotics_lane.sim.vector import CART_OUT_OF_BOUNDS, NO_FAILURE, POLE_FELL, VectorSimulatorBase

TASK_ID = "Isaac-Cartpole-Direct"
POLE_FELL_RAD = math.pi / 2
RUNTIME_HELP = (
    "Isaac Lab runs in its own Python 3.12 runtime: build it with `make isaaclab-runtime` and run "
    "the workload with .venv-isaaclab/bin/python"
)
SELFTEST_PREFIX = "SELFTEST_JSON "
# Isaac's observation columns -> the common layout: same order, pole angle and velocity negated.
SIGNS = np.array([1.0, -1.0, 1.0, -1.0])


def require_isaaclab_runtime() -> None:
    """Raise ``BackendUnavailableError`` unless this Python can run Isaac Lab."""
    if sys.version_info[:2] != (3, 12) or importlib.util.find_spec("isaaclab") is None:
        raise BackendUnavailableError(
            f"{RUNTIME_HELP} (this is Python {sys.version_info.major}.{sys.version_info.minor} "
            f"at {sys.executable}, {'with' if importlib.util.find_spec('isaaclab') else 'without'} isaaclab)"
        )


class IsaacLabCartpoleVec(VectorSimulatorBase):
    """``num_envs`` cart-poles in one Isaac Lab 3.0 scene (Newton physics); many episodes per launch."""

    backend = "isaaclab"
    supported_physics_params = frozenset({"pole_mass_scale", "cart_mass_scale", "gravity_scale"})

    def __init__(
        self, task: TaskSpec, num_envs: int = 1, device: str = "cpu", scene: Path | None = None, cameras: Sequence[str] = ()
    ) -> None:
        super().__init__(task, num_envs, cameras)
        require_isaaclab_runtime()
        import gymnasium as gym
        import isaaclab_tasks  # noqa: F401  (registers the Isaac-* gym ids)
        import torch
        from isaaclab.app import launch_simulation
        from isaaclab_tasks.utils import parse_env_cfg

        from robotics_lane.scenes.catalog import scene_for
        from robotics_lane.scenes.files import catalog_scene
        from robotics_lane.sim.isaaclab_assets import loadable_usd
        from robotics_lane.sim.isaaclab_camera import IsaacLabCameras, add_cameras

        cfg = parse_env_cfg(TASK_ID, device=device, num_envs=self.num_envs)
        cfg.scene.ground = None  # newton's cart-pole needs no floor; Isaac's ground asset is remote
        self.scene = Path(scene) if scene is not None else catalog_scene(scene_for(self.backend))
        cfg.scene.cartpole.spawn.usd_path = str(loadable_usd(self.scene, task.param("cart_mass_scale"), task.param("pole_mass_scale")))
        cfg.sim.gravity = tuple(g * task.param("gravity_scale") for g in cfg.sim.gravity)
        # Every env at the same origin: the worlds never touch, and an env then computes in the
        # same coordinates whatever its slot, so an episode is bit-identical in any slot.
        cfg.scene.env_spacing = 0.0
        cfg.compute_final_obs = True  # the observation a terminated env ended in, before auto-reset
        add_cameras(cfg, self.cameras)  # none asked, no sensor in the scene
        self.control_dt = float(cfg.sim.dt * cfg.decimation)
        # Isaac's time-out must never come first: truncation at task.max_steps is the adapter's.
        cfg.episode_length_s = (task.max_steps + 10) * self.control_dt
        self._cfg = cfg
        self.device = device
        self._torch = torch

        self._launch = contextlib.ExitStack()
        try:
            self._launch.enter_context(launch_simulation(cfg, {"device": device, "headless": True}))
            self._env = gym.make(TASK_ID, cfg=cfg)
        except BaseException:
            self._launch.close()
            raise
        env = self._env.unwrapped
        self._task_env = env
        self._cartpole = env.cartpole
        self._cameras = IsaacLabCameras(env.scene, self.cameras)
        self._joints = [int(env._cart_dof_idx[0]), int(env._pole_dof_idx[0])]
        # The first reset after start-up leaves the sampled joint velocities unwritten
        # (Isaac Lab 3.0.0); one throw-away reset of every env makes later resets reproducible.
        self._env.reset(seed=0)
        data = self._cartpole.data
        defaults = np.concatenate([self._numpy(data.default_joint_pos.torch[0, self._joints]),
                                   self._numpy(data.default_joint_vel.torch[0, self._joints])])
        self._defaults = defaults  # obs["policy"] is relative to them
        self._pos_limits = self._numpy(data.soft_joint_pos_limits.torch[0, self._joints])  # (2, 2): joint, (low, high)
        self._vel_limits = self._numpy(data.soft_joint_vel_limits.torch[0, self._joints])  # (2,)
        self._state = self._read_state()

    def _numpy(self, tensor: Any) -> np.ndarray:
        return tensor.detach().to("cpu").numpy().astype(np.float64)

    def _from_obs(self, policy_obs: Any) -> np.ndarray:
        """Isaac's (N, 4) policy observation -> (N, 4) states in the common layout."""
        return (self._numpy(policy_obs) + self._defaults) * SIGNS

    def _read_state(self) -> np.ndarray:
        data = self._cartpole.data
        pos = self._numpy(data.joint_pos.torch[:, self._joints])
        vel = self._numpy(data.joint_vel.torch[:, self._joints])
        return np.concatenate([pos, vel], axis=1) * SIGNS

    def body_masses(self) -> dict[str, float]:
        """The masses (kg) the physics actually uses, by body name (env 0)."""
        masses = self._cartpole.data.body_mass.torch[0]
        return {name: round(float(m), 6) for name, m in zip(self._cartpole.body_names, masses)}

    def _initial_states(self, seeds: np.ndarray) -> np.ndarray:
        """(k, 4) Isaac-layout joint states [cart_pos, pole_pos, cart_vel, pole_vel], one per seed."""
        cfg = self._cfg
        ranges = np.array([cfg.initial_cart_position_range, cfg.initial_pole_angle_range,
                           cfg.initial_cart_velocity_range, cfg.initial_pole_velocity_range])
        draws = np.stack([np.random.default_rng(int(s)).uniform(size=4) for s in seeds])  # once per episode
        states = self._defaults + ranges[:, 0] + draws * (ranges[:, 1] - ranges[:, 0])
        states[:, :2] = np.clip(states[:, :2], self._pos_limits[:, 0], self._pos_limits[:, 1])
        states[:, 2:] = np.clip(states[:, 2:], -self._vel_limits, self._vel_limits)
        return states

    def _physics_reset(self, seeds: np.ndarray, envs: np.ndarray) -> np.ndarray:
        torch, env = self._torch, self._task_env
        ids = np.flatnonzero(envs)
        env_ids = torch.as_tensor(ids, dtype=torch.int32, device=self.device)
        env._reset_idx(env_ids)  # Isaac's own reset of these envs: scene, events, episode counters
        states = torch.as_tensor(self._initial_states(seeds[ids]), dtype=torch.float32, device=self.device)
        pos = self._cartpole.data.joint_pos.torch[env_ids].clone()
        vel = self._cartpole.data.joint_vel.torch[env_ids].clone()
        pos[:, self._joints] = states[:, :2]
        vel[:, self._joints] = states[:, 2:]
        self._cartpole.write_joint_position_to_sim_index(position=pos, env_ids=env_ids)
        self._cartpole.write_joint_velocity_to_sim_index(velocity=vel, env_ids=env_ids)
        env.scene.write_data_to_sim()
        env.sim.forward()
        self._state = self._read_state()
        return self._state

    def _physics_step(self, forces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        torch = self._torch
        action = torch.as_tensor(forces.astype(np.float32).reshape(-1, 1), device=self.device)
        obs, _, terminated, truncated, extras = self._env.step(action)
        state = self._from_obs(obs["policy"])
        ended = self._numpy(terminated).astype(bool)
        if ended.any():
            # Isaac Lab reset these envs inside step(): report the state they ended in.
            state[ended] = self._from_obs(extras["final_obs"]["policy"])[ended]
        timed_out = self._numpy(truncated).astype(bool) & self._open
        if timed_out.any():
            raise RuntimeError(
                f"Isaac Lab timed envs {np.flatnonzero(timed_out).tolist()[:5]} out before task.max_steps="
                f"{self.task.max_steps}; cfg.episode_length_s set in IsaacLabCartpoleVec.__init__ is too short"
            )
        out = ended & (np.abs(state[:, 0]) > self._cfg.max_cart_pos)
        fell = ~out & (ended | (np.abs(state[:, 1]) > POLE_FELL_RAD))
        codes = np.where(out, CART_OUT_OF_BOUNDS, np.where(fell, POLE_FELL, NO_FAILURE)).astype(np.int8)
        self._state = state
        return state, codes

    def _physics_render(self, envs: np.ndarray) -> dict[str, np.ndarray]:
        return self._cameras.render(envs)

    def _physics_close(self) -> None:
        try:
            self._env.close()
        finally:
            self._launch.close()


def selftest(seeds: list[int], task: TaskSpec, num_envs: int = 4) -> dict[str, Any]:
    """A real rollout, as a JSON-able report the tests assert on.

    One env: the scripted controller for each seed (one repeated, to check determinism), a zero
    policy (the pole falls), a controller driving past the 3 m bound. Then ``num_envs`` envs
    running ``run_episodes`` over more seeds than envs (slots reused): its episodes of the same
    seeds must equal the one-env ones. Last, a simulator with heavier pole and stronger gravity
    shows the task parameters reach the physics.
    """
    from robotics_lane.sim.base import run_episode
    from robotics_lane.sim.batch_rollout import run_episodes
    from robotics_lane.sim.controllers import BalancingController, ScriptedOperator, zero_policy
    from robotics_lane.sim.vector import SingleEnv

    def summary(episode: Any) -> dict[str, Any]:
        return {"seed": episode.seed, "length": episode.length, "success": episode.success,
                "failure_mode": episode.failure_mode,
                "first_observation": episode.observations[0].tolist(),
                "final_observation": episode.final_observation.tolist()}

    started = time.perf_counter()
    sim = SingleEnv(IsaacLabCartpoleVec(task, 1))
    report: dict[str, Any] = {"python": sys.version.split()[0], "control_dt": sim.control_dt,
                              "start_s": round(time.perf_counter() - started, 2)}
    try:
        stepping, controller = time.perf_counter(), BalancingController()
        episodes = [run_episode(sim, controller, seed) for seed in seeds]
        repeat = run_episode(sim, controller, seeds[0])
        report["deterministic"] = bool(np.array_equal(repeat.observations, episodes[0].observations))
        report["controller"] = [summary(e) for e in episodes]
        report["zero"] = summary(run_episode(sim, zero_policy, seeds[0]))
        report["drive_off"] = summary(run_episode(sim, BalancingController(target_position=10.0), seeds[0]))
        try:
            sim.step(np.zeros(1))
            report["step_after_end_refused"] = False
        except RuntimeError:
            report["step_after_end_refused"] = True
        steps = sum(e.length for e in episodes) + repeat.length + report["zero"]["length"] + report["drive_off"]["length"]
        report["steps"] = steps
        report["steps_per_s"] = round(steps / (time.perf_counter() - stepping), 1)
        report["body_masses"] = sim.vector.body_masses()
    finally:
        sim.close()
    # More seeds than envs, so envs take new seeds mid-run; a short horizon keeps it quick.
    vector_seeds = [*seeds, *(s + 100 for s in seeds)]
    with IsaacLabCartpoleVec(task, num_envs) as vec:
        policy = ScriptedOperator(BalancingController(), 0.0, num_envs, task.max_steps)
        vector = {e.seed: e for e in run_episodes(vec, policy, vector_seeds)}
    report["vector"] = {
        "num_envs": num_envs,
        "seeds": sorted(vector),
        "same_as_single_env": all(
            np.array_equal(vector[e.seed].observations, e.observations)
            and np.array_equal(vector[e.seed].actions, e.actions)
            and np.array_equal(vector[e.seed].final_observation, e.final_observation)
            for e in episodes
        ),
        "max_abs_difference": max(
            float(np.max(np.abs(vector[e.seed].observations - e.observations))) if vector[e.seed].length == e.length else math.inf
            for e in episodes
        ),
        "episodes": [summary(vector[s]) for s in sorted(vector)],
    }
    heavy = TaskSpec(max_steps=task.max_steps, params={"pole_mass_scale": 2.0, "gravity_scale": 1.5})
    with IsaacLabCartpoleVec(heavy, 1) as heavy_vec:
        heavy_sim = SingleEnv(heavy_vec)
        report["heavy"] = {"params": heavy.params, "body_masses": heavy_vec.body_masses(),
                           "zero": summary(run_episode(heavy_sim, zero_policy, seeds[0]))}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--selftest", action="store_true", help="run a real cart-pole rollout, print JSON")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated reset seeds for the controller")
    parser.add_argument("--num-envs", type=int, default=4, help="envs of the vectorised part of the self-test")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="a task parameter")
    args = parser.parse_args(argv)
    if not args.selftest:
        parser.print_help()
        return 2
    params = {k: float(v) for k, v in (p.split("=", 1) for p in args.param)}
    report = selftest([int(s) for s in args.seeds.split(",")], TaskSpec(params=params), args.num_envs)
    print(SELFTEST_PREFIX + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
