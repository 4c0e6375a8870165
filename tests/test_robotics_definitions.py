"""The Robotics code location: assets, checks, jobs, sensors, the nightly schedule and its partitions."""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pytest

from robotics_lane.definitions import defs
from robotics_lane.defs.partitions import sweep_partition_keys
from robotics_lane.defs.sensors import nightly_sweep_schedule
from robotics_lane.stats import wilson_interval
from robotics_lane.sweeps import SWEEPS
from sensors.schedules import make_nightly_schedule


def test_robotics_location_has_the_whole_loop():
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert keys == {
        "robotics/teleop_episodes",
        "robotics/sim_rollouts",
        "robotics/policy",
        "robotics/sim_evaluation",
        "robotics/real_robot_eval_request",
        "robotics/real_robot_evaluation",
        "robotics/failure_labels",
    }
    checks = {(k.asset_key.to_user_string(), k.name) for k in defs.resolve_asset_graph().asset_check_keys}
    assert ("robotics/teleop_episodes", "episodes_valid") in checks
    assert ("robotics/real_robot_evaluation", "results_manifest_and_checksums") in checks
    assert {s.name for s in defs.sensors} == {"teleop_session_sensor", "robot_eval_sensor", "policy_round_sensor", "robotics_gpu_job_watcher"}
    assert {s.name for s in defs.schedules} == {"nightly_sweep_schedule"}
    for key in defs.resolve_asset_graph().get_all_asset_keys():
        assert len(defs.resolve_asset_graph().get(key).description or "") > 60, f"{key} needs a docstring"


def test_nightly_schedule_requests_one_partition_per_sweep_for_last_night(instance):
    when = dt.datetime(2026, 11, 25, 2, 0, tzinfo=dt.UTC)
    with dg.build_schedule_context(instance=instance, scheduled_execution_time=when, repository_def=defs.get_repository_def()) as context:
        data = nightly_sweep_schedule.evaluate_tick(context)
    keys = sorted(str(r.partition_key) for r in data.run_requests)
    assert keys == sorted(f"2026-11-24|{key}" for key in sweep_partition_keys())  # each sweep at its scene version
    assert len({r.run_key for r in data.run_requests}) == len(SWEEPS)
    partitions = defs.resolve_job_def("nightly_sweep").partitions_def
    for request in data.run_requests:
        assert partitions.has_partition_key(request.partition_key)


def test_the_night_falls_when_the_deployment_says(monkeypatch: pytest.MonkeyPatch):
    assert nightly_sweep_schedule.cron_schedule == "0 2 * * *"
    assert nightly_sweep_schedule.description.startswith("Every night at 02:00 UTC: ")
    monkeypatch.setenv("SINEWGRID_NIGHTLY_CRON", "30 22 * * *")  # where spot capacity is cheapest at another hour
    moved = make_nightly_schedule(name="n", job_name="nightly_sweep", night_dimension="night", config_dimension="sweep", configs=["a"], description="{when}: sweeps.")
    assert moved.cron_schedule == "30 22 * * *" and moved.description == "Every night at 22:30 UTC: sweeps."
    monkeypatch.setenv("SINEWGRID_NIGHTLY_CRON", "0 25 * *")
    with pytest.raises(ValueError, match=r"schedule n: '0 25 \* \*' is not a cron string \(SINEWGRID_NIGHTLY_CRON"):
        make_nightly_schedule(name="n", job_name="nightly_sweep", night_dimension="night", config_dimension="sweep", configs=["a"], description="{when}")


def test_sweep_seeds_are_fixed_per_night_and_new_each_night():
    sweep = SWEEPS["cartpole-mujoco-randomized"]
    assert sweep.seeds("2026-11-24") == sweep.seeds("2026-11-24")
    assert not set(sweep.seeds("2026-11-24")) & set(sweep.seeds("2026-11-25"))


def test_wilson_interval_matches_known_values():
    # Reference values: Wilson score interval, 95% (e.g. Newcombe 1998; R binom.confint "wilson").
    low, high = wilson_interval(8, 10)
    assert round(low, 4) == 0.4902 and round(high, 4) == 0.9433
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and round(high, 4) == 0.2775
    low, high = wilson_interval(10, 10)
    assert round(low, 4) == 0.7225 and round(high, 9) == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)
