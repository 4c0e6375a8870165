"""The cart-pole USD for Isaac Lab: made offline from the copy the ``newton`` package ships, and
loaded with the task's masses.

Isaac Lab's own Cartpole task fetches ``cartpole.usd`` from NVIDIA's asset server, which is out
of reach on an offline machine. ``newton`` (installed with isaaclab) ships the same robot,
``examples/assets/cartpole_single_pendulum.usda``: same prims, same joint names
(``slider_to_cart``, ``cart_to_pole``), 1 kg cart, 1 kg pole with its centre of mass 0.47 m up.
It loads in Isaac Lab once its ``defaultPrim`` reads ``"cartpole"`` (the prim's real name).

``generate_cartpole_usda`` makes that scene (the ``cartpole-isaaclab`` scene of
``robotics_lane/scenes``, registered as a dataset version and never committed). ``loadable_usd``
takes a scene file as registered and applies the task's mass scales, which are load-time
parameters, not scenes: with any scale other than 1 it writes a derived copy into the user cache
(``~/.cache/sinewgrid/isaaclab/``, or ``$SINEWGRID_ASSET_CACHE``), named by the hash of its
content. Imports only the standard library (and the runtime's stdlib-only ``node`` module), so
it runs in either venv.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from pathlib import Path

from shared_resources.runtime.node import cache_dir

NEWTON_ASSET = ("examples", "assets", "cartpole_single_pendulum.usda")
# (prim that owns the mass, task parameter that scales it)
MASS_PRIMS = {"cart": "cart_mass_scale", "pole": "pole_mass_scale"}


def asset_cache_dir() -> Path:
    """Where generated assets live: ``$SINEWGRID_ASSET_CACHE`` or ``~/.cache/sinewgrid/isaaclab``."""
    return cache_dir("isaaclab", override_env="SINEWGRID_ASSET_CACHE")


def newton_cartpole_source() -> Path:
    """The cart-pole USDA inside the installed ``newton`` package."""
    spec = importlib.util.find_spec("newton")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "The Isaac Lab cart-pole asset is made from the `newton` package, which this Python "
            "cannot import; run the Isaac Lab backend with .venv-isaaclab/bin/python "
            "(build it with `make isaaclab-runtime`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]).joinpath(*NEWTON_ASSET)
    if not path.is_file():
        raise RuntimeError(
            f"{path} is missing: the installed `newton` no longer ships the cart-pole asset; "
            "rebuild the runtime with `make clean-isaaclab-runtime isaaclab-runtime`"
        )
    return path


def patch_cartpole_usda(text: str, mass_scales: dict[str, float] | None = None) -> str:
    """Make newton's cart-pole loadable by Isaac Lab and apply mass scales (by prim name)."""
    patched, count = re.subn(r'defaultPrim = "cartPole"', 'defaultPrim = "cartpole"', text)
    if count != 1 and 'defaultPrim = "cartpole"' not in text:
        raise RuntimeError('newton cart-pole USDA: expected one `defaultPrim = "cartPole"` line to fix; found none')
    for prim, scale in (mass_scales or {}).items():
        if scale == 1.0:
            continue
        # The first `physics:mass` after `def Xform "<prim>"` is that body's mass.
        pattern = re.compile(rf'(def Xform "{prim}"[^{{]*\{{.*?float physics:mass = )([0-9.eE+-]+)', re.DOTALL)
        match = pattern.search(patched)
        if match is None:
            raise RuntimeError(f"newton cart-pole USDA: no `physics:mass` found on prim {prim!r}; cannot scale it")
        mass = float(match.group(2)) * scale
        patched = patched[: match.start(2)] + repr(mass) + patched[match.end(2) :]
    return patched


def generate_cartpole_usda() -> bytes:
    """The ``cartpole-isaaclab`` scene's file: newton's cart-pole with its ``defaultPrim`` fixed."""
    return patch_cartpole_usda(newton_cartpole_source().read_bytes().decode("utf-8")).encode("utf-8")


def loadable_usd(scene_usd: Path, cart_mass_scale: float = 1.0, pole_mass_scale: float = 1.0) -> Path:
    """The USD Isaac Lab should open for this scene file and these mass scales.

    Nominal masses: the scene file itself. Other masses: a copy with them written in, in the user
    cache, named by the hash of its content (a different scene or different masses give another
    file; an existing one is never stale).
    """
    scales = {"cart": float(cart_mass_scale), "pole": float(pole_mass_scale)}
    if all(v == 1.0 for v in scales.values()):
        return scene_usd
    text = patch_cartpole_usda(scene_usd.read_bytes().decode("utf-8"), scales)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    target = asset_cache_dir() / f"cartpole_{digest}.usda"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text)
        tmp.replace(target)  # atomic: concurrent workers never read half a file
    return target
