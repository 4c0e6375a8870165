"""Build a simulator by name: the one place that knows every simulator backend.

Backends are imported only when asked for: MuJoCo needs the main venv, Isaac Lab its own
Python 3.12 runtime (``make isaaclab-runtime``).
"""

from __future__ import annotations

from robotics_lane.sim.base import KNOWN_BACKENDS, Backend, Simulator, TaskSpec


def make_simulator(backend: Backend, task: TaskSpec | None = None, *, device: str = "cpu") -> Simulator:
    """Build a simulator for ``task`` on ``backend`` ("mujoco" or "isaaclab").

    ``device`` is where Isaac Lab simulates ("cpu" here, "cuda:0" on a GPU pool); MuJoCo runs
    on the CPU only. Backends are imported only when asked for: MuJoCo needs the main venv,
    Isaac Lab its own Python 3.12 runtime (``make isaaclab-runtime``).
    """
    task = task or TaskSpec()
    if backend == "mujoco":
        if device != "cpu":
            raise ValueError(f"make_simulator: the MuJoCo backend runs on the CPU only, got device={device!r}")
        from robotics_lane.sim.mujoco_backend import MujocoCartpole

        return MujocoCartpole(task)
    if backend == "isaaclab":
        from robotics_lane.sim.isaaclab_backend import IsaacLabCartpole

        return IsaacLabCartpole(task, device=device)
    raise ValueError(f"make_simulator: unknown backend {backend!r}; known backends: {list(KNOWN_BACKENDS)}")
