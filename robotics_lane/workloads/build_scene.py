"""Make a generated scene's files in the runtime that can (Isaac Lab's, for the USD made from
``newton``) and put them on the object store, checked against the catalog's pins.

The orchestrator registers what this writes as ``robotics/scenes@<scene>-<hash8>``; this workload
only builds. It is idempotent: the same scene always writes the same bytes to the same folder.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from robotics_lane.scenes.build import write_scene
from robotics_lane.scenes.catalog import content_hash, scene_source
from workload_runtime.workload import WorkloadRun


class SceneBuildConfig(BaseModel):
    """Which catalog scene to make, and the folder on the store to write it to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scene: str = Field(description="A scene of robotics_lane/scenes/catalog.py, e.g. `cartpole-isaaclab`.")
    version: str = Field(description="The version the orchestrator expects (`<scene>-<hash8>`): anything else is refused.")
    output_uri: str = Field(description="The folder on the store the scene's files go to.")


def main() -> None:
    with WorkloadRun(framework="numpy") as run:
        cfg = run.config_as(SceneBuildConfig)
        source = scene_source(cfg.scene)
        if source.version() != cfg.version:
            raise SystemExit(f"asked for scene version {cfg.version}, but this code's catalog has {source.version()}: deploy the same code to the pool")
        run.start_work(0)
        files = write_scene(source, cfg.output_uri)
        run.info(f"scene {cfg.version}: {len(files)} files written to {cfg.output_uri}")
        run.finish(1, {}, metadata={"scene_version": cfg.version, "files": len(files), "content_sha256": content_hash(files)})


if __name__ == "__main__":
    main()
