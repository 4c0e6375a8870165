"""Make a scene's files from its source, exactly as the catalog says they are, and put them on the store.

A committed scene is read from this checkout. A generated one is made by its generator (the
Isaac Lab cart-pole from the installed ``newton``, so only in the Isaac Lab runtime) and must
hash to the catalog's pins: a generator that now makes other bytes is refused with the new
hash, never published under the old version.

Run in the Isaac Lab runtime by ``robotics_lane.workloads.build_scene``; in the orchestrator
for committed scenes. No Dagster here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import posixpath
from collections.abc import Callable

from robotics_lane.scenes.catalog import SceneError, SceneSource
from robotics_lane.scenes.newton_cartpole import generate_cartpole_usda
from workload_runtime.storage import write_bytes_atomic


def _isaaclab_cartpole() -> dict[str, bytes]:
    return {"cartpole.usda": generate_cartpole_usda()}


# Generated scenes: the function that makes their files, and the package it needs.
GENERATORS: dict[str, tuple[Callable[[], dict[str, bytes]], str]] = {
    "cartpole-isaaclab": (_isaaclab_cartpole, "newton"),
}


def can_build_here(source: SceneSource) -> bool:
    """Whether this Python can make the scene's files (a generated scene needs its package)."""
    return not source.generated or importlib.util.find_spec(GENERATORS[source.name][1]) is not None


def scene_bytes(source: SceneSource) -> dict[str, bytes]:
    """The scene's files (relative path -> bytes), checked against the catalog."""
    if not source.generated:
        return {name: (source.folder / name).read_bytes() for name in source.files()}
    if source.name not in GENERATORS:
        raise SceneError(f"scene {source.name!r} is pinned in the catalog but has no generator in robotics_lane/scenes/build.py")
    generate, package = GENERATORS[source.name]
    if importlib.util.find_spec(package) is None:
        raise SceneError(f"scene {source.name!r} is generated from the `{package}` package, which this Python cannot import; "
                         f"build it in the {source.runtime!r} runtime (robotics_lane.workloads.build_scene)")
    made = generate()
    got = {name: hashlib.sha256(data).hexdigest() for name, data in made.items()}
    if got != source.pinned:
        changed = sorted(set(got) ^ set(source.pinned) | {n for n in got if n in source.pinned and got[n] != source.pinned[n]})
        raise SceneError(
            f"scene {source.name!r}: its generator now makes other files than the catalog pins ({', '.join(changed)}: "
            f"made {got}, pinned {source.pinned}). Nothing was published. If the change is meant (e.g. a `{package}` "
            f"upgrade), set `pinned` of {source.name!r} in robotics_lane/scenes/catalog.py to what was made: that is a new "
            "scene version, and the sweeps that use it get new partitions."
        )
    return made


def write_scene(source: SceneSource, uri: str) -> dict[str, str]:
    """Write the scene's files under ``uri`` (a folder on the store), each atomically; returns their sha256."""
    files = scene_bytes(source)
    for name, data in sorted(files.items()):
        write_bytes_atomic(posixpath.join(uri, name), data)
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
