"""The Robotics loop through the production shape, driven by the daemon: the nightly sweep
schedule fires on the rehearsal's clock and its sweeps run in containers of the image; the robot
site's teleop sessions land, announced on their queue, are ingested, and start a policy round;
the robot cell answers the round's evaluation request and its results are ingested.

The rehearsal's clock (rehearsal/stack.py, `NIGHT_FALLS`): the night falls every minute
(`SINEWGRID_NIGHTLY_CRON`), and the schedule stays off until the test turns it on, as an
operator would; the daemon's scheduler then fires it at the next minute, on the real clock. The
Isaac Lab sweep needs the Isaac Lab runtime, which the workload image its run starts from does
not carry (Isaac Lab's own image, deploy/docker/isaaclab.Dockerfile, is not built here): it
fails, clearly; the MuJoCo sweep runs.
"""

from __future__ import annotations

import time

import dagster as dg
import pytest

from control_plane.accounting.ledger import Ledger, read_ledger
from rehearsal.robot_site import robot_site
from rehearsal.stack import Stack
from robotics_lane.standins.robot_cell import RobotCellStandIn
from robotics_lane.standins.teleop_operator import TeleopOperatorStandIn
from robotics_lane.sweeps import SWEEPS
from tests.rehearsal.conftest import failure_of, sensor_cursor, wait_for_run

pytestmark = pytest.mark.rehearsal

SCHEDULE = "nightly_sweep_schedule"


def _new_runs(instance: dg.DagsterInstance, job: str, before: set[str]) -> list[dg.DagsterRun]:
    return [r for r in instance.get_runs(limit=500) if r.job_name == job and r.run_id not in before]


