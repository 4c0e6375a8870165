"""Failure drills at a small size: every scenario recovers, loses no more than its cadence
promises, books its lost time with its cause, and ends identical to an uninterrupted run.
Outcomes, not times, are asserted: every fault fires on an event (the workload held at the
fault's unit by its failpoint), so the outcome is the same on a fast or a slow machine.

Local pool: every scenario against Cell pretraining; a rollout sweep and policy training
against the faults that matter most for them; the preemption trace; the command line.
Each test stands alone: the module shares only the uninterrupted baselines, which any test
that needs one runs the first time. (The Slurm scenarios are in tests/test_drills_slurm.py.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from drills.model import DrillResult
from drills.runner import BACKENDS, SCENARIOS, fault_unit
from drills.workloads import WORKLOADS, workload
from workload_runtime.checkpoints import CheckpointStore
from workload_runtime.inputs import Failpoint
from shared_resources.resources import platform_resources
from workload_runtime.workload import PREEMPTED_EXIT_CODE
from control_plane.settings import REPO_ROOT

pytestmark = pytest.mark.e2e  # runs workloads end to end, in their own processes

PRETRAIN = workload("pretrain", "small")
HELD_AT = fault_unit(PRETRAIN)  # mid-interval after the trigger checkpoint: 350 of 900, cadence 100


@pytest.fixture(scope="module")
def drill_home(tmp_path_factory: pytest.TempPathFactory):
    """One storage root for the module, so the uninterrupted baselines are run once (by whichever
    test needs one first). Nothing else carries from one test to the next: every faulted run has
    its own name, markers and results, and a drill undoes its faults (drains, slots) itself."""
    root = tmp_path_factory.mktemp("drills") / "home"
    root.mkdir()
    saved = {k: os.environ.get(k) for k in ("SINEWGRID_SLOTS_DIR", "SINEWGRID_HOME")}
    os.environ["SINEWGRID_SLOTS_DIR"] = str(root / "slots")
    os.environ["SINEWGRID_HOME"] = str(root)
    yield root
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def drill(home: Path, scenario: str, target: str, **config) -> DrillResult:
    from drills.campaign import load_result
    from platform_location.defs.assets.drills import failure_drill

    result = dg.materialize(
        [failure_drill],
        partition_key=f"{scenario}@{target}",
        resources=platform_resources(root=str(home)),
        run_config={"ops": {"platform__failure_drill": {"config": {"size": "small", **config}}}},
    )
    assert result.success
    return load_result(home / "drills" / "results" / f"{scenario}--{target}.json")


def assert_recovered(r: DrillResult) -> None:
    assert r.recovered, r.action
    assert r.identical, f"end state {r.digest} differs from the uninterrupted run's {r.baseline_digest}"
    assert r.work_lost <= r.loss_bound, f"{r.work_lost} {r.unit} redone, the cadence promises at most {r.loss_bound}"
    assert all(v is not None for v in (r.timings.detect, r.timings.contain, r.timings.replace, r.timings.resume)), r.timings
    assert r.timings.detect <= r.timings.contain <= r.timings.replace <= r.timings.resume, r.timings
    assert 0 < r.goodput < 1 and 0 < r.optimum_goodput <= 1
    assert_lost_time_booked(r)


def assert_lost_time_booked(r: DrillResult) -> None:
    """The ledger books every attempt the fault cost under its cause (read back from the ledger
    for this drill's own run), and a preempted attempt with the seconds it lost."""
    for attempt in r.attempts:
        if attempt["outcome"] == "preempted":
            assert r.ledger_causes.get(attempt["cause"], 0) > 0, (attempt, r.ledger_causes)
        elif attempt["outcome"] == "refused":
            assert attempt["cause"] in r.ledger_causes, (attempt, r.ledger_causes)


def outcomes(r: DrillResult) -> list[tuple[str, str, str]]:
    return [(a["pool"], a["outcome"], a["cause"]) for a in r.attempts]


def test_preemption_with_notice_checkpoints_and_loses_nothing(drill_home):
    r = drill(drill_home, "preempt-notice", "local-pretrain")
    assert_recovered(r)
    assert outcomes(r) == [("drill-local-a", "preempted", "notice"), ("drill-local-a", "succeeded", "")]
    # SIGTERM reached the workload held at step 350: it checkpointed there and lost nothing.
    assert r.work_lost == 0 and r.attempts[1]["resumed_step"] == HELD_AT


def test_preemption_without_notice_redoes_at_most_one_interval(drill_home):
    r = drill(drill_home, "preempt-no-notice", "local-pretrain")
    assert_recovered(r)
    assert outcomes(r)[0] == ("drill-local-a", "preempted", "lost-node")
    # Killed at step 350, it resumed from the checkpoint at 300: half an interval redone.
    assert r.attempts[1]["resumed_step"] == PRETRAIN.trigger and r.work_lost == HELD_AT - PRETRAIN.trigger


def test_a_torn_checkpoint_is_skipped_and_kept(drill_home):
    r = drill(drill_home, "torn-checkpoint", "local-pretrain")
    assert_recovered(r)
    assert outcomes(r)[0][2] == "lost-node"
    # The writer died publishing step 300 (the failpoint's record says so); the next attempt
    # skipped the torn folder and resumed from the checkpoint before it.
    marker = drill_home / "drills" / "faults" / f"torn-{r.run_id}.json"
    assert json.loads(marker.read_text())["step"] == 300
    assert r.attempts[1]["resumed_step"] == 200


def test_a_lost_pool_refuses_and_the_step_fails_over(drill_home):
    r = drill(drill_home, "pool-loss", "local-pretrain")
    assert_recovered(r)
    assert outcomes(r) == [
        ("drill-local-a", "preempted", "lost-node"),
        ("drill-local-a", "refused", "refused"),
        ("drill-local-b", "succeeded", ""),
    ]
    assert r.attempts[2]["resumed_step"] == PRETRAIN.trigger


def test_a_straggler_is_flagged_drained_and_replaced(drill_home):
    r = drill(drill_home, "straggler", "local-pretrain")
    assert_recovered(r)
    assert outcomes(r) == [("drill-local-a", "preempted", "straggler"), ("drill-local-b", "succeeded", "")]
    assert "straggler" in r.attempts[0]["flags"] and r.work_lost == 0


def test_an_unhealthy_node_is_drained_and_the_step_moves(drill_home):
    r = drill(drill_home, "unhealthy-node", "local-pretrain")
    assert_recovered(r)
    assert outcomes(r) == [("drill-local-a", "preempted", "unhealthy-node"), ("drill-local-b", "succeeded", "")]
    assert "health check" in r.attempts[0]["flags"]
    # The workload waited at step 350 until the platform stopped it; it checkpointed there.
    assert r.attempts[1]["resumed_step"] == HELD_AT and r.work_lost == 0


def test_a_gang_that_loses_a_node_resumes_on_the_spare_to_the_same_end_state(drill_home):
    r = drill(drill_home, "node-loss", "local-pretrain-gang")
    assert_recovered(r)
    assert outcomes(r) == [("drill-gang-a", "preempted", "lost-node"), ("drill-gang-a", "succeeded", "")]
    assert r.attempts[0]["node"] == "drill-gang-a-node1"


def test_a_node_failing_qualification_is_replaced_before_the_gang_starts(drill_home):
    r = drill(drill_home, "node-unqualified", "local-pretrain-gang")
    assert_recovered(r)
    assert [(a["pool"], a["outcome"], a["node"]) for a in r.attempts] == [
        ("drill-gang-a", "disqualified", "drill-gang-a-node1"), ("drill-gang-a", "succeeded", ""),
    ]
    assert "drill: node drill-gang-a-node1 is unhealthy" in r.attempts[0]["flags"]


def test_a_rollout_sweep_killed_mid_episode_ends_with_the_same_episodes(drill_home):
    r = drill(drill_home, "preempt-no-notice", "local-rollouts")
    assert_recovered(r)
    # Killed once its third episode was committed: the relaunch starts from exactly three.
    assert r.unit == "episodes" and r.attempts[1]["resumed_step"] == workload("rollouts", "small").trigger


def test_policy_training_survives_a_torn_checkpoint(drill_home):
    r = drill(drill_home, "torn-checkpoint", "local-policy")
    assert_recovered(r)
    assert r.attempts[1]["resumed_step"] == 200


def test_the_ui_offers_only_drills_that_apply():
    from drills.campaign import matrix
    from platform_location.defs.assets.drills import DRILL_PARTITIONS

    keys = DRILL_PARTITIONS.get_partition_keys()
    assert keys == [f"{s}@{b}-{w}" for s, b, w in matrix(list(BACKENDS), list(SCENARIOS), list(WORKLOADS))]
    for key in keys:
        scenario, target = key.split("@")
        backend, workload = target.split("-", 1)
        assert workload in SCENARIOS[scenario].workloads and backend in SCENARIOS[scenario].backends, key
    assert "straggler@local-rollouts" not in keys and "node-loss@local-pretrain" not in keys  # a straggler sweep, a lost node of one process
    assert {"preempt-no-notice@local-pretrain", "node-loss@ray-pretrain-gang", "torn-checkpoint@local-policy"} <= set(keys)


def test_a_scenario_that_does_not_apply_is_refused_clearly(drill_home):
    from platform_location.defs.assets.drills import failure_drill

    with pytest.raises(dg.DagsterUnknownPartitionError, match="straggler@local-rollouts"):
        dg.materialize([failure_drill], partition_key="straggler@local-rollouts", resources=platform_resources(root=str(drill_home)))


def test_a_drill_too_small_for_its_fault_is_an_error_not_a_pass(drill_home, monkeypatch):
    from drills import runner
    from platform_location.defs.assets.drills import failure_drill

    tiny = dataclasses.replace(PRETRAIN, total=HELD_AT)  # the run would end where the fault lands
    monkeypatch.setattr(runner, "workload", lambda name, size="small": tiny)
    result = dg.materialize(
        [failure_drill],
        partition_key="preempt-no-notice@local-pretrain",
        resources=platform_resources(root=str(drill_home)),
        raise_on_error=False,
    )
    assert not result.success
    message = next(e for e in result.all_events if e.is_step_failure).step_failure_data.error.message
    assert "too small for its fault" in message and "Use a larger drill size" in message


def test_preemption_trace_compares_three_cadences_to_the_same_end_state(drill_home):
    from drills.goodput import young_daly_interval
    from platform_location.defs.assets.drills import preemption_trace

    dg.materialize([preemption_trace], resources=platform_resources(root=str(drill_home)), run_config={"ops": {"platform__preemption_trace": {"config": {"size": "small", "seed": 3, "steps": 800}}}})
    trace = json.loads((drill_home / "drills" / "results" / "trace-seed3.json").read_text())
    runs = {r["cadence"]: r for r in trace["runs"]}
    assert list(runs) == ["none", "fixed", "young-daly"]
    for run in runs.values():
        assert run["finished"] and run["identical"], run
        assert run["faults_at"], "every cadence met the trace's interruptions"
        assert 0 < run["goodput"] < 1 and 0 < run["predicted_goodput"] < 1
    assert runs["none"]["interval_seconds"] is None
    # The Young/Daly cadence is the one placement chose: √(2·δ·M) for the measured δ and the replayed rate.
    expected = young_daly_interval(trace["checkpoint_seconds"], 3600.0 / trace["rate_per_hour"])
    assert runs["young-daly"]["interval_seconds"] == pytest.approx(expected, rel=0.05)
    assert runs["young-daly"]["checkpoints"] > runs["none"]["checkpoints"]


def test_drill_command_writes_the_report(drill_home, tmp_path):
    from sinewgrid.cli import app

    docs = tmp_path / "docs" / "drills.md"
    result = CliRunner().invoke(
        app, ["drill", "-b", "local", "-s", "preempt-notice", "-w", "pretrain", "--trace", "none", "--out", str(tmp_path / "out"), "--docs", str(docs)],
        env={"SINEWGRID_HOME": str(drill_home), "DAGSTER_HOME": str(drill_home / "dagster")},
    )
    assert result.exit_code == 0, result.output
    assert "detect" in result.output and "identical yes" in result.output
    text = docs.read_text()
    assert "Preemption with notice" in text and "## Method" in text
    assert (tmp_path / "out" / "drills.json").exists() and (docs.parent / "drills" / "recovery.png").exists()
    data = json.loads((tmp_path / "out" / "drills.json").read_text())
    assert data["scenarios"][0]["scenario"] == "preempt-notice"
    # The drill's run is a run of the instance the UI shows.
    with dg.DagsterInstance.from_config(str(drill_home / "dagster")) as instance:
        assert instance.get_runs_count() >= 1


def test_a_trace_too_short_for_its_cadence_is_refused_with_the_fix(tmp_path):
    from drills.replay import run_trace
    from drills.runner import DrillSetup

    setup = DrillSetup(storage_root=str(tmp_path), drill_root=tmp_path / "drills", backend="local")
    with pytest.raises(ValueError, match=r"trace of 300 steps is too short.*at least 400.*Raise `steps`"):
        run_trace(None, setup, "10-15%", steps=300)
    assert not (tmp_path / "drills").exists()  # refused before anything ran


def test_unknown_matrix_entries_are_named():
    from drills.campaign import matrix

    with pytest.raises(ValueError, match="unknown scenario meteor"):
        matrix(["local"], ["meteor"], ["pretrain"])
    assert ("straggler", "local", "rollouts") not in matrix(["local"], ["straggler"], ["pretrain", "rollouts"])


def test_checkpoint_store_ignores_the_failpoint_unless_armed(tmp_path):
    import torch

    store = CheckpointStore(str(tmp_path / "ck"))
    store.save(5, {"model": {"w": torch.zeros(2)}})
    assert store.latest_valid().step == 5


def test_an_armed_failpoint_tears_the_checkpoint_once(tmp_path):
    """In a child process (it kills itself): the checkpoint at the armed step has its tensors and
    no manifest; the marker says when it fired; the next run saves normally."""
    import subprocess
    import sys

    script = (
        "import sys, torch\n"
        "from workload_runtime.checkpoints import CheckpointStore\n"
        "from workload_runtime.inputs import Failpoint\n"
        "fp = Failpoint(kind='torn-checkpoint', at_step=10, marker=sys.argv[2])\n"
        "store = CheckpointStore(sys.argv[1], failpoint=fp)\n"
        "for step in (5, 10, 15):\n"
        "    store.save(step, {'model': {'w': torch.full((2,), float(step))}})\n"
    )
    ck, marker = tmp_path / "ck", tmp_path / "fired.json"
    first = subprocess.run([sys.executable, "-c", script, str(ck), str(marker)], capture_output=True, timeout=120)
    assert first.returncode == -9 and marker.exists()
    assert CheckpointStore(str(ck)).latest_valid().step == 5 and (ck / "step-00000010" / "model.safetensors").exists()
    again = subprocess.run([sys.executable, "-c", script, str(ck), str(marker)], capture_output=True, timeout=120)
    assert again.returncode == 0 and CheckpointStore(str(ck)).latest_valid().step == 15


def test_a_malformed_failpoint_says_what_it_expects():
    with pytest.raises(ValidationError, match="at_step"):
        Failpoint(kind="torn-checkpoint", at_step="soon", marker="m")



HELD_SCRIPT = """
import sys, torch
from workload_runtime.workload import WorkloadRun
with WorkloadRun() as run:
    resumed = run.resume()
    for step in range(resumed.step if resumed else 0, 20):
        run.step_done(step + 1, lambda: {"model": {"w": torch.full((2,), float(step))}})
    run.finish(20, {"model": {"w": torch.zeros(2)}})
"""


def _held_run(tmp_path: Path, failpoint: Failpoint) -> subprocess.Popen:
    extras = tmp_path / "extras.json"
    extras.write_text(json.dumps({"checkpoint_uri": str(tmp_path / "ck"), "checkpoint_every_steps": 5, "failpoint": failpoint.model_dump()}))
    with open(tmp_path / "workload.log", "ab") as log:  # read in the assertion messages, never a pipe to fill
        return subprocess.Popen([sys.executable, "-c", HELD_SCRIPT, "--extras", str(extras)], cwd=REPO_ROOT, stdout=log, stderr=log)


def _wait_for_file(path: Path, process: subprocess.Popen) -> dict:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert process.poll() is None, f"the workload ended ({process.returncode}) before {path.name} appeared"
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)
    return json.loads(path.read_text())


