"""Isaac Lab cameras: the cameras of ``camera.CAMERAS`` as Isaac Lab camera sensors, ray-traced by Newton.

Isaac Lab 3.0 renders a camera kit-less, without Isaac Sim, through Newton's Warp ray tracer
(``isaaclab_newton.renderers.NewtonWarpRendererCfg`` over ``newton.sensors.SensorTiledCamera``):
one ``isaaclab.sensors.Camera`` per camera name, with one view per env, all envs traced in one
call, on ``device="cpu"`` here (a GPU's ``cuda:0`` is untested in this project). Frames have the name and resolution of
MuJoCo's (``camera.image_shape``), uint8 RGB, top row first.

Placement: Isaac's cart-pole rail runs along world ``y`` (±4 m, the task ends an episode past
±3 m) and the pole swings in the ``y``-``z`` plane. ``front`` sits beside the rail on ``+x``
looking back along ``-x``, so the rail runs across the image: the cart moves right as
``cart_position`` grows and the pole's tip leans right as ``pole_angle`` grows, as in MuJoCo's
``front``. It frames ``ISAAC_VIEWS["front"].half_width`` metres either side of the rail's centre.

When a frame is taken: Isaac Lab's sensors are lazy (rendered when their data is read). ``render``
forces a fresh trace of the state *now* (``Camera.update(0, force_recompute=True)``), so the frame
is the one the camera sees at the instant of the observation, also right after the adapter's own
seeded reset (which writes joint states after Isaac's reset). Stepping never renders: a simulator
with cameras that is not asked for frames costs only a timestamp kernel per physics step.
Rendering changes no physics: states with and without cameras are bit-identical, and frames
depend only on the episode's seed, not on the env slot (``tests/test_isaaclab_cameras.py``).
Cost: ~1.3 ms per frame on this 2-core CPU (``benchmarks/isaaclab_cameras.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from robotics_lane.sim.camera import CAMERAS, check_cameras

# Isaac Lab's own cart-pole camera lens (``CartpoleTiledCameraCfg``): 47 degrees across.
FOCAL_LENGTH_MM = 24.0
HORIZONTAL_APERTURE_MM = 20.955


@dataclass(frozen=True)
class IsaacCameraView:
    """Where a camera sits in Isaac's cart-pole scene: it looks at ``lookat`` (metres from the
    rail's centre) from the ``+x`` side of the rail, down by ``elevation`` degrees, far enough that
    ``half_width`` metres either side of ``lookat`` fill the image across."""

    lookat: tuple[float, float, float]
    half_width: float  # metres of rail shown either side of ``lookat``
    elevation: float  # degrees; negative looks down

    @property
    def distance(self) -> float:
        """Metres from the camera to ``lookat``."""
        return self.half_width * FOCAL_LENGTH_MM / (HORIZONTAL_APERTURE_MM / 2)

    def eye(self, rail: Sequence[float] = (0.0, 0.0, 0.0)) -> tuple[float, float, float]:
        """The camera's position (metres) in the env's frame, for a rail centred at ``rail``."""
        down = math.radians(-self.elevation)
        x, y, z = (a + b for a, b in zip(self.lookat, rail))
        return (x + self.distance * math.cos(down), y, z + self.distance * math.sin(down))

    def rotation(self) -> tuple[float, float, float, float]:
        """The camera's orientation as an (x, y, z, w) quaternion in Isaac Lab's ``"world"``
        camera convention (forward +x, up +z): turned 180 degrees about z, then pitched down."""
        yaw, pitch = math.pi, math.radians(-self.elevation)
        cy, sy, cp, sp = math.cos(yaw / 2), math.sin(yaw / 2), math.cos(pitch / 2), math.sin(pitch / 2)
        # q_yaw (about z) * q_pitch (about y), in (x, y, z, w)
        return (-sy * sp, cy * sp, sy * cp, cy * cp)


# The pole reaches 0.97 m above the rail; the cart's travel is ±3 m before the task ends the episode.
ISAAC_VIEWS: dict[str, IsaacCameraView] = {
    "front": IsaacCameraView(lookat=(0.0, 0.0, 0.45), half_width=3.2, elevation=-5.0),
}


def sensor_name(camera: str) -> str:
    """The name of a camera's sensor in the Isaac Lab scene (``env.scene[...]``)."""
    return f"camera_{camera}"


def add_cameras(env_cfg: Any, cameras: Sequence[str]) -> None:
    """Add a Newton-Warp-rendered camera sensor per camera name to an Isaac Lab env config."""
    import isaaclab.sim as sim_utils
    from isaaclab.sensors import CameraCfg
    from isaaclab_newton.renderers import NewtonWarpRendererCfg

    rail = tuple(env_cfg.scene.cartpole.init_state.pos)
    for name in check_cameras(cameras):
        spec, view = CAMERAS[name], ISAAC_VIEWS[name]
        sensor = CameraCfg(
            prim_path="{ENV_REGEX_NS}/" + sensor_name(name),
            # Isaac's cart-pole stands with its rail 2 m up (``init_state.pos``); the camera follows it.
            offset=CameraCfg.OffsetCfg(pos=view.eye(rail), rot=view.rotation(), convention="world"),
            data_types=["rgb"],
            spawn=sim_utils.PinholeCameraCfg(
                focal_length=FOCAL_LENGTH_MM, focus_distance=400.0,
                horizontal_aperture=HORIZONTAL_APERTURE_MM, clipping_range=(0.1, 20.0),
            ),
            width=spec.width,
            height=spec.height,
            # A concrete renderer: Isaac Lab's presets carry a multi-backend choice that
            # launch_simulation refuses kit-less.
            renderer_cfg=NewtonWarpRendererCfg(),
        )
        setattr(env_cfg.scene, sensor_name(name), sensor)


class IsaacLabCameras:
    """The camera sensors of an Isaac Lab scene built with ``add_cameras``."""

    def __init__(self, scene: Any, cameras: Sequence[str]) -> None:
        self.cameras = check_cameras(cameras)
        self._sensors = {name: scene[sensor_name(name)] for name in self.cameras}

    def render(self, envs: np.ndarray) -> dict[str, np.ndarray]:
        """Each camera's view of the envs at the indices ``envs`` now: {camera: uint8 (k, H, W, 3)}."""
        frames = {}
        for name, sensor in self._sensors.items():
            sensor.update(0.0, force_recompute=True)  # trace the state now, not a cached frame
            rgb = sensor.data.output["rgb"].torch[..., :3]
            frames[name] = rgb[envs].detach().to("cpu").numpy().astype(np.uint8, copy=True)
        return frames
