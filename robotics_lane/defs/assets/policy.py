"""Policy training on demonstrations, and its evaluation in simulation."""

import hashlib
import io
import json
import posixpath

import dagster as dg
from pydantic import Field
import pandas as pd

from robotics_lane.defs.assets.rollouts import SIM_ROLLOUTS, rollouts_version, scene_for_run, sweep_imports
from robotics_lane.defs.assets.teleop import TELEOP_EPISODES
from robotics_lane.robot_cell_protocol import SIM_EVAL_FIRST_SEED
from robotics_lane.scenes.catalog import scene_for
from robotics_lane.scenes.files import SceneFiles
from robotics_lane.scenes.registration import scenes_upstream
from robotics_lane.stats import wilson_interval
from robotics_lane.workloads.config import PolicySettings, RolloutConfig, TrainPolicyConfig
from robotics_lane.workloads.rollout_output import trial_uri
from shared_resources.compute import ComputeResource
from control_plane.catalog.pools import Capacity
from data_layer.provenance import dataset_ref, find_version, record_result, track_evaluation, track_run, trained_on
from shared_resources.resources import StorageResource
from control_plane.catalog.step_spec import TRAINING_IMPORTS, StepSpec
from workload_runtime.storage import Storage, exists, glob_uris, read_json, write_bytes_atomic, write_json_atomic

POLICY = dg.AssetKey(["robotics", "policy"])
SIM_EVALUATION = dg.AssetKey(["robotics", "sim_evaluation"])


def training_datasets(store: Storage) -> dict[str, str]:
    """Every validated teleop session and every finished rollout sweep, oldest first: registry ref → URI."""
    teleop = {}
    for uri in glob_uris(store.curated("teleop", "*", "dataset.json")):
        record = read_json(uri)
        teleop[record.get("ref") or f"robotics/teleop@{posixpath.basename(posixpath.dirname(uri))}"] = record["dataset"]
    rollouts = {}
    for uri in glob_uris(store.uri("rollouts", "*", "*", "dataset", "meta", "info.json")):
        dataset = posixpath.dirname(posixpath.dirname(uri))
        sweep_dir = posixpath.dirname(dataset)
        night, sweep = posixpath.basename(posixpath.dirname(sweep_dir)), posixpath.basename(sweep_dir)
        rollouts[f"robotics/rollouts@{rollouts_version(night, sweep)}"] = dataset
    return {**teleop, **rollouts}


def corrective_episodes(uris: list[str]) -> int:
    """How many episodes of these datasets are corrective demonstrations: teleop sessions that
    answer a relabelling request (their manifest says `in_reply_to`)."""
    count = 0
    for uri in uris:
        manifest = posixpath.join(uri, "manifest.json")
        if exists(manifest) and read_json(manifest).get("in_reply_to"):
            count += int(read_json(posixpath.join(uri, "meta", "info.json"))["total_episodes"])
    return count


class PolicyLaunchpad(dg.Config, PolicySettings):
    """Behaviour-cloning settings (change them in the launchpad)."""

    checkpoint_every_steps: int = Field(250, ge=1, description="Save a checkpoint every this many steps (and on preemption).")
    nodes: int = Field(1, ge=1, description="Train data-parallel across this many nodes (a gang: all start together or none); 1: one node.")
    ranks_per_node: int = Field(1, ge=1, description="Data-parallel ranks per node, usually one per GPU. The policy is the same whatever the gang's size.")


class SimEvalSettings(dg.Config):
    """How the policy is evaluated in simulation."""

    trials: int = 20
    backend: str = "mujoco"


