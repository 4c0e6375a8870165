"""Simulated cameras: what a fixed camera beside the cart-pole sees, rendered offscreen on the CPU.

A camera is named (``CAMERAS``: ``"front"``) and lands in a LeRobot dataset as the video
feature ``observation.images.<name>`` (``feature_name``). ``MujocoCameras`` renders them with
MuJoCo's own renderer (``mjv_updateScene`` / ``mjr_render`` / ``mjr_readPixels``, what
``mujoco.Renderer`` calls) into uint8 ``(H, W, 3)`` frames: one OpenGL context and one scene
for all the envs of a vector simulator, each env's ``MjData`` drawn in turn.

Offscreen through EGL, chosen here in code (``mujoco.egl.GLContext``) rather than through
``MUJOCO_GL``: MuJoCo reads ``MUJOCO_GL`` once, when it is first imported, and a warm workload
is forked from an interpreter that imported MuJoCo before the workload ran, so the variable
would come too late. On a machine without a GPU, EGL is Mesa's software rasterizer
(llvmpipe; Debian packages ``libegl1 libegl-mesa0 libgl1-mesa-dri``); on an NVIDIA node, the
driver's EGL. The same state gives the same pixels: the frames of an episode depend only on
its seed, like its states.

No multisampling (``MULTISAMPLES``): MuJoCo's offscreen buffer is 4x multisampled by default,
and in Mesa's software rasterizer that resolve is most of a frame's cost. Measured on this
project's 2-core CPU machine, 400 frames of the cart-pole: 0.6 ms per 128x96 frame without, 2.1
ms with (the frames differ only along edges: 1.5% of pixels by more than 8 grey levels). Setting
a context up costs ~0.05 s (~3 s for the process's first, while Mesa starts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEBIAN_PACKAGES = "libegl1 libegl-mesa0 libgl1-mesa-dri"
# Samples per pixel of the offscreen buffer (MuJoCo's `offsamples`, 4 by default): 0 renders 3.5x faster on the CPU.
MULTISAMPLES = 0


@dataclass(frozen=True)
class CameraSpec:
    """A camera fixed in the world, looking at a point: MuJoCo's free-camera parameters."""

    width: int
    height: int
    lookat: tuple[float, float, float]
    distance: float  # metres from ``lookat``
    azimuth: float  # degrees; 90 looks along +y, so the rail (x) runs across the image
    elevation: float  # degrees; negative looks down


# The rail spans x in [-1.02, 1.02] m and the cart reaches 0.2 m past its centre; the pole is 0.6 m.
# 128x96 (4:3, like the rail's scene) shows the whole rail with a margin at the cost of ~1.5 ms.
CAMERAS: dict[str, CameraSpec] = {
    "front": CameraSpec(width=128, height=96, lookat=(0.0, 0.0, 0.2), distance=2.6, azimuth=90.0, elevation=-5.0),
}


class OffscreenRenderingUnavailable(RuntimeError):
    """MuJoCo cannot open an offscreen (EGL) OpenGL context in this process."""


def feature_name(camera: str) -> str:
    """The LeRobot feature a camera's frames are stored as: ``observation.images.<camera>``."""
    return f"observation.images.{camera}"


