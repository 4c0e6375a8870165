"""The scenes a simulation runs in, and how their versions are named.

A scene is a folder of files a simulator loads: a robot description and its world (MJCF for
MuJoCo, USD for Isaac Lab), with textures if it has any. Its version is its content:
``<scene>-<hash8>``, where ``hash8`` starts the sha256 over its files' names and sha256s
(``content_hash``). The same files always give the same version; one changed byte gives a new one.

Where each scene's files come from:

- ``cartpole-mujoco``: committed here, ``sources/cartpole-mujoco/cartpole.xml`` (gymnasium's
  ``inverted_pendulum.xml``, MIT). Edit it and the version changes with it.
- ``cartpole-isaaclab``: generated at run time from the ``newton`` package of the Isaac Lab
  runtime (its ``cartpole_single_pendulum.usda``, Apache-2.0, with ``defaultPrim`` fixed), never
  committed. Its files' sha256 are pinned below, so its version is known without ``newton``
  and a newton release that changes the file is refused by name instead of changing the scene
  silently (``build.py``). To take such a change, update the pin: that makes a new version.

Task parameters (mass scales, gravity) are not scenes: simulators apply them when they load one.
Standard library only: imported in the main runtime and in Isaac Lab's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

SCENES_DATASET = "robotics/scenes"
SOURCES = Path(__file__).parent / "sources"
HASH_CHARS = 8  # in a version and a sweep partition key; the full sha256 is in the registry and lineage
SWEEP_KEY_SEPARATOR = "."  # `<sweep>.<hash8>`: valid in Dagster partition keys, folder names and registry versions


class SceneError(RuntimeError):
    """A scene cannot be named, built or loaded; the message says which, why and what to do."""


@dataclass(frozen=True)
class SceneSource:
    """One scene in the catalog: what it is for and where its files come from."""

    name: str
    backend: str  # the simulator that loads it
    format: str  # "mjcf" | "usd"
    entry: str  # the file the simulator opens; the others (meshes, textures) sit beside it
    description: str
    origin: str  # where its files come from, as the lineage shows it
    runtime: str = "default"  # the runtime that can build it (generated scenes only)
    pinned: dict[str, str] = field(default_factory=dict)  # generated scenes: file -> sha256 it must have

    @property
    def generated(self) -> bool:
        return bool(self.pinned)

    @property
    def folder(self) -> Path:
        """A committed scene's files in this checkout."""
        return SOURCES / self.name

    def files(self) -> dict[str, str]:
        """Each file of the scene (relative path) and its sha256: hashed from the committed files,
        or the pins of a generated scene."""
        if self.generated:
            return dict(self.pinned)
        if not (self.folder / self.entry).is_file():
            raise SceneError(f"scene {self.name!r}: its entry file {self.folder / self.entry} is missing; restore it from git")
        return {p.relative_to(self.folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(self.folder.rglob("*")) if p.is_file()}

    def version(self) -> str:
        """The version of the scene as the catalog has it now: ``<name>-<hash8>``."""
        return version_name(self.name, content_hash(self.files()))


SCENES: dict[str, SceneSource] = {
    "cartpole-mujoco": SceneSource(
        name="cartpole-mujoco",
        backend="mujoco",
        format="mjcf",
        entry="cartpole.xml",
        description="MuJoCo cart-pole: a 10.5 kg cart on a 2 m rail, a 0.6 m, 5 kg pole, one 300 N motor.",
        origin="robotics_lane/scenes/sources/cartpole-mujoco (gymnasium 1.4.0 inverted_pendulum.xml, MIT)",
    ),
    "cartpole-isaaclab": SceneSource(
        name="cartpole-isaaclab",
        backend="isaaclab",
        format="usd",
        entry="cartpole.usda",
        description="Isaac Lab cart-pole (Newton physics): 1 kg cart, 1 kg pole, joints slider_to_cart and cart_to_pole.",
        origin="newton 1.6.1 examples/assets/cartpole_single_pendulum.usda (Apache-2.0), defaultPrim set to cartpole",
        runtime="isaaclab",
        pinned={"cartpole.usda": "336b0ace728ac68b962a7ba5dee37eb4775994747f42d8c1b4f442043e9e7593"},
    ),
}
# The scene a backend runs when nothing names another: evaluations, stand-ins, hand runs.
SCENE_OF_BACKEND = {"mujoco": "cartpole-mujoco", "isaaclab": "cartpole-isaaclab"}


def content_hash(files: dict[str, str]) -> str:
    """The sha256 of a scene's content: over each file's relative path and sha256, in path order."""
    listing = "".join(f"{name}\0{files[name]}\n" for name in sorted(files))
    return hashlib.sha256(listing.encode()).hexdigest()


def version_name(scene: str, digest: str) -> str:
    return f"{scene}-{digest[:HASH_CHARS]}"


def scene_source(name: str) -> SceneSource:
    """The catalog's scene of that name, or an error listing the known ones."""
    try:
        return SCENES[name]
    except KeyError:
        raise SceneError(f"unknown scene {name!r}; the catalog (robotics_lane/scenes/catalog.py) has {sorted(SCENES)}") from None


def _is_hash8(digest: str) -> bool:
    return len(digest) == HASH_CHARS and all(c in "0123456789abcdef" for c in digest)


def is_version(scene: str) -> bool:
    """Whether ``scene`` names a version of a catalog scene (``cartpole-mujoco-1a2b3c4d``), not the scene."""
    name, _, digest = scene.rpartition("-")
    return name in SCENES and _is_hash8(digest)


def split_version(version: str) -> tuple[SceneSource, str]:
    """``cartpole-mujoco-1a2b3c4d`` -> (its catalog scene, ``1a2b3c4d``)."""
    name, _, digest = version.rpartition("-")
    if not _is_hash8(digest):
        raise SceneError(f"{version!r} is not a scene version: write <scene>-<{HASH_CHARS} hex digits>, e.g. {SCENES['cartpole-mujoco'].version()}")
    return scene_source(name), digest


def scene_for(backend: str, scene: str | None = None) -> SceneSource:
    """The scene a run on ``backend`` uses: ``scene`` if named (it must be one that backend loads;
    a version, ``<scene>-<hash8>``, names its scene), else the backend's own (``SCENE_OF_BACKEND``)."""
    if scene is not None and is_version(scene):
        scene = scene.rpartition("-")[0]
    if scene is None:
        if backend not in SCENE_OF_BACKEND:
            raise SceneError(f"no scene for backend {backend!r}; backends with a scene: {sorted(SCENE_OF_BACKEND)}")
        scene = SCENE_OF_BACKEND[backend]
    source = scene_source(scene)
    if source.backend != backend:
        raise SceneError(f"scene {scene!r} is a {source.format} scene for {source.backend}; backend {backend!r} cannot load it. "
                         f"Name a {backend} scene: {sorted(n for n, s in SCENES.items() if s.backend == backend)}")
    return source


def scene_version_for(backend: str, scene: str | None = None) -> str:
    """The scene version a sweep on ``backend`` runs: ``scene`` itself when it names a version
    (pinned: it runs those registered bytes whatever the catalog has since become), else the
    current version of the catalog scene it names, or of the backend's own."""
    source = scene_for(backend, scene)
    return scene if scene is not None and is_version(scene) else source.version()


def sweep_key(sweep: str, scene_version: str) -> str:
    """A sweep's partition key: ``<sweep>.<hash8 of its scene>``. A changed scene is a new key, so
    the old nights keep their results under the old scene."""
    return f"{sweep}{SWEEP_KEY_SEPARATOR}{scene_version.rsplit('-', 1)[1]}"


def split_sweep_key(key: str) -> tuple[str, str]:
    """``cartpole-mujoco-randomized.1a2b3c4d`` -> (``cartpole-mujoco-randomized``, ``1a2b3c4d``)."""
    sweep, sep, digest = key.rpartition(SWEEP_KEY_SEPARATOR)
    if not sep or len(digest) != HASH_CHARS:
        raise SceneError(f"sweep partition {key!r} names no scene version: keys are <sweep>{SWEEP_KEY_SEPARATOR}<{HASH_CHARS} hex digits of its scene>")
    return sweep, digest
