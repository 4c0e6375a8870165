"""Camera cost on MuJoCo: a 200-step episode with the front camera, as rendered and 4x multisampled, against none.

Subject: ``run_episode`` on ``make_simulator("mujoco", TaskSpec(max_steps=200),
cameras=("front",))`` with the balancing controller (one 128x96 frame rendered offscreen through
EGL before each step, without multisampling: ``camera.MULTISAMPLES``). Baselines: the same
simulator whose camera context was made with MuJoCo's default 4x multisampling (the renderer
before it was turned off), and one made without cameras; same seed, same controller (the same
200 steps: rendering changes no physics). The simulators are built once, outside the timing, as
the rollout workload keeps its own for many episodes. A frame's cost is the difference of an
episode's median from the camera-less one's, over the 200 frames.

Run: ``python -m benchmarks.cameras`` (prints the medians of ``REPEATS`` repeats, in alternation).
"""

from __future__ import annotations

from unittest import mock

from benchmarks import REPEATS, time_group
from robotics_lane.sim import BalancingController, TaskSpec, camera, make_simulator, run_episode

MUJOCO_DEFAULT_SAMPLES = 4


def measure(repeats: int = REPEATS) -> dict[str, float]:
    task = TaskSpec(max_steps=200)
    with mock.patch.object(camera, "MULTISAMPLES", MUJOCO_DEFAULT_SAMPLES):
        multisampled = make_simulator("mujoco", task, cameras=("front",))
    with multisampled, make_simulator("mujoco", task, cameras=("front",)) as seeing, make_simulator("mujoco", task) as blind:
        controller = BalancingController()
        with_camera, with_multisampling, without = time_group(
            [lambda sim=sim: run_episode(sim, controller, seed=3) for sim in (seeing, multisampled, blind)], repeats=repeats
        )
        frames = run_episode(seeing, controller, seed=3).images["front"]
        assert len(frames) == run_episode(blind, controller, seed=3).length == task.max_steps
    per_frame = lambda timing: (timing.median - without.median) / len(frames) * 1e3  # noqa: E731
    return {
        "episode_with_front_camera_s": with_camera.median,
        "episode_with_4x_multisampled_camera_s": with_multisampling.median,
        "episode_without_camera_s": without.median,
        "ms_per_128x96_frame": per_frame(with_camera),
        "ms_per_128x96_frame_4x_multisampled": per_frame(with_multisampling),
    }


if __name__ == "__main__":
    for name, value in measure().items():
        print(f"{name:40s} {value:.4f}")
