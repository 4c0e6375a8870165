"""Camera cost on MuJoCo: a 200-step episode with the front camera against the same episode without.

Subject: ``run_episode`` on ``make_simulator("mujoco", TaskSpec(max_steps=200),
cameras=("front",))`` with the balancing controller (one 128x96 frame rendered offscreen through
EGL before each step); baseline: the same simulator made without cameras, same seed, same
controller (the same 200 steps: rendering changes no physics). Both simulators are built once,
outside the timing, as the rollout workload keeps its own for many episodes. The cost of one
frame is the difference of the two medians over the 200 frames.

Run: ``python -m benchmarks.cameras`` (prints the medians of ``REPEATS`` repeats, in alternation).
"""

from __future__ import annotations

from benchmarks import REPEATS, time_pair
from robotics_lane.sim import BalancingController, TaskSpec, make_simulator, run_episode


def measure(repeats: int = REPEATS) -> dict[str, float]:
    task = TaskSpec(max_steps=200)
    with make_simulator("mujoco", task, cameras=("front",)) as seeing, make_simulator("mujoco", task) as blind:
        controller = BalancingController()
        with_camera, without = time_pair(
            lambda: run_episode(seeing, controller, seed=3), lambda: run_episode(blind, controller, seed=3), repeats=repeats
        )
        frames = run_episode(seeing, controller, seed=3).images["front"]
        assert len(frames) == run_episode(blind, controller, seed=3).length == task.max_steps
    return {
        "episode_with_front_camera_s": with_camera.median,
        "episode_without_camera_s": without.median,
        "ms_per_128x96_frame": (with_camera.median - without.median) / len(frames) * 1e3,
    }


if __name__ == "__main__":
    for name, value in measure().items():
        print(f"{name:32s} {value:.4f}")
