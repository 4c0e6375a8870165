"""Camera cost on Isaac Lab: the demo sweep's rollout with the front camera against the same without.

Runs in the Isaac Lab runtime, from the repository root::

    .venv-isaaclab/bin/python -m benchmarks.isaaclab_cameras [--num-envs 4] [--repeats 5]

Subject: ``run_episodes`` on ``make_vector_simulator("isaaclab", TaskSpec(max_steps=200),
num_envs=N, cameras=("front",))`` over N seeds with the balancing controller (every env one
200-step episode; one 128x96 frame of every running env ray-traced by Newton's Warp renderer
before each step): the ``cartpole-isaaclab`` sweep's shape with N=4. Baseline: the same rollout
on a simulator made without cameras (same seeds, same 200 steps: rendering changes no physics).
Isaac Lab holds one simulation per process, so the two simulators are built one after the
other and each is timed ``repeats`` times (not in alternation, unlike ``time_pair``); start-up
is reported, not in the figure. The cost per step is the difference of the two medians over the
200 steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from benchmarks import REPEATS

MAX_STEPS = 200


def _time_rollouts(num_envs: int, cameras: tuple[str, ...], repeats: int) -> dict[str, float]:
    from robotics_lane.sim.base import TaskSpec
    from robotics_lane.sim.batch_rollout import run_episodes
    from robotics_lane.sim.controllers import BalancingController, ScriptedOperator
    from robotics_lane.sim.factory import make_vector_simulator

    started = time.perf_counter()
    with make_vector_simulator("isaaclab", TaskSpec(max_steps=MAX_STEPS), num_envs=num_envs, cameras=cameras) as sim:
        start_s = time.perf_counter() - started
        seeds = list(range(num_envs))

        def rollout() -> int:
            policy = ScriptedOperator(BalancingController(), 0.0, num_envs, MAX_STEPS)
            return sum(episode.length for episode in run_episodes(sim, policy, seeds))

        assert rollout() == num_envs * MAX_STEPS  # warm-up (Warp's first launches); every episode balances
        seconds = []
        for _ in range(repeats):
            began = time.perf_counter()
            rollout()
            seconds.append(time.perf_counter() - began)
    return {"start_s": start_s, "rollout_s": statistics.median(seconds), "repeats_s": seconds}


def measure(num_envs: int = 4, repeats: int = REPEATS) -> dict:
    with_camera = _time_rollouts(num_envs, ("front",), repeats)
    without = _time_rollouts(num_envs, (), repeats)
    return {
        "num_envs": num_envs,
        "steps": MAX_STEPS,
        "with_front_camera": with_camera,
        "without_camera": without,
        "ms_per_step_with_camera": with_camera["rollout_s"] / MAX_STEPS * 1e3,
        "ms_per_step_without_camera": without["rollout_s"] / MAX_STEPS * 1e3,
        "ms_per_step_for_the_camera": (with_camera["rollout_s"] - without["rollout_s"]) / MAX_STEPS * 1e3,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args()
    print("BENCH_JSON " + json.dumps(measure(args.num_envs, args.repeats)), flush=True)
