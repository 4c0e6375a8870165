"""The whole Robotics graph on an object-store root (MuJoCo backend): sessions in, a policy
evaluated in simulation and on the robot-cell stand-in, failures flagged for relabelling.

The loop runs on a fresh `s3://` root of the session's S3 API server, as in production. The same
loop on the embedded default (a local folder) is the session's demo run, checked in
tests/test_demo_loops.py.
"""

from __future__ import annotations

import posixpath

import dagster as dg
import pytest
from typer.testing import CliRunner

from robotics_lane.defs.assets.failure_labels import failure_labels
from robotics_lane.defs.assets.policy import policy, sim_evaluation
from robotics_lane.defs.assets.real_robot import real_robot_eval_request, real_robot_evaluation
from robotics_lane.defs.assets.rollouts import sim_rollouts
from robotics_lane.defs.assets.teleop import teleop_episodes
from robotics_lane.defs.partitions import sweep_partition_keys
from robotics_lane.scenes.catalog import SCENES
from robotics_lane.definitions import defs
from robotics_lane.defs.sensors import robot_eval_sensor, teleop_session_sensor
from robotics_lane.episodes.lerobot_v3 import read_dataset
from robotics_lane.standins.robot_cell import RobotCellStandIn
from robotics_lane.standins.teleop_operator import TeleopOperatorStandIn
from robotics_lane.sweeps import SWEEPS
from data_layer.registry.registry import DataRegistry
from data_layer.experiments import load_run
from control_plane.accounting.ledger import read_ledger
from data_layer.lineage import LineageStore
from control_plane.settings import code_version
from workload_runtime.storage import exists, read_json, write_bytes_atomic
from sinewgrid.cli import app
from tests.helpers import sensor_ingest

pytestmark = pytest.mark.e2e  # runs workloads end to end, in their own processes

NIGHT = "2026-11-20"
MUJOCO_SWEEP = next(k for k in sweep_partition_keys() if k.startswith("cartpole-mujoco-randomized."))  # at its scene version
FAST = {
    "ops": {
        "robotics__policy": {"config": {"steps": 600}},
        "robotics__sim_evaluation": {"config": {"trials": 6}},
        "robotics__real_robot_eval_request": {"config": {"trials_per_task": 2}},
    }
}


def _md(result, key: str) -> dict:
    event = next(e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == key)
    return {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}


def _sensor_ingest(sensor, asset, instance, resources, root: str, cursor: str | None) -> tuple[list[str], dict[str, bool], str | None]:
    return sensor_ingest(sensor, [asset], defs, instance, resources, root, cursor)