def _policy_trained_on(instance: dg.DagsterInstance, stack: Stack, ref: str, timeout_s: float = 900.0) -> dg.EventLogRecord:
    """The first `robotics/policy` materialization whose training datasets include `ref`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for record in instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey(["robotics", "policy"])), limit=50).records:
            if ref in str(record.asset_materialization.metadata["dataset_refs"].value).split(", "):
                return record
        assert not (dead := [n for n, s in stack.services.items() if not s.alive]), f"{dead} exited\n{stack.logs()}"
        time.sleep(5)
    pytest.fail(f"no policy trained on {ref} within {timeout_s:.0f} s\n{stack.logs()}")


def _failure_messages(instance: dg.DagsterInstance, run_id: str) -> str:
    """What a run's failed steps said: each error and each dg.Failure's description."""
    said = []
    for event in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE):
        data = event.dagster_event.step_failure_data
        said += [data.error.to_string() if data.error else "", data.user_failure_data.description if data.user_failure_data else ""]
    return "\n".join(filter(None, said))


def test_the_nightly_sweep_fires_on_the_rehearsals_clock(stack: Stack, instance: dg.DagsterInstance, timings: dict[str, float]):
    before = {r.run_id for r in instance.get_runs(limit=500)}
    turned_on = time.time()
    stack.set_schedule("robotics", SCHEDULE, running=True)
    try:
        deadline = time.monotonic() + 900  # the next minute's tick, the run queue, then both sweeps
        while len(done := [r for r in _new_runs(instance, "nightly_sweep", before) if r.is_finished]) < len(SWEEPS):
            assert time.monotonic() < deadline, f"{len(done)} of {len(SWEEPS)} sweeps finished\n{stack.logs()}"
            assert not (dead := [n for n, s in stack.services.items() if not s.alive]), f"{dead} exited\n{stack.logs()}"
            time.sleep(5)
    finally:
        stack.set_schedule("robotics", SCHEDULE, running=False)
    timings["schedule_on_to_sweeps_done_s"] = round(time.time() - turned_on, 1)
    sweeps = {r.tags["sinewgrid/sweep"].split(".")[0]: r for r in _new_runs(instance, "nightly_sweep", before)}
    assert sorted(sweeps) == sorted(SWEEPS)  # each configuration once, however many minutes ticked
    assert {r.tags.get("dagster/schedule_name") for r in sweeps.values()} == {SCHEDULE}  # the daemon's scheduler fired them
    night = {r.tags["sinewgrid/night"] for r in sweeps.values()}
    assert len(night) == 1

    mujoco = sweeps["cartpole-mujoco-randomized"]
    assert mujoco.status == dg.DagsterRunStatus.SUCCESS, _failure_messages(instance, mujoco.run_id) or stack.logs()
    if stack.image:
        assert mujoco.tags.get("dagster/image") == stack.run_image
    rollouts = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey(["robotics", "sim_rollouts"])), limit=5).records
    made = next(r.asset_materialization.metadata for r in rollouts if r.run_id == mujoco.run_id)
    assert made["episodes"].value > 0
    # Each shard of the sweep ran once, on the spot pool, and succeeded. (The ledger has no shard
    # field: a sweep's shards share run, step and attempt, so they are counted, not keyed.)
    booked = read_ledger(Ledger(stack.env["SINEWGRID_LEDGER_URL"]), run_id=mujoco.run_id)
    booked = booked[booked["step"] == "robotics.sim_rollouts"]
    assert len(booked) == made["shards"].value and set(booked["attempt"]) == {1} and set(booked["outcome"]) == {"succeeded"}, booked[["step", "attempt", "outcome"]]

    isaaclab = sweeps["cartpole-isaaclab"]
    if not stack.image:  # as processes, the checkout's own Isaac Lab runtime runs it (`make isaaclab-runtime`)
        assert isaaclab.status == dg.DagsterRunStatus.SUCCESS, _failure_messages(instance, isaaclab.run_id)
        return
    assert isaaclab.status == dg.DagsterRunStatus.FAILURE
    said = _failure_messages(instance, isaaclab.run_id)
    assert "`isaaclab` runtime" in said and "does not exist" in said, said


def test_teleop_sessions_become_a_policy_evaluated_on_the_robot(stack: Stack, instance: dg.DagsterInstance, timings: dict[str, float]):
    sensor_cursor(instance, "teleop_session_sensor")  # its first tick, which lists the zone once, is behind us
    uploaded_at = time.time()
    with robot_site(stack) as site:
        sessions = TeleopOperatorStandIn(site).record_sessions(sessions=1, episodes=3, include_bad=False)
    session = sessions[0]

    ingest = wait_for_run(instance, stack, lambda r: r.job_name == "teleop_ingest" and r.tags.get("dagster/partition") == session, f"the ingest of {session}")
    assert ingest.status == dg.DagsterRunStatus.SUCCESS, f"{failure_of(instance, ingest)}\n{stack.logs()}"
    assert ingest.tags.get("dagster/sensor_name") == "teleop_session_sensor"
    assert sensor_cursor(instance, "teleop_session_sensor")["listed_at"] < uploaded_at  # announced on its queue, not listed
    timings["robotics_upload_to_ingested_s"] = round(time.time() - uploaded_at, 1)

    # The policy round that trains on the session (the night's sweep may have started it, before
    # the session was ingested: the round reads every valid dataset when its policy step runs).
    trained = _policy_trained_on(instance, stack, f"robotics/teleop@{session}")
    round_ = wait_for_run(instance, stack, lambda r: r.run_id == trained.run_id, "the policy round that trains on the session")
    assert round_.job_name == "policy_round" and round_.tags.get("dagster/sensor_name") == "policy_round_sensor"
    assert round_.status == dg.DagsterRunStatus.SUCCESS, f"{failure_of(instance, round_)}\n{stack.logs()}"
    requests = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey(["robotics", "real_robot_eval_request"])), limit=20).records
    request = next(r for r in requests if r.run_id == round_.run_id)  # the round asked the robot cell for its trials
    eval_id = request.asset_materialization.metadata["eval_id"].value
    timings["robotics_upload_to_policy_s"] = round(time.time() - uploaded_at, 1)

    # The robot cell fetches the request and the policy, runs its trials, and drops the results.
    with robot_site(stack) as site:
        answered = RobotCellStandIn(site).answer_requests()
    assert eval_id in answered
    evaluation = wait_for_run(instance, stack, lambda r: r.job_name == "robot_eval_ingest" and r.tags.get("dagster/partition") == eval_id, f"the ingest of {eval_id}")
    assert evaluation.status == dg.DagsterRunStatus.SUCCESS, f"{failure_of(instance, evaluation)}\n{stack.logs()}"
    real = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey(["robotics", "real_robot_evaluation"]), asset_partitions=[eval_id]), limit=1).records
    assert real and real[0].asset_materialization.metadata["real_trials"].value > 0

    # Each GPU step of the round booked once.
    booked = read_ledger(Ledger(stack.env["SINEWGRID_LEDGER_URL"]), run_id=round_.run_id)
    booked = booked[booked["backend"] != "model-gateway"]
    assert {"robotics.policy", "robotics.sim_evaluation"} <= set(booked["step"])
    assert not booked.duplicated(["step", "attempt"]).any(), booked[["step", "attempt"]]