@dg.asset(key=POLICY, deps=[TELEOP_EPISODES, SIM_ROLLOUTS], group_name="robotics_policy", kinds={"pytorch", "safetensors"})
def policy(context: dg.AssetExecutionContext, config: PolicyLaunchpad, storage: StorageResource, compute: ComputeResource) -> dg.MaterializeResult:
    """The robot's policy: a network that maps the cart-pole state to a force, learnt by
    imitating every validated teleop demonstration (corrective demonstrations of failed
    real-robot trials among them: `corrective_episodes`) and every successful simulated rollout.

    Trains on the pool with fast interconnect, on one process or data-parallel as a gang of
    `nodes` × `ranks_per_node` (launchpad); checkpoints and resumes after preemption.
    `lineage` names every episode and rollout version it learnt from, and through the rollouts
    the scene versions (`scene_ref`); `loss_curve` plots this run beside the previous one.
    """
    store = storage.get()
    datasets = training_datasets(store)
    if not datasets:
        raise dg.Failure("No demonstrations yet: drop a teleop session (see docs/teleop-protocol.md) or run a nightly sweep.")
    settings = config.model_dump(include=set(PolicySettings.model_fields))
    version = hashlib.sha256(json.dumps({"datasets": list(datasets.values()), **settings}, sort_keys=True).encode()).hexdigest()[:12]
    spec = StepSpec(
        name="robotics.policy",
        entry_point="robotics_lane.workloads.train_policy",
        tenant="robotics",
        gpus=config.nodes * config.ranks_per_node,
        nodes=config.nodes,
        ranks_per_node=config.ranks_per_node if config.nodes * config.ranks_per_node > 1 else None,
        tightly_coupled=True,
        checkpoint_every_steps=config.checkpoint_every_steps,
        expected_hours=0.2,
        imports=[*TRAINING_IMPORTS, "pandas", "pyarrow"],  # and the LeRobot episodes' Parquet
        datasets=[dataset_ref(find_version(store, ref)) for ref in datasets],
        config=TrainPolicyConfig.of(config, datasets=list(datasets.values())),
    )
    run = f"robotics/policy/{version}"
    step = compute.run(context, spec, lineage=run)
    write_json_atomic(
        store.artifacts("robotics", "policy", "latest.json"),
        {"version": version, "run": run, "checkpoint_uri": step.checkpoint_uri, "datasets": list(datasets.values()), "dataset_refs": list(datasets)},
    )
    final = step.metadata()
    provenance = record_result(
        store, run, "model", "behaviour-cloned policy (safetensors checkpoint)",
        inputs=trained_on(step.final_checkpoint), uri=step.final_checkpoint, facts={"final_loss": final.get("final_loss"), "pool": step.pool.name},
    )
    tracked = track_run(store, run, step.final_checkpoint, step.result, config=settings, pool=step.pool.name, cost_usd=step.cost_usd, dagster_run_id=context.run_id)
    return dg.MaterializeResult(
        metadata={
            **final, **provenance, **tracked, "run": run, "policy_version": version, "datasets": len(datasets),
            "corrective_episodes": corrective_episodes(list(datasets.values())), "dataset_refs": ", ".join(datasets),
            "scene_ref": ", ".join(scenes_upstream(store, run)),
        },
        data_version=dg.DataVersion(version),
    )


def evaluation_spec(
    name: str, capacity: Capacity, backend: str, runtime: str, seeds: list[int], output_uri: str, policy_uri: str, task: dict, scene: SceneFiles | None = None
) -> StepSpec:
    return StepSpec(
        name=name,
        entry_point="robotics_lane.workloads.rollouts",
        tenant="robotics",
        runtime=runtime,
        gpus=1,
        capacity=capacity,
        checkpoint_seconds=0.5,
        expected_hours=0.05,
        imports=list(dict.fromkeys([*sweep_imports(backend), *TRAINING_IMPORTS])),  # the simulator, and torch for the policy
        config=RolloutConfig(backend=backend, seeds=seeds, output_uri=output_uri, task=task, policy={"kind": "checkpoint", "uri": policy_uri}, scene=scene),
    )


def trials_table(output_uri: str, seeds: list[int]) -> pd.DataFrame:
    return pd.DataFrame([read_json(trial_uri(output_uri, s)) for s in seeds])


