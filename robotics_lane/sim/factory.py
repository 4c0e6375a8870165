"""Build a simulator by name: the one place that knows every simulator backend.

Backends are imported only when asked for: MuJoCo needs the main venv, Isaac Lab its own
Python 3.12 runtime (``make isaaclab-runtime``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from robotics_lane.sim.base import KNOWN_BACKENDS, Backend, Simulator, TaskSpec
from robotics_lane.sim.camera import check_cameras
from robotics_lane.sim.vector import SingleEnv, VectorSimulatorBase

# Envs per process when the rollout config leaves ``num_envs`` unset, by (backend, device kind).
# MuJoCo: gymnasium's SyncVectorEnv steps its copies one after the other, so more envs only
# spread the adapter's per-step numpy work (figure 3a); more cores are used by more shards.
# Isaac Lab steps every env in one physics call: ~8 ms per step on this CPU whatever the count
# up to a few hundred envs (figure 3b), and Isaac Lab's own Cartpole default on a GPU.
DEFAULT_NUM_ENVS: dict[tuple[str, str], int] = {
    ("mujoco", "cpu"): 64,
    ("isaaclab", "cpu"): 256,
    ("isaaclab", "cuda"): 4096,
}
MAX_NUM_ENVS = 65_536


def resolve_device(backend: str, device: str = "auto") -> str:
    """Where a backend simulates: ``"auto"`` is the node's GPU for Isaac Lab when torch sees one
    (``"cuda:0"``), the CPU otherwise; MuJoCo runs on the CPU only."""
    if backend not in KNOWN_BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known backends: {list(KNOWN_BACKENDS)}")
    if device not in ("auto", "cpu", "cuda") and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise ValueError(f"device {device!r}: use 'auto', 'cpu', 'cuda' or 'cuda:<index>'")
    if backend == "mujoco":
        if device not in ("auto", "cpu"):
            raise ValueError(f"the MuJoCo backend runs on the CPU only, got device={device!r}; use 'cpu' or 'auto'")
        return "cpu"
    if device != "auto":
        return device
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def default_num_envs(backend: str, device: str, episodes: int | None = None) -> int:
    """Envs per process for ``backend`` on ``device`` (see ``DEFAULT_NUM_ENVS``), never more
    than the ``episodes`` there are to run."""
    n = DEFAULT_NUM_ENVS[(backend, device.split(":")[0])]
    return max(1, min(n, episodes)) if episodes is not None else n


def make_vector_simulator(
    backend: Backend, task: TaskSpec | None = None, *, num_envs: int, device: str = "cpu", cameras: Sequence[str] = (), scene: Path | None = None
) -> VectorSimulatorBase:
    """Build ``num_envs`` environments of ``task`` on ``backend`` that step together.

    ``device`` is where Isaac Lab simulates ("cpu", or "cuda:0" on a GPU node; ``resolve_device``
    picks one); MuJoCo runs on the CPU only. ``cameras`` (``camera.CAMERAS``) are rendered
    offscreen by ``render()`` (MuJoCo's renderer through EGL, Isaac Lab's Newton Warp ray tracer). ``scene`` is the
    local file of the scene to load (a registered version, ``robotics_lane.scenes.files.local_scene``);
    unset, the catalog's scene for the backend as it is now.
    """
    task = task or TaskSpec()
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or not 1 <= num_envs <= MAX_NUM_ENVS:
        raise ValueError(f"num_envs must be an integer from 1 to {MAX_NUM_ENVS}, got {num_envs!r}")
    if backend not in KNOWN_BACKENDS:
        raise ValueError(f"make_simulator: unknown backend {backend!r}; known backends: {list(KNOWN_BACKENDS)}")
    cameras = check_cameras(cameras)
    if backend == "mujoco":
        if device != "cpu":
            raise ValueError(f"make_simulator: the MuJoCo backend runs on the CPU only, got device={device!r}")
        from robotics_lane.sim.mujoco_backend import MujocoCartpoleVec

        return MujocoCartpoleVec(task, num_envs, cameras, scene=scene)
    from robotics_lane.sim.isaaclab_backend import IsaacLabCartpoleVec

    return IsaacLabCartpoleVec(task, num_envs, device=device, scene=scene, cameras=cameras)


def make_simulator(
    backend: Backend, task: TaskSpec | None = None, *, device: str = "cpu", cameras: Sequence[str] = ()
) -> Simulator:
    """Build a one-env simulator for ``task`` on ``backend`` ("mujoco" or "isaaclab").

    The same physics as ``make_vector_simulator`` with ``num_envs=1``, behind ``reset(seed)``,
    ``step(action)`` and ``render()``: what teleop demonstrations and the robot-cell stand-in use.
    """
    return SingleEnv(make_vector_simulator(backend, task, num_envs=1, device=device, cameras=cameras))
