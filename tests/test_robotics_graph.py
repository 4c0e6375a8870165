"""The whole Robotics graph on a temporary root (MuJoCo backend): sessions in, a policy
evaluated in simulation and on the robot-cell stand-in, failures flagged for relabelling."""

from __future__ import annotations

import json

import dagster as dg

from robotics_lane.assets.policy import policy, sim_evaluation
from robotics_lane.assets.real_robot import real_robot_eval_request, real_robot_evaluation
from robotics_lane.assets.rollouts import sim_rollouts
from robotics_lane.assets.teleop import teleop_episodes
from robotics_lane.episodes.lerobot_v3 import read_dataset
from robotics_lane.robot_cell import RobotCellStandIn
from robotics_lane.teleop_operator import TeleopOperatorStandIn
from shared_resources.ledger import read_ledger

NIGHT = "2026-11-20"
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


def test_robotics_loop_end_to_end(instance, resources, home, storage):
    operator = TeleopOperatorStandIn(storage)
    sessions = operator.record_sessions(sessions=2, episodes=3, include_bad=True)
    instance.add_dynamic_partitions("teleop_sessions", sessions)
    outcomes = {
        s: dg.materialize([teleop_episodes], instance=instance, resources=resources, partition_key=s, raise_on_error=False).success
        for s in sessions
    }
    assert outcomes == {"teleop-session-001": True, "teleop-session-002": True, "teleop-session-glitch": False}
    report = json.loads((home / "quarantine" / "teleop" / "teleop-session-glitch" / "QUARANTINE.json").read_text())
    assert "non_finite" in {i["rule"] for i in report["issues"]}

    sweep = dg.materialize(
        [sim_rollouts], instance=instance, resources=resources,
        partition_key=dg.MultiPartitionKey({"night": NIGHT, "sweep": "cartpole-mujoco-randomized"}),
    )
    rollouts = _md(sweep, "robotics/sim_rollouts")
    assert rollouts["episodes"] == 8 and rollouts["shards"] == 2 and rollouts["pools"] == "robot-sim-spot"
    info, episodes = read_dataset(rollouts["dataset"])
    assert info.total_episodes == 8 and [e.metadata["seed"] for e in episodes] == sorted(e.metadata["seed"] for e in episodes)

    trained = dg.materialize([policy, sim_evaluation, real_robot_eval_request], instance=instance, resources=resources, run_config=FAST)
    assert trained.success
    assert _md(trained, "robotics/policy")["pool"] == "robot-train"
    sim = _md(trained, "robotics/sim_evaluation")
    assert sim["trials"] == 6 and 0 <= sim["ci95_low"] <= sim["success_rate"] <= sim["ci95_high"] <= 1
    assert sim["pool"] == "robot-eval"
    request = _md(trained, "robotics/real_robot_eval_request")

    answered = RobotCellStandIn(storage).answer_requests()
    assert answered == [request["eval_id"]]
    instance.add_dynamic_partitions("robot_evals", answered)
    real = dg.materialize([real_robot_evaluation], instance=instance, resources=resources, partition_key=answered[0])
    md = _md(real, "robotics/real_robot_evaluation")
    assert md["real_trials"] == 4 and md["sim_success_rate"] == sim["success_rate"]
    failed = md["failed_trials_flagged_for_relabelling"]
    relabel = home / "outbox" / "relabel" / answered[0] / "request.json"
    assert relabel.exists() == (failed > 0)
    if failed:
        assert operator.answer_relabel_requests() == [f"relabel-{answered[0]}"]

    steps = set(read_ledger(storage.ledger())["step"])
    assert steps == {"robotics.sim_rollouts", "robotics.policy", "robotics.sim_evaluation"}
