"""The ``cartpole-isaaclab`` scene's file, made from the copy of the robot the ``newton`` package ships.

Isaac Lab's own Cartpole task fetches ``cartpole.usd`` from NVIDIA's asset server, out of reach
on an offline machine. ``newton`` (installed with isaaclab) ships the same robot,
``examples/assets/cartpole_single_pendulum.usda``: same prims, same joint names
(``slider_to_cart``, ``cart_to_pole``), 1 kg cart, 1 kg pole with its centre of mass 0.47 m up.
It loads in Isaac Lab once its ``defaultPrim`` reads ``"cartpole"`` (the prim's real name).

Standard library only; it finds ``newton`` without importing it, so only the Isaac Lab runtime,
which has it, can make the scene (``build.py`` checks the bytes against the catalog's pins).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from robotics_lane.scenes.catalog import SceneError

NEWTON_ASSET = ("examples", "assets", "cartpole_single_pendulum.usda")


def newton_cartpole_source() -> Path:
    """The cart-pole USDA inside the installed ``newton`` package."""
    spec = importlib.util.find_spec("newton")
    if spec is None or not spec.submodule_search_locations:
        raise SceneError(
            "The Isaac Lab cart-pole scene is made from the `newton` package, which this Python "
            "cannot import; run it with .venv-isaaclab/bin/python (build it with `make isaaclab-runtime`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]).joinpath(*NEWTON_ASSET)
    if not path.is_file():
        raise SceneError(
            f"{path} is missing: the installed `newton` no longer ships the cart-pole asset; "
            "rebuild the runtime with `make clean-isaaclab-runtime isaaclab-runtime`"
        )
    return path


def fix_default_prim(text: str) -> str:
    """newton's cart-pole names its default prim ``cartPole``; the prim is ``cartpole``."""
    fixed, count = text.replace('defaultPrim = "cartPole"', 'defaultPrim = "cartpole"'), text.count('defaultPrim = "cartPole"')
    if count != 1:
        raise SceneError(f'newton cart-pole USDA: expected one `defaultPrim = "cartPole"` line to fix, found {count}')
    return fixed


def generate_cartpole_usda() -> bytes:
    """The ``cartpole-isaaclab`` scene's file: newton's cart-pole with its ``defaultPrim`` fixed."""
    return fix_default_prim(newton_cartpole_source().read_bytes().decode("utf-8")).encode("utf-8")
