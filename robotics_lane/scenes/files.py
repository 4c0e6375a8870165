"""A registered scene version as a workload gets it, and the verified local copy it loads.

``SceneFiles`` travels in a rollout's config: the version's registry ref, its folder on the
object store and the sha256 of each file. ``local_scene`` reads those bytes from the store once
per node, checks every file against its sha256 and keeps the copy under the user cache
(``~/.cache/sinewgrid/scenes/<content hash>/``, or ``$SINEWGRID_SCENE_CACHE``), so a simulator
loads exactly the registered bytes and a relaunch reads nothing again. No Dagster here: runs in
the main runtime and in Isaac Lab's.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shutil
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from robotics_lane.scenes.catalog import SCENES_DATASET, SceneError, SceneSource, content_hash, split_version
from workload_runtime.node import cache_dir
from workload_runtime.storage import fs_for, read_bytes


class SceneFiles(BaseModel):
    """One registered scene version: where its files are and what each must hash to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ref: str = Field(description="Its registry ref, `robotics/scenes@<scene>-<hash8>`.")
    uri: str = Field(description="The registered folder on the object store.")
    entry: str = Field(description="The file the simulator opens (MJCF or USD).")
    files: dict[str, str] = Field(min_length=1, description="Each file (relative path) and its sha256.")

    @model_validator(mode="after")
    def _consistent(self) -> SceneFiles:
        dataset, _, version = self.ref.partition("@")
        if dataset != SCENES_DATASET:
            raise ValueError(f"scene ref {self.ref!r}: a scene is a version of {SCENES_DATASET}, e.g. {SCENES_DATASET}@cartpole-mujoco-1a2b3c4d")
        _, digest = split_version(version)
        if self.entry not in self.files:
            raise ValueError(f"scene {self.ref}: its entry {self.entry!r} is not one of its files {sorted(self.files)}")
        if not content_hash(self.files).startswith(digest):
            raise ValueError(f"scene {self.ref}: its files hash to {content_hash(self.files)[:12]}…, not to the version's {digest}")
        return self

    @property
    def version(self) -> str:
        return self.ref.partition("@")[2]


def list_scene(uri: str) -> dict[str, str]:
    """The files of a scene folder on the store and their sha256 (read from the store)."""
    fs, path = fs_for(uri)
    found = sorted(p for p in fs.find(path) if not posixpath.basename(p).startswith("."))
    if not found:
        raise SceneError(f"no scene files at {uri}")
    return {posixpath.relpath(p, path): hashlib.sha256(read_bytes(posixpath.join(uri, posixpath.relpath(p, path)))).hexdigest() for p in found}


def _holds(folder: Path, files: dict[str, str]) -> bool:
    return all((folder / name).is_file() and hashlib.sha256((folder / name).read_bytes()).hexdigest() == sha for name, sha in files.items())


def local_scene(scene: SceneFiles) -> Path:
    """The scene's entry file on this node: the registered bytes, fetched once and verified."""
    folder = cache_dir("scenes") / content_hash(scene.files)
    if _holds(folder, scene.files):
        return folder / scene.entry
    partial = folder.with_name(f".{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        for name, sha in sorted(scene.files.items()):
            data = read_bytes(posixpath.join(scene.uri, name))
            if hashlib.sha256(data).hexdigest() != sha:
                raise SceneError(
                    f"scene {scene.ref}: {posixpath.join(scene.uri, name)} hashes to {hashlib.sha256(data).hexdigest()}, "
                    f"but the version was registered with {sha}: the folder changed after registration. It was not loaded; "
                    f"get the registered bytes back with `sinewgrid data get {SCENES_DATASET} {scene.version} DEST`."
                )
            (partial / name).parent.mkdir(parents=True, exist_ok=True)
            (partial / name).write_bytes(data)
        if folder.exists() and not _holds(folder, scene.files):
            shutil.rmtree(folder, ignore_errors=True)  # a copy that no longer passes its check
        try:
            os.rename(partial, folder)
        except OSError:
            if not _holds(folder, scene.files):  # another process on this node finished first
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder / scene.entry


def catalog_scene(source: SceneSource) -> Path:
    """The entry file of the catalog's scene as it is now, unregistered: for hand runs, self-tests
    and stand-ins. A committed scene is read where it is; a generated one is made here (checked
    against its pins) into the same cache. Rollouts and evaluations load registered versions."""
    if not source.generated:
        return source.folder / source.entry
    from robotics_lane.scenes.build import scene_bytes

    folder = cache_dir("scenes") / content_hash(source.pinned)
    if not _holds(folder, source.pinned):
        for name, data in scene_bytes(source).items():
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
            partial.write_bytes(data)
            partial.replace(target)  # atomic: concurrent processes never read half a file
    return folder / source.entry