@pytest.mark.parametrize("root", ["s3"], indirect=True)
def test_robotics_loop_end_to_end(instance, resources, root, storage, tmp_path):
    operator = TeleopOperatorStandIn(storage)
    sessions = operator.record_sessions(sessions=2, episodes=3, include_bad=True)
    # A session still uploading (no manifest yet) is not complete: the sensor leaves it be.
    write_bytes_atomic(posixpath.join(storage.landing("teleop", "teleop-session-uploading"), "meta", "info.json"), b"{}")
    requested, outcomes, teleop_cursor = _sensor_ingest(teleop_session_sensor, teleop_episodes, instance, resources, root, None)
    assert sorted(requested) == sorted(sessions)
    assert outcomes == {"teleop-session-001": True, "teleop-session-002": True, "teleop-session-glitch": False}
    assert sorted(instance.get_dynamic_partitions("teleop_sessions")) == sorted(sessions)
    report = read_json(posixpath.join(storage.quarantine("teleop", "teleop-session-glitch"), "QUARANTINE.json"))
    assert "non_finite" in {i["rule"] for i in report["issues"]}

    sweep = dg.materialize(
        [sim_rollouts], instance=instance, resources=resources,
        partition_key=dg.MultiPartitionKey({"night": NIGHT, "sweep": MUJOCO_SWEEP}),
    )
    rollouts = _md(sweep, "robotics/sim_rollouts")
    episodes_per_night = SWEEPS["cartpole-mujoco-randomized"].episodes
    assert rollouts["episodes"] == episodes_per_night and rollouts["shards"] == 2 and rollouts["pools"] == "robot-sim-spot"
    assert rollouts["dataset"].startswith(root)
    info, episodes = read_dataset(rollouts["dataset"])
    assert info.total_episodes == episodes_per_night and [e.metadata["seed"] for e in episodes] == sorted(e.metadata["seed"] for e in episodes)

    trained = dg.materialize([policy, sim_evaluation, real_robot_eval_request], instance=instance, resources=resources, run_config=FAST)
    assert trained.success
    assert _md(trained, "robotics/policy")["pool"] == "robot-train"
    sim = _md(trained, "robotics/sim_evaluation")
    assert sim["trials"] == 6 and 0 <= sim["ci95_low"] <= sim["success_rate"] <= sim["ci95_high"] <= 1
    assert sim["pool"] == "robot-eval"
    request = _md(trained, "robotics/real_robot_eval_request")

    answered = RobotCellStandIn(storage).answer_requests()
    assert answered == [request["eval_id"]]
    requested, outcomes, _ = _sensor_ingest(robot_eval_sensor, real_robot_evaluation, instance, resources, root, None)
    assert requested == answered and outcomes == {answered[0]: True}
    real = instance.get_latest_materialization_event(real_robot_evaluation.key)
    md = {k: getattr(v, "value", v) for k, v in real.asset_materialization.metadata.items()}
    assert md["real_trials"] == 4 and md["sim_success_rate"] == sim["success_rate"]
    assert _md(trained, "robotics/policy")["corrective_episodes"] == 0  # the first version learnt from no real-robot data
    assert md["success_by_version"].startswith("![sim and real success by policy version](data:image/png;base64,")
    assert "Only one policy version has been evaluated on the real robot" in md["real_success_verdict"]
    failed = md["failed_trials_flagged_for_relabelling"]
    assert exists(storage.outbox("relabel", answered[0], "request.json")) == (failed > 0)
    if failed:
        labelled = dg.materialize([failure_labels], instance=instance, resources=resources, partition_key=answered[0])
        labels = _md(labelled, "robotics/failure_labels")
        assert labels["completed_tasks"] == failed and labels["answered_in_batch"] == failed  # one batch, behind its deadline
        token_rows = read_ledger(storage.ledger()).query("backend == 'model-gateway' and step == 'label-failure@v1'")
        assert len(token_rows) == failed and set(token_rows["purchasing"]) == {"batch"} and token_rows["token_cost_usd"].sum() > 0
        relabel = operator.answer_relabel_requests()
        assert relabel == [f"relabel-{answered[0]}"]
        requested, outcomes, _ = _sensor_ingest(teleop_session_sensor, teleop_episodes, instance, resources, root, teleop_cursor)
        assert requested == relabel and outcomes == {relabel[0]: True}

    ledger = read_ledger(storage.ledger())
    steps = set(ledger[ledger["backend"] != "model-gateway"]["step"])
    assert steps == {"robotics.sim_rollouts", "robotics.policy", "robotics.sim_evaluation"}

    # Episode and rollout sets are registered versions, and come back as the same LeRobot datasets.
    registry = DataRegistry.for_root(root)
    teleop = {v.version for v in registry.versions("robotics/teleop")}
    assert {"teleop-session-001", "teleop-session-002"} <= teleop and "teleop-session-glitch" not in teleop
    assert rollouts["dataset_ref"] == f"robotics/rollouts@{NIGHT}_{MUJOCO_SWEEP}"
    registry.get("robotics/rollouts", f"{NIGHT}_{MUJOCO_SWEEP}", str(tmp_path / "rollouts"))
    back, back_episodes = read_dataset(str(tmp_path / "rollouts"))
    assert back.total_episodes == episodes_per_night and [e.metadata["seed"] for e in back_episodes] == [e.metadata["seed"] for e in episodes]

    # From the real-robot evaluation back to the policy, the episode and rollout versions it was
    # trained on, the code, and the raw sessions and the robot cell's results drop.
    policy_md = _md(trained, "robotics/policy")
    lineage = LineageStore(root)
    upstream = {n.id: n for n in lineage.upstream(md["lineage_id"])}
    assert policy_md["run"] in upstream and upstream[policy_md["run"]].code_version == code_version()
    assert {"robotics/teleop@teleop-session-001", "robotics/teleop@teleop-session-002", rollouts["dataset_ref"]} <= set(upstream)
    drops = {n.id for n in lineage.upstream(md["lineage_id"], kind="drop")}
    assert drops == {"drop/teleop/teleop-session-001", "drop/teleop/teleop-session-002", f"drop/robot_eval/{answered[0]}"}
    # ... and to the scene version its rollouts ran in; the sim evaluation names its own scene.
    scene_ref = f"robotics/scenes@{SCENES['cartpole-mujoco'].version()}"
    assert rollouts["scene_ref"] == policy_md["scene_ref"] == sim["scene_ref"] == md["scene_ref"] == scene_ref
    assert scene_ref in upstream and lineage.get(rollouts["dataset_ref"]).inputs == [scene_ref]
    assert lineage.resolve(sim["lineage_id"]).inputs == [policy_md["run"], scene_ref]
    printed = CliRunner().invoke(app, ["lineage", md["lineage_id"], "--root", root])
    assert printed.exit_code == 0 and scene_ref in printed.output, printed.output
    registry.get("robotics/scenes", scene_ref.split("@")[1], str(tmp_path / "scene"))
    assert (tmp_path / "scene" / "cartpole.xml").read_bytes() == (SCENES["cartpole-mujoco"].folder / "cartpole.xml").read_bytes()
    run = load_run(root, policy_md["run"])
    assert set(run.datasets) == {"robotics/teleop@teleop-session-001", "robotics/teleop@teleop-session-002", rollouts["dataset_ref"]}
    assert run.evaluations["sim-mujoco"]["sim_success_rate"] == sim["success_rate"]
    assert run.evaluations["real"]["real_success_rate"] == md["real_success_rate"]
