"""The cart-pole USD Isaac Lab opens: a registered scene file with the task's masses written in.

The scene itself (``cartpole-isaaclab``, made from the robot ``newton`` ships) is a registered
dataset version, made by ``robotics_lane/scenes/newton_cartpole.py``. Masses are load-time task
parameters, not scenes: ``loadable_usd`` takes the scene file as registered and, with any mass
scale other than 1, writes a derived copy into the user cache (``~/.cache/sinewgrid/isaaclab/``,
or ``$SINEWGRID_ASSET_CACHE``), named by the hash of its content. Imports only the standard
library (and the runtime's stdlib-only ``node`` module), so it runs in either venv.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from workload_runtime.node import cache_dir

def asset_cache_dir() -> Path:
    """Where generated assets live: ``$SINEWGRID_ASSET_CACHE`` or ``~/.cache/sinewgrid/isaaclab``."""
    return cache_dir("isaaclab")


def scale_masses(text: str, mass_scales: dict[str, float]) -> str:
    """The cart-pole USDA with each named prim's mass scaled (``{"pole": 1.5}``: a pole half again as heavy)."""
    scaled = text
    for prim, scale in mass_scales.items():
        if scale == 1.0:
            continue
        # The first `physics:mass` after `def Xform "<prim>"` is that body's mass.
        pattern = re.compile(rf'(def Xform "{prim}"[^{{]*\{{.*?float physics:mass = )([0-9.eE+-]+)', re.DOTALL)
        match = pattern.search(scaled)
        if match is None:
            raise RuntimeError(f"cart-pole USDA: no `physics:mass` found on prim {prim!r}; cannot scale it")
        mass = float(match.group(2)) * scale
        scaled = scaled[: match.start(2)] + repr(mass) + scaled[match.end(2) :]
    return scaled


def loadable_usd(scene_usd: Path, cart_mass_scale: float = 1.0, pole_mass_scale: float = 1.0) -> Path:
    """The USD Isaac Lab should open for this scene file and these mass scales.

    Nominal masses: the scene file itself. Other masses: a copy with them written in, in the user
    cache, named by the hash of its content (a different scene or different masses give another
    file; an existing one is never stale).
    """
    scales = {"cart": float(cart_mass_scale), "pole": float(pole_mass_scale)}
    if all(v == 1.0 for v in scales.values()):
        return scene_usd
    text = scale_masses(scene_usd.read_bytes().decode("utf-8"), scales)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    target = asset_cache_dir() / f"cartpole_{digest}.usda"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text)
        tmp.replace(target)  # atomic: concurrent workers never read half a file
    return target
