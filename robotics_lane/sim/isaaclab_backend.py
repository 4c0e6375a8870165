"""Isaac Lab cart-pole (``Isaac-Cartpole-Direct``, Newton + MuJoCo-Warp) behind the common interface.

Runs only in the Isaac Lab runtime (Python 3.12, ``make isaaclab-runtime``), kit-less, one env on
the CPU here (``device="cpu"``; a GPU pool runs the same code with more envs). The simulator
enters ``isaaclab.app.launch_simulation`` when it is built and leaves it on ``close()``, so a
whole rollout (many episodes) pays the start-up once: ~45 s cold (Warp compiles its kernels into
the user cache), ~10 s warm. Then about 8 ms per step.

Mapping to the common layout, as Isaac Lab 3.0's Direct task defines it:

- observation ``[cart_pos, pole_pos, cart_vel, pole_vel]`` (joint positions/velocities of
  ``slider_to_cart`` and ``cart_to_pole``). Its pole angle is positive when the tip leans
  towards -cart_position, so the adapter flips the sign of the pole angle and its velocity.
- action: normalised force × ``cfg.action_scale`` (100 N) on the cart; ``actuator_gain`` scales it.
- termination: the task itself ends an episode only when |cart_pos| > ``cfg.max_cart_pos`` (3 m)
  -> ``"cart_out_of_bounds"``; the adapter adds ``"pole_fell"`` at |pole_angle| > π/2 (the pole
  below horizontal), as Isaac Lab's earlier Cartpole did.
- auto-reset: on termination Isaac Lab resets the env inside ``step()``; the adapter snapshots the
  state just before that reset, so the terminal step reports the state the episode ended in.
  Its own time-out is pushed past ``task.max_steps``: truncation is the adapter's.
- physics params: ``pole_mass_scale``/``cart_mass_scale`` through the generated USD (see
  ``isaaclab_assets``), ``gravity_scale`` through ``cfg.sim.gravity``.

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
from typing import Any

import numpy as np

from robotics_lane.sim.base import BackendUnavailableError, SimulatorBase, TaskSpec

TASK_ID = "Isaac-Cartpole-Direct"
POLE_FELL_RAD = math.pi / 2
RUNTIME_HELP = (
    "Isaac Lab runs in its own Python 3.12 runtime: build it with `make isaaclab-runtime` and run "
    "the workload with .venv-isaaclab/bin/python"
)
SELFTEST_PREFIX = "SELFTEST_JSON "


def require_isaaclab_runtime() -> None:
    """Raise ``BackendUnavailableError`` unless this Python can run Isaac Lab."""
    if sys.version_info[:2] != (3, 12) or importlib.util.find_spec("isaaclab") is None:
        raise BackendUnavailableError(
            f"{RUNTIME_HELP} (this is Python {sys.version_info.major}.{sys.version_info.minor} "
            f"at {sys.executable}, {'with' if importlib.util.find_spec('isaaclab') else 'without'} isaaclab)"
        )


class IsaacLabCartpole(SimulatorBase):
    """Cart-pole on Isaac Lab 3.0 (Newton physics, CPU here); one env, many episodes per launch."""

    backend = "isaaclab"
    supported_physics_params = frozenset({"pole_mass_scale", "cart_mass_scale", "gravity_scale"})

    def __init__(self, task: TaskSpec, device: str = "cpu") -> None:
        super().__init__(task)
        require_isaaclab_runtime()
        import gymnasium as gym
        import isaaclab_tasks  # noqa: F401  (registers the Isaac-* gym ids)
        import torch
        from isaaclab.app import launch_simulation
        from isaaclab_tasks.utils import parse_env_cfg

        from robotics_lane.sim.isaaclab_assets import cartpole_usd_path

        cfg = parse_env_cfg(TASK_ID, device=device, num_envs=1)
        cfg.scene.ground = None  # newton's cart-pole needs no floor; Isaac's ground asset is remote
        cfg.scene.cartpole.spawn.usd_path = str(
            cartpole_usd_path(task.param("cart_mass_scale"), task.param("pole_mass_scale"))
        )
        cfg.sim.gravity = tuple(g * task.param("gravity_scale") for g in cfg.sim.gravity)
        self.control_dt = float(cfg.sim.dt * cfg.decimation)
        # Isaac's time-out must never come first: truncation at task.max_steps is the adapter's.
        cfg.episode_length_s = (task.max_steps + 10) * self.control_dt
        self._max_cart_pos = float(cfg.max_cart_pos)
        self._device = device
        self._torch = torch

        self._launch = contextlib.ExitStack()
        try:
            self._launch.enter_context(launch_simulation(cfg, {"device": device, "headless": True}))
            self._env = gym.make(TASK_ID, cfg=cfg)
        except BaseException:
            self._launch.close()
            raise
        env = self._env.unwrapped
        self._cartpole = env.cartpole
        self._cart_idx = int(env._cart_dof_idx[0])
        self._pole_idx = int(env._pole_dof_idx[0])
        self._terminal_state: np.ndarray | None = None
        original_reset_idx = env._reset_idx

        def snapshot_then_reset(env_ids: Any) -> None:
            self._terminal_state = self._read_state()
            original_reset_idx(env_ids)

        env._reset_idx = snapshot_then_reset
        # The first reset after start-up leaves the sampled joint velocities unwritten
        # (Isaac Lab 3.0.0); one throw-away reset makes every later reset(seed) reproducible.
        self._env.reset(seed=0)

    def _read_state(self) -> np.ndarray:
        pos = self._cartpole.data.joint_pos.torch[0]
        vel = self._cartpole.data.joint_vel.torch[0]
        return np.array(
            [
                float(pos[self._cart_idx]),
                -float(pos[self._pole_idx]),  # Isaac's pole angle is positive towards -x
                float(vel[self._cart_idx]),
                -float(vel[self._pole_idx]),
            ],
            dtype=np.float64,
        )

    def body_masses(self) -> dict[str, float]:
        """The masses (kg) the physics actually uses, by body name."""
        masses = self._cartpole.data.body_mass.torch[0]
        return {name: round(float(m), 6) for name, m in zip(self._cartpole.body_names, masses)}

    def _physics_reset(self, seed: int) -> np.ndarray:
        self._env.reset(seed=seed)
        return self._read_state()

    def _physics_step(self, force: float) -> tuple[np.ndarray, str | None]:
        self._terminal_state = None
        action = self._torch.full((1, 1), force, device=self._device)
        _, _, terminated, truncated, _ = self._env.step(action)
        if bool(truncated[0]):
            raise RuntimeError(
                f"Isaac Lab timed the episode out before task.max_steps={self.task.max_steps}; "
                "cfg.episode_length_s set in IsaacLabCartpole.__init__ is too short"
            )
        if bool(terminated[0]):
            # Isaac Lab reset the env inside step(): report the state it ended in.
            state = self._terminal_state if self._terminal_state is not None else self._read_state()
            failure = "cart_out_of_bounds" if abs(state[0]) > self._max_cart_pos else "pole_fell"
            return state, failure
        state = self._read_state()
        if abs(state[1]) > POLE_FELL_RAD:
            return state, "pole_fell"
        return state, None

    def _physics_close(self) -> None:
        try:
            self._env.close()
        finally:
            self._launch.close()


def selftest(seeds: list[int], task: TaskSpec) -> dict[str, Any]:
    """A real rollout, as a JSON-able report the tests assert on.

    The scripted controller for each seed (one repeated, to check determinism), a zero policy
    (the pole falls), a controller driving past the 3 m bound, and a second simulator with
    heavier pole and stronger gravity to show the task parameters reach the physics.
    """
    from robotics_lane.sim.base import run_episode
    from robotics_lane.sim.controllers import BalancingController, zero_policy

    def summary(episode: Any) -> dict[str, Any]:
        return {"seed": episode.seed, "length": episode.length, "success": episode.success,
                "failure_mode": episode.failure_mode,
                "first_observation": episode.observations[0].tolist(),
                "final_observation": episode.final_observation.tolist()}

    started = time.perf_counter()
    sim = IsaacLabCartpole(task)
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
        report["body_masses"] = sim.body_masses()
    finally:
        sim.close()
    heavy = TaskSpec(params={"pole_mass_scale": 2.0, "gravity_scale": 1.5})
    with IsaacLabCartpole(heavy) as heavy_sim:
        report["heavy"] = {"params": heavy.params, "body_masses": heavy_sim.body_masses(),
                           "zero": summary(run_episode(heavy_sim, zero_policy, seeds[0]))}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--selftest", action="store_true", help="run a real cart-pole rollout, print JSON")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated reset seeds for the controller")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="a task parameter")
    args = parser.parse_args(argv)
    if not args.selftest:
        parser.print_help()
        return 2
    params = {k: float(v) for k, v in (p.split("=", 1) for p in args.param)}
    report = selftest([int(s) for s in args.seeds.split(",")], TaskSpec(params=params))
    print(SELFTEST_PREFIX + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
