"""Register scene versions, and resolve the version a run loads (the orchestrator's side).

A scene version is registered the first time a sweep or an evaluation needs it: its files are
written to ``<root>/scenes/<scene>-<hash8>/`` (by the orchestrator for a committed scene, by a
``robotics.scene_build`` step in the scene's runtime for a generated one), checked against the
version's hash, and registered as ``robotics/scenes@<scene>-<hash8>`` with a lineage record.
Registering the same content again is a no-op, so no run order has to be kept.

Resolving a version always hands back the registered files, checked against what was
registered; a version the registry lacks is registered only if it is what the catalog has now.
"""

from __future__ import annotations

from collections.abc import Callable

from control_plane.catalog.pools import Capacity
from control_plane.catalog.step_spec import StepSpec
from data_layer.lineage import LineageStore
from data_layer.provenance import find_version, publish_version
from data_layer.registry.names import VersionNotFound
from robotics_lane.scenes.build import can_build_here, write_scene
from robotics_lane.scenes.catalog import SCENES_DATASET, SceneError, SceneSource, content_hash, split_version
from robotics_lane.scenes.files import SceneFiles, list_scene
from workload_runtime.storage import Storage

SCENE_BUILD_STEP = "robotics.scene_build"
# Runs a generated scene's build on a pool of its runtime: (scene, folder on the store) -> None.
BuildStep = Callable[[SceneSource, str], object]


def scene_folder(store: Storage, version: str) -> str:
    """Where a scene version's files live on the store (the folder that was registered)."""
    return store.uri("scenes", version)


def registered_scene(store: Storage, version: str) -> SceneFiles | None:
    """The registered version, its files checked against the registration; None if not registered."""
    try:
        found = find_version(store, f"{SCENES_DATASET}@{version}")
    except VersionNotFound:
        return None
    files = list_scene(found.source_uri)
    if content_hash(files) != found.meta.get("content_sha256"):
        raise SceneError(
            f"{found.ref}: the files at {found.source_uri} hash to {content_hash(files)}, but it was registered as "
            f"{found.meta.get('content_sha256')}: they changed after registration, so it was not used. Put the registered "
            f"bytes back with `sinewgrid data get {SCENES_DATASET} {version} DEST` and copy DEST over that folder."
        )
    return SceneFiles(ref=found.ref, uri=found.source_uri, entry=str(found.meta["entry"]), files=files)


def register_scene(store: Storage, source: SceneSource, *, build_step: BuildStep | None = None) -> SceneFiles:
    """Register the catalog's scene as it is now (a no-op when that version is registered)."""
    version = source.version()
    if (known := registered_scene(store, version)) is not None:
        return known
    uri = scene_folder(store, version)
    if can_build_here(source):
        write_scene(source, uri)
    elif build_step is not None:
        build_step(source, uri)
    else:
        raise SceneError(f"scene {source.name!r} is generated in the {source.runtime!r} runtime, which this Python is not; "
                         "register it from an asset (it runs the build there) or from that runtime's Python")
    files = list_scene(uri)
    if content_hash(files) != content_hash(source.files()):
        raise SceneError(f"scene {version}: {uri} holds {sorted(files)} hashing to {content_hash(files)[:12]}…, not the "
                         f"version's {content_hash(source.files())[:12]}…; nothing was registered. Remove that folder and retry.")
    registered, _ = publish_version(
        store, SCENES_DATASET, version, uri, title=f"scene {source.name} ({source.format}): {source.description}", inputs=[],
        facts={"scene": source.name, "format": source.format, "backend": source.backend, "entry": source.entry,
               "content_sha256": content_hash(files), "origin": source.origin},
    )
    return SceneFiles(ref=registered.ref, uri=uri, entry=source.entry, files=files)


def resolve_scene(store: Storage, version: str, *, build_step: BuildStep | None = None) -> SceneFiles:
    """The registered files of scene ``version``; registered first if it is the catalog's scene now."""
    if (known := registered_scene(store, version)) is not None:
        return known
    source, _ = split_version(version)
    if source.version() != version:
        raise SceneError(
            f"scene version {version} is not registered, and the catalog's {source.name!r} is now {source.version()}: "
            f"nothing can make {version}'s files any more. A sweep that pins it (`SweepConfig.scene`) must pin a registered "
            f"version (`sinewgrid data list {SCENES_DATASET}`) or name {source.name!r} to run its current version; "
            f"a partition made before the scene changed: reload the code location, its sweeps then run {source.version()}."
        )
    return register_scene(store, source, build_step=build_step)


def scene_build_spec(source: SceneSource, output_uri: str, imports: list[str]) -> StepSpec:
    """The step that makes a generated scene in its runtime (seconds; spot is fine: it is idempotent).
    ``imports``: those of the step that will load the scene, so the pool is qualified once for both."""
    return StepSpec(
        name=SCENE_BUILD_STEP,
        entry_point="robotics_lane.workloads.build_scene",
        tenant="robotics",
        runtime=source.runtime,
        gpus=1,
        capacity=Capacity.burst,
        checkpoint_seconds=0.1,
        expected_hours=0.01,
        imports=imports,
        config={"scene": source.name, "version": source.version(), "output_uri": output_uri},
    )


def scenes_upstream(store: Storage, node_id: str) -> list[str]:
    """The scene versions in a result's lineage (a policy through its rollouts, an evaluation through its policy)."""
    return sorted(n.id for n in LineageStore(store.root).upstream(node_id, kind="dataset") if n.id.startswith(f"{SCENES_DATASET}@"))
