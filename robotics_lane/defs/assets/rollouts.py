"""Nightly simulation sweeps on spot capacity, sharded, resumed after preemption."""

import io
import json
import posixpath
from concurrent.futures import ThreadPoolExecutor

import dagster as dg
import pandas as pd

from robotics_lane.episodes.shards import assemble_dataset
from robotics_lane.defs.partitions import nightly_sweeps, sweep_of
from robotics_lane.scenes.files import SceneFiles
from robotics_lane.scenes.registration import resolve_scene, scene_build_spec
from robotics_lane.sim.base import ACTION_NAMES, STATE_NAMES
from robotics_lane.sweeps import SWEEPS, TASK_LABEL, SweepConfig
from robotics_lane.workloads.rollout_output import trial_uri
from shared_resources.compute import ComputeResource
from control_plane.compute.step_run import StepRun
from control_plane.catalog.pools import Capacity
from data_layer.provenance import publish_version
from shared_resources.resources import StorageResource
from control_plane.catalog.step_spec import StepSpec
from workload_runtime.storage import Storage, read_json, write_bytes_atomic

SIM_ROLLOUTS = dg.AssetKey(["robotics", "sim_rollouts"])


def rollouts_version(night: str, sweep: str) -> str:
    """The registry version of one night's sweep: `robotics/rollouts@<night>_<sweep partition key>`."""
    return f"{night}_{sweep}"


def shard_seeds(seeds: list[int], shards: int) -> list[list[int]]:
    return [seeds[i::shards] for i in range(shards) if seeds[i::shards]]


def sweep_imports(backend: str) -> list[str]:
    """What a scripted sweep imports on its pool (qualification imports the same): the
    simulator, and pyarrow and pandas for the episode files; Isaac Lab's runtime runs on torch."""
    return ["numpy", "pyarrow", "pandas", "torch" if backend == "isaaclab" else backend]


def scene_for_run(context, compute: ComputeResource, store: Storage, version: str, backend: str) -> SceneFiles:
    """The registered scene version a sweep or evaluation loads (registered first if new; a
    generated scene is built by a step in its runtime, on the pool the run itself will use)."""

    def build(source, uri: str) -> None:
        compute.run(context, scene_build_spec(source, uri, sweep_imports(backend)), lineage=f"robotics/scenes/{version}")

    return resolve_scene(store, version, build_step=build)


def sweep_spec(sweep: SweepConfig, seeds: list[int], output_uri: str, scene: SceneFiles | None = None) -> StepSpec:
    return StepSpec(
        name="robotics.sim_rollouts",
        entry_point="robotics_lane.workloads.rollouts",
        tenant="robotics",
        runtime=sweep.runtime,
        gpus=1,
        capacity=Capacity.burst,
        priority_class="sweep",  # on a queued pool, yields to training and deadlines (docs/queues.md)
        checkpoints=True,  # every finished episode is committed: spot is safe
        checkpoint_seconds=0.5,
        expected_hours=0.05,
        max_preemptions=5,
        imports=sweep_imports(sweep.backend),
        config=sweep.rollout_config(seeds, output_uri, scene),
    )


def run_sweep(context, compute: ComputeResource, store: Storage, night: str, key: str, scene: SceneFiles) -> tuple[list[StepRun], list[dict], str]:
    """Run every shard of one sweep partition (concurrently) in `scene`, then assemble one LeRobot dataset."""
    sweep = SWEEPS[sweep_of(key)[0]]
    seeds = sweep.seeds(night)
    base = store.uri("rollouts", night, key)
    shards = shard_seeds(seeds, sweep.shards)

    def run_shard(index: int) -> StepRun:
        spec = sweep_spec(sweep, shards[index], posixpath.join(base, f"shard-{index}"), scene)
        return compute.run(context, spec, lineage=f"robotics/sim_rollouts/{night}/{key}/shard-{index}")

    with ThreadPoolExecutor(max_workers=len(shards)) as pool:
        runs = list(pool.map(run_shard, range(len(shards))))
    shard_of = {seed: i for i, shard in enumerate(shards) for seed in shard}
    trials = [read_json(trial_uri(posixpath.join(base, f"shard-{shard_of[s]}"), s)) for s in seeds]
    files = [t["episode_file"] for t in trials]
    dataset_uri = posixpath.join(base, "dataset")
    assemble_dataset(
        dataset_uri, files, tasks=[TASK_LABEL], fps=trials[0]["fps"], robot_type="cartpole", state_names=STATE_NAMES, action_names=ACTION_NAMES
    )
    buffer = io.BytesIO()
    pd.DataFrame(trials).assign(task_params=lambda f: f["task_params"].map(json.dumps)).to_parquet(buffer, index=False)
    write_bytes_atomic(posixpath.join(base, "trials.parquet"), buffer.getvalue())
    return runs, trials, dataset_uri


@dg.asset(key=SIM_ROLLOUTS, partitions_def=nightly_sweeps, group_name="robotics_sim", kinds={"isaaclab", "mujoco", "lerobot"})
def sim_rollouts(context: dg.AssetExecutionContext, storage: StorageResource, compute: ComputeResource) -> dg.MaterializeResult:
    """Tonight's simulated demonstrations for one sweep configuration: seeded rollouts of the
    expert controller (with operator noise) in Isaac Lab or MuJoCo, as a LeRobot v3 dataset.

    Runs on spot capacity, split into shards; each shard commits every finished episode, so a
    preempted shard resumes with exactly the episodes an uninterrupted run would have made.
    A sweep partition names its scene version (`<sweep>.<hash8>`): the shards load exactly that
    registered `robotics/scenes` version. The assembled set is registered as
    `robotics/rollouts@<night>_<sweep>.<hash8>`, with the scene among its inputs.
    """
    keys = context.partition_key.keys_by_dimension
    night, key = keys["night"], keys["sweep"]
    name, scene_version = sweep_of(key)
    scene = scene_for_run(context, compute, storage.get(), scene_version, SWEEPS[name].backend)
    runs, trials, dataset_uri = run_sweep(context, compute, storage.get(), night, key, scene)
    successes = sum(t["success"] for t in trials)
    modes = pd.Series([t["failure_mode"] or "success" for t in trials]).value_counts()
    _, version = publish_version(
        storage.get(), "robotics/rollouts", rollouts_version(night, key), dataset_uri, title=f"simulated demonstrations, sweep {name} (LeRobot v3)",
        inputs=[scene.ref], facts={"backend": SWEEPS[name].backend, "episodes": len(trials), "night": night, "scene_ref": scene.ref},
    )
    return dg.MaterializeResult(
        metadata={
            "status": "valid",
            "dataset": dg.MetadataValue.path(dataset_uri),
            "backend": SWEEPS[name].backend,
            "scene_ref": scene.ref,
            "episodes": len(trials),
            "successful_episodes": successes,
            "success_rate": dg.MetadataValue.float(round(successes / len(trials), 4)),
            "outcomes": dg.MetadataValue.md(modes.rename_axis("outcome").reset_index(name="episodes").to_markdown(index=False)),
            "shards": len(runs),
            "pools": ", ".join(sorted({r.pool.name for r in runs})),
            "preemptions": sum(r.preemptions for r in runs),
            "cost_usd": dg.MetadataValue.float(round(sum(r.cost_usd for r in runs), 5)),
            "goodput": dg.MetadataValue.float(round(sum(r.productive_seconds for r in runs) / max(sum(r.wall_seconds for r in runs), 1e-9), 4)),
            "placement": runs[0].metadata()["placement"],
            **version,
        }
    )