def image_features(images: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Frames by camera name -> frames by LeRobot feature name."""
    return {feature_name(camera): frames for camera, frames in images.items()}


def image_shape(camera: str) -> tuple[int, int, int]:
    """A camera's frame shape: (height, width, 3)."""
    spec = CAMERAS[camera]
    return (spec.height, spec.width, 3)


def check_cameras(cameras: Sequence[str], where: str = "cameras") -> tuple[str, ...]:
    """The camera names, validated: known (``CAMERAS``) and each named once."""
    if isinstance(cameras, str):
        raise ValueError(f"{where} must be a list of camera names, got the string {cameras!r}; write [{cameras!r}]")
    names = tuple(cameras)
    unknown = [c for c in names if c not in CAMERAS]
    if unknown:
        raise ValueError(f"{where}: unknown camera(s) {unknown}; known cameras: {sorted(CAMERAS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: each camera may be named once, got {list(names)}")
    return names


def _egl_context(width: int, height: int):  # -> mujoco.egl.GLContext
    try:
        from mujoco.egl import GLContext

        return GLContext(width, height)
    except (ImportError, OSError, RuntimeError, AttributeError) as exc:
        raise OffscreenRenderingUnavailable(
            f"MuJoCo cannot render cameras offscreen here: EGL did not start ({type(exc).__name__}: {exc}). "
            f"On Debian or Ubuntu install Mesa's EGL (software rendering, no GPU needed): "
            f"`apt-get install -y --no-install-recommends {DEBIAN_PACKAGES}`; on an NVIDIA node the driver "
            "provides EGL (containers need NVIDIA_DRIVER_CAPABILITIES to include `graphics`). PYOPENGL_PLATFORM, "
            "if set, must be `egl`. Or ask for no cameras (state-only episodes)."
        ) from exc


class MujocoCameras:
    """Renders the named cameras of a MuJoCo cart-pole, for any ``MjData`` of that model."""

    def __init__(self, model, cameras: Sequence[str]) -> None:  # model: mujoco.MjModel
        import mujoco

        self.cameras = check_cameras(cameras)
        self.specs = {name: CAMERAS[name] for name in self.cameras}
        width = max(spec.width for spec in self.specs.values())
        height = max(spec.height for spec in self.specs.values())
        if width > model.vis.global_.offwidth or height > model.vis.global_.offheight:
            raise ValueError(
                f"cameras {list(self.cameras)} need a {width}x{height} offscreen buffer; the model's is "
                f"{model.vis.global_.offwidth}x{model.vis.global_.offheight}"
            )
        self._mujoco = mujoco
        self._gl = _egl_context(width, height)
        self._gl.make_current()
        default_samples = model.vis.quality.offsamples
        model.vis.quality.offsamples = MULTISAMPLES  # read once, as the context makes its buffer
        try:
            self._context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150.value)
        finally:
            model.vis.quality.offsamples = default_samples
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN.value, self._context)
        self._scene = mujoco.MjvScene(model, maxgeom=max(100, 4 * model.ngeom))
        self._option = mujoco.MjvOption()
        self._views = {}
        for name, spec in self.specs.items():
            view = mujoco.MjvCamera()
            view.type = mujoco.mjtCamera.mjCAMERA_FREE
            view.lookat[:] = spec.lookat
            view.distance, view.azimuth, view.elevation = spec.distance, spec.azimuth, spec.elevation
            self._views[name] = (view, mujoco.MjrRect(0, 0, spec.width, spec.height))

    def render(self, model, data, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Each camera's view of ``data`` now: {camera: uint8 (H, W, 3)}, top row first.

        ``out`` may hold, per camera, an array to draw into (e.g. a row of an episode's frames)."""
        if self._context is None:
            raise RuntimeError("MujocoCameras.render called after close()")
        mj = self._mujoco
        self._gl.make_current()
        frames = {}
        for name, (view, rect) in self._views.items():
            mj.mjv_updateScene(model, data, self._option, None, view, mj.mjtCatBit.mjCAT_ALL.value, self._scene)
            mj.mjr_render(rect, self._scene, self._context)
            spec = self.specs[name]
            buffer = np.empty((spec.height, spec.width, 3), dtype=np.uint8)
            mj.mjr_readPixels(buffer, None, rect, self._context)
            target = out[name] if out is not None else np.empty_like(buffer)
            target[...] = buffer[::-1]  # OpenGL reads bottom row first
            frames[name] = target
        return frames

    def close(self) -> None:
        """Free the OpenGL context (safe to call twice)."""
        if self._context is not None:
            with self._gl.as_current():
                self._context.free()
            self._context = None
            self._gl.free()