def rate_metadata(trials: pd.DataFrame) -> dict:
    successes, n = int(trials["success"].sum()), len(trials)
    low, high = wilson_interval(successes, n)
    return {
        "trials": n,
        "successes": successes,
        "success_rate": dg.MetadataValue.float(round(successes / n, 4)),
        "ci95_low": dg.MetadataValue.float(round(low, 4)),
        "ci95_high": dg.MetadataValue.float(round(high, 4)),
        "failure_modes": dg.MetadataValue.md(
            trials["failure_mode"].fillna("success").value_counts().rename_axis("outcome").reset_index(name="trials").to_markdown(index=False)
        ),
    }


@dg.asset(key=SIM_EVALUATION, deps=[POLICY], group_name="robotics_policy", kinds={"mujoco", "parquet"})
def sim_evaluation(context: dg.AssetExecutionContext, config: SimEvalSettings, storage: StorageResource, compute: ComputeResource) -> dg.MaterializeResult:
    """How often the current policy balances the pole in simulation, over seeded trials it never
    trained on, with a 95% Wilson interval; every trial's seed, outcome, return, length and
    failure mode is kept. Runs on the evaluation pool, apart from training, in the backend's
    scene at its current registered version (`scene_ref`).
    """
    store = storage.get()
    current = read_json(store.artifacts("robotics", "policy", "latest.json"))
    seeds = [SIM_EVAL_FIRST_SEED + i for i in range(config.trials)]
    output = store.uri("evaluations", "sim", current["version"], config.backend)
    runtime = "isaaclab" if config.backend == "isaaclab" else "default"
    task = {"name": "cartpole", "max_steps": 200, "params": {}}
    scene = scene_for_run(context, compute, store, scene_for(config.backend).version(), config.backend)
    spec = evaluation_spec("robotics.sim_evaluation", Capacity.evaluation, config.backend, runtime, seeds, output, current["checkpoint_uri"], task, scene)
    step = compute.run(context, spec, lineage=f"robotics/sim_evaluation/{current['version']}-{config.backend}")
    trials = trials_table(output, seeds)
    buffer = io.BytesIO()
    trials.assign(task_params=trials["task_params"].map(json.dumps)).to_parquet(buffer, index=False)
    write_bytes_atomic(posixpath.join(output, "trials.parquet"), buffer.getvalue())
    summary = rate_metadata(trials)
    provenance = record_result(
        store, f"robotics/sim_evaluation/{current['version']}-{config.backend}", "evaluation", f"{len(trials)} held-out trials in {config.backend}",
        inputs=[current.get("run", f"robotics/policy/{current['version']}"), scene.ref], uri=posixpath.join(output, "trials.parquet"),
        facts={"scene_ref": scene.ref, "success_rate": summary["success_rate"].value, "ci95": f"{summary['ci95_low'].value:.2f}–{summary['ci95_high'].value:.2f}"},
    )
    track_evaluation(store, current.get("run", f"robotics/policy/{current['version']}"), f"sim-{config.backend}", {"sim_success_rate": summary["success_rate"], "sim_ci95_low": summary["ci95_low"], "sim_ci95_high": summary["ci95_high"]})
    write_json_atomic(
        store.artifacts("robotics", "sim_evaluation", "latest.json"),
        {"policy_version": current["version"], "scene_ref": scene.ref, "success_rate": summary["success_rate"].value, "ci95": [summary["ci95_low"].value, summary["ci95_high"].value], "trials": len(trials)},
    )
    return dg.MaterializeResult(
        metadata={**summary, **provenance, "policy_version": current["version"], "scene_ref": scene.ref, "trial_records": dg.MetadataValue.path(posixpath.join(output, "trials.parquet")), "pool": step.pool.name, "cost_usd": dg.MetadataValue.float(round(step.cost_usd, 5))}
    )