def test_a_held_workload_waits_at_its_step_and_checkpoints_there_on_sigterm(tmp_path):
    """The hold failpoint makes the fault's moment an event: the workload says it has done step 7
    and waits; SIGTERM then checkpoints exactly step 7. Its next run does not hold again."""
    failpoint = Failpoint(kind="hold", at_step=7, marker=str(tmp_path / "held.json"))
    process = _held_run(tmp_path, failpoint)
    try:
        held = _wait_for_file(Path(failpoint.marker), process)
        assert (held["step"], held["pid"]) == (7, process.pid)
        assert CheckpointStore(str(tmp_path / "ck")).steps() == [5]  # waiting: nothing past step 7 happened
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == PREEMPTED_EXIT_CODE
    finally:
        process.kill()
    assert CheckpointStore(str(tmp_path / "ck")).latest_valid().step == 7
    again = _held_run(tmp_path, failpoint)
    assert again.wait(timeout=120) == 0, (tmp_path / "workload.log").read_text()[-2000:]
    assert CheckpointStore(str(tmp_path / "ck")).latest_valid().final


def test_a_released_hold_lets_the_workload_finish(tmp_path):
    failpoint = Failpoint(kind="hold", at_step=12, marker=str(tmp_path / "held.json"))
    process = _held_run(tmp_path, failpoint)
    try:
        assert _wait_for_file(Path(failpoint.marker), process)["step"] == 12
        Path(failpoint.release).touch()
        assert process.wait(timeout=120) == 0, (tmp_path / "workload.log").read_text()[-2000:]
    finally:
        process.kill()
    assert CheckpointStore(str(tmp_path / "ck")).latest_valid().step == 20
