"""Figure 3b: rollout harness overhead on Isaac Lab (env-steps per second), in its own runtime.

Isaac Lab runs only in its Python 3.12 runtime (``.venv-isaaclab``, ``make isaaclab-runtime``),
so the main benchmark runs this module there as a child process, from the repository root::

    .venv-isaaclab/bin/python -m benchmarks.isaaclab_overhead --child --repeats 5

and reads the JSON it prints on its last line (after ``BENCH_JSON``). The child:

1. builds the vectorised adapter, ``make_vector_simulator("isaaclab", TaskSpec(max_steps=200),
   num_envs=256)`` (enters ``launch_simulation``, builds one scene of 256 cart-poles; start-up
   is timed and reported, not in the figure);
2. times, with the same ``time_pair`` as every other figure (one untimed warm-up call each,
   which also pays Warp's first-step costs), one round of ``run_episodes(sim,
   ScriptedOperator(BalancingController(), 0.0, 256, 200), seeds 0..255)`` (every env runs one
   200-step episode, committed nowhere) against raw ``env.step`` on **the same gym env**
   (``sim._env``, the one the adapter built and steps): ``env.reset(seed=0)``, then 200 steps
   of the controller's gains applied in torch to the raw ``obs["policy"]`` (pole angle and
   velocity negated, as the adapter does: Isaac's pole angle is positive towards -x) and the
   normalised forces sent as a ``(256, 1)`` tensor, as the adapter sends them.

The figure is the adapter's throughput as a fraction of raw (≥ 0.9 asked) and its env-steps/s
against the 115 env-steps/s of the old one-env-per-process rollouts (≥ 100× asked).
The main venv side (``run``) returns a result with ``skipped`` set when the runtime is missing
(or cannot import Isaac Lab) instead of failing the whole benchmark run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import REPEATS, Timing, time_pair

REPO_ROOT = Path(__file__).resolve().parent.parent
RUNTIME_PYTHON = REPO_ROOT / ".venv-isaaclab" / "bin" / "python"
JSON_PREFIX = "BENCH_JSON "
SKIPPED_PREFIX = "BENCH_SKIPPED "
MAX_STEPS = 200
NUM_ENVS = 256  # Isaac Lab's default env count on a CPU (robotics_lane.sim.factory.DEFAULT_NUM_ENVS)
DEVICE = "cpu"
OLD_ENV_STEPS_PER_S = 115.0  # one env per process, before vectorising (issue 16's measurement)
TIMEOUT_S = 900  # a cold Warp kernel cache adds ~45 s to start-up; a warm one ~10 s
SKIP_HELP = "skipped: build it with make isaaclab-runtime"


# --- main venv side ------------------------------------------------------------------------


@dataclass
class IsaacLabResult:
    skipped: str | None = None  # why there is no figure (runtime missing, child failed)
    report: dict[str, Any] = field(default_factory=dict)  # the child's JSON
    child_wall_s: float = 0.0
    adapter: Timing | None = None
    raw: Timing | None = None

    @property
    def steps(self) -> int:
        return int(self.report["env_steps_per_call"])

    @property
    def episodes(self) -> int:
        return len(self.report["seeds"])

    @property
    def num_envs(self) -> int:
        return int(self.report["num_envs"])

    @property
    def speedup_over_one_env(self) -> float:
        """Adapter env-steps/s over the old one-env-per-process figure (115 env-steps/s)."""
        assert self.adapter is not None
        return self.steps_per_s(self.adapter) / OLD_ENV_STEPS_PER_S

    def steps_per_s(self, timing: Timing) -> float:
        return self.steps / timing.median

    @property
    def ratio(self) -> float:
        """Adapter time over raw time (1.0 = no overhead)."""
        assert self.adapter is not None and self.raw is not None
        return self.adapter.median / self.raw.median

    @property
    def throughput_ratio(self) -> float:
        """Adapter env-steps/s as a fraction of raw env-steps/s (the issue's ≥ 0.9 figure)."""
        return 1.0 / self.ratio

    def to_dict(self) -> dict[str, Any]:
        if self.skipped is not None:
            return {"skipped": self.skipped, "runtime_python": str(RUNTIME_PYTHON), "child_wall_s": self.child_wall_s}
        assert self.adapter is not None and self.raw is not None
        report = {k: v for k, v in self.report.items() if k not in ("adapter", "baseline")}
        return {
            **report,
            "runtime_python": str(RUNTIME_PYTHON),
            "child_wall_s": self.child_wall_s,
            "adapter": {
                "function": f'make_vector_simulator("isaaclab", TaskSpec(max_steps=200), num_envs={self.num_envs}) built once; '
                f"run_episodes(sim, ScriptedOperator(BalancingController(), 0.0, {self.num_envs}, 200), seeds 0..{self.num_envs - 1})",
                "env_steps_per_s": self.steps_per_s(self.adapter),
                **self.adapter.to_dict(),
            },
            "baseline": {
                "function": f"sim._env.reset(seed=0); 200 x sim._env.step(torch ({self.num_envs}, 1) actions) "
                "with BalancingController gains on obs['policy'] in torch (same gym env)",
                "env_steps_per_s": self.steps_per_s(self.raw),
                **self.raw.to_dict(),
            },
            "ratio_adapter_over_baseline": self.ratio,
            "throughput_adapter_over_baseline": self.throughput_ratio,
            "old_one_env_env_steps_per_s": OLD_ENV_STEPS_PER_S,
            "speedup_over_one_env": self.speedup_over_one_env,
        }


def _timing(d: dict[str, Any]) -> Timing:
    return Timing(calls_per_repeat=int(d["calls_per_repeat"]), seconds=[float(s) for s in d["seconds_per_call_each_repeat"]])


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run(repeats: int = REPEATS) -> IsaacLabResult:
    """Run the child in the Isaac Lab runtime and parse its JSON; skipped if there is no runtime."""
    if not RUNTIME_PYTHON.exists():
        return IsaacLabResult(skipped=f"{SKIP_HELP} (no {RUNTIME_PYTHON.relative_to(REPO_ROOT)})")
    cmd = [str(RUNTIME_PYTHON), "-m", "benchmarks.isaaclab_overhead", "--child", "--repeats", str(repeats)]
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return IsaacLabResult(skipped=f"failed: the Isaac Lab child ran past {TIMEOUT_S} s", child_wall_s=time.perf_counter() - started)
    except OSError as exc:
        return IsaacLabResult(skipped=f"{SKIP_HELP} ({RUNTIME_PYTHON} does not run: {exc})")
    wall = time.perf_counter() - started
    lines = proc.stdout.splitlines()
    skipped = [line[len(SKIPPED_PREFIX) :] for line in lines if line.startswith(SKIPPED_PREFIX)]
    if skipped:
        # The runtime is there but cannot run Isaac Lab; its message already says how to build it.
        return IsaacLabResult(skipped=f"skipped: {skipped[-1]}", child_wall_s=wall)
    reports = [line[len(JSON_PREFIX) :] for line in lines if line.startswith(JSON_PREFIX)]
    if proc.returncode != 0 or not reports:
        output = _tail(proc.stderr or proc.stdout)
        return IsaacLabResult(skipped=f"failed: the Isaac Lab child exited with {proc.returncode}:\n{output}", child_wall_s=wall)
    report = json.loads(reports[-1])
    return IsaacLabResult(
        report=report, child_wall_s=wall, adapter=_timing(report["adapter"]), raw=_timing(report["baseline"])
    )


# --- child side (Isaac Lab runtime, Python 3.12) -------------------------------------------


def _child(repeats: int, num_envs: int) -> dict[str, Any]:
    import importlib.metadata

    from robotics_lane.sim.base import BackendUnavailableError, TaskSpec
    from robotics_lane.sim.batch_rollout import run_episodes
    from robotics_lane.sim.controllers import BalancingController, ScriptedOperator
    from robotics_lane.sim.factory import make_vector_simulator

    seeds = list(range(num_envs))  # one round: every env runs one 200-step episode
    started = time.perf_counter()
    try:
        sim = make_vector_simulator("isaaclab", TaskSpec(max_steps=MAX_STEPS), num_envs=num_envs, device=DEVICE)
    except BackendUnavailableError as exc:
        print(SKIPPED_PREFIX + str(exc).replace("\n", " "), flush=True)
        raise SystemExit(0) from None
    start_s = time.perf_counter() - started
    import torch

    try:
        env = sim._env  # the gym env the adapter built, launched and steps (same wrappers)
        c = BalancingController()
        # Every call records its env steps; checked after timing: both must do the same work,
        # every episode balanced to the end.
        adapter_steps: list[int] = []
        raw_steps: list[int] = []

        def adapter() -> None:
            policy = ScriptedOperator(c, 0.0, num_envs, MAX_STEPS)
            adapter_steps.append(sum(e.length if e.success else -1 for e in run_episodes(sim, policy, seeds)))

        def raw() -> None:
            obs, _ = env.reset(seed=0)
            failed = torch.zeros(num_envs, dtype=torch.bool, device=DEVICE)
            for _ in range(MAX_STEPS):
                x, pole, v, pole_vel = obs["policy"].unbind(dim=1)
                theta, omega = -pole, -pole_vel  # Isaac's pole angle is positive towards -x
                u = c.k_angle * theta + c.k_angular_velocity * omega + c.k_position * (x - c.target_position) + c.k_velocity * v
                obs, _, terminated, truncated, _ = env.step(u.clamp(-1.0, 1.0).reshape(-1, 1))
                failed |= terminated | truncated
            raw_steps.append(num_envs * MAX_STEPS if not bool(failed.any()) else -1)

        adapter_timing, raw_timing = time_pair(adapter, raw, repeats=repeats)
    finally:
        sim.close()
    expected = num_envs * MAX_STEPS
    if set(adapter_steps) != {expected} or set(raw_steps) != {expected}:
        raise RuntimeError(
            f"env steps per call differ (adapter {sorted(set(adapter_steps))}, raw {sorted(set(raw_steps))}, "
            f"expected {expected}; -1 = an episode failed); the figure would compare different work"
        )

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "backend": "isaaclab",
        "task_id": "Isaac-Cartpole-Direct",
        "device": DEVICE,
        "num_envs": num_envs,
        "python": sys.version.split()[0],
        "packages": {n: version(n) for n in ("isaaclab", "torch", "warp-lang", "newton", "numpy")},
        "control_dt": sim.control_dt,
        "max_steps": MAX_STEPS,
        "seeds": seeds,
        "env_steps_per_call": expected,
        "start_up_s": start_s,
        "adapter": adapter_timing.to_dict(),
        "baseline": raw_timing.to_dict(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help="measure here (run with the Isaac Lab runtime's Python)")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--num-envs", type=int, default=NUM_ENVS)
    args = parser.parse_args(argv)
    if not args.child:
        parser.print_help()
        return 2
    report = _child(args.repeats, args.num_envs)
    print(JSON_PREFIX + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
