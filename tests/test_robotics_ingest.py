"""Teleop sessions through the sensor, and policy training that resumes exactly after a kill
and trains data-parallel as a gang to the one-process policy."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
import torch

from control_plane.catalog.step_spec import TRAINING_IMPORTS
from control_plane.compute.backends.gang import free_port
from control_plane.settings import REPO_ROOT, child_env
from robotics_lane.definitions import defs
from robotics_lane.defs.sensors import teleop_session_sensor
from robotics_lane.episodes.lerobot_v3 import Episode, write_dataset
from robotics_lane.sim.base import ACTION_NAMES, STATE_NAMES
from robotics_lane.standins.teleop_operator import TeleopOperatorStandIn
from shared_resources.resources import StorageResource
from tests.helpers import WorkloadProcess
from workload_runtime.checkpoints import CheckpointStore
from workload_runtime.inputs import Failpoint

pytestmark = pytest.mark.e2e  # runs workloads end to end, in their own processes

TRAIN_POLICY = "robotics_lane.workloads.train_policy"
POLICY_IMPORTS = [*TRAINING_IMPORTS, "pandas", "pyarrow"]  # as the policy asset declares


def _tick(instance, home, cursor=None):
    with dg.build_sensor_context(
        instance_ref=instance.get_ref(), cursor=cursor, definitions=defs, resources={"storage": StorageResource(root=str(home))}
    ) as context:
        result = teleop_session_sensor.evaluate_tick(context)
    for request in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return result


def test_teleop_sensor_picks_up_sealed_sessions_once(instance, home, storage):
    operator = TeleopOperatorStandIn(storage)
    sessions = operator.record_sessions(sessions=2, episodes=2, include_bad=False)
    half = home / "landing" / "teleop" / "still-recording" / "meta"
    half.mkdir(parents=True)
    (half / "info.json").write_text("{}")  # no manifest yet: the sensor waits
    first = _tick(instance, home)
    assert sorted(r.partition_key for r in first.run_requests) == sorted(sessions)
    again = _tick(instance, home)  # a fresh cursor sees them again, but they are known
    assert again.run_requests == []
    assert sorted(instance.get_dynamic_partitions("teleop_sessions")) == sorted(sessions)


def _dataset(path: Path) -> str:
    rng = np.random.default_rng(0)
    episodes = []
    for _ in range(4):
        states = rng.normal(size=(120, 4)).astype(np.float32)
        actions = np.clip(states[:, 1:2] * 2 + 0.1 * states[:, 3:4], -1, 1).astype(np.float32)
        episodes.append(Episode("balance the pole", states, actions, np.ones(120, np.float32), True))
    write_dataset(str(path), episodes, fps=25, robot_type="cartpole", state_names=STATE_NAMES, action_names=ACTION_NAMES)
    return str(path)


def _extras(tmp_path: Path, dataset: str, name: str, hold: Path | None = None) -> Path:
    """Training inputs; with `hold`, it waits after step 250 (creating `hold`) until it is
    signalled, so the kill lands mid-interval on any machine (the `hold` failpoint)."""
    path = tmp_path / f"{name}.json"
    inputs = {"config": {"datasets": [dataset], "steps": 600, "seed": 1}, "checkpoint_uri": str(tmp_path / name), "checkpoint_every_steps": 100}
    if hold is not None:
        inputs["failpoint"] = Failpoint(kind="hold", at_step=250, marker=str(hold)).model_dump()
    path.write_text(json.dumps(inputs))
    return path


def test_killed_policy_training_resumes_to_the_same_weights(tmp_path):
    dataset = _dataset(tmp_path / "demos")
    reference = WorkloadProcess(TRAIN_POLICY, _extras(tmp_path, dataset, "reference"), "run", imports=POLICY_IMPORTS)
    assert reference.wait() == 0, reference.tail()

    held = tmp_path / "held.json"
    extras = _extras(tmp_path, dataset, "killed", hold=held)
    victim = WorkloadProcess(TRAIN_POLICY, extras, "killed", imports=POLICY_IMPORTS)
    victim.wait_until_held(held)  # step 250 done, and it waits
    victim.process.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=60) == -signal.SIGKILL
    assert CheckpointStore(str(tmp_path / "killed")).steps() == [100, 200]
    resumed = WorkloadProcess(TRAIN_POLICY, extras, "resumed", imports=POLICY_IMPORTS)  # the marker exists: no hold this time
    assert resumed.wait() == 0, resumed.tail()

    expected = CheckpointStore(str(tmp_path / "reference")).latest_valid().tensors["policy"]
    actual = CheckpointStore(str(tmp_path / "killed")).latest_valid().tensors["policy"]
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name


def test_policy_training_as_a_gang_of_two_ranks_trains_the_one_process_policy(tmp_path):
    """Data-parallel behaviour cloning (`torchrun`, 2 ranks, gloo): the same global batches, each
    rank on its half, to the weights one process trains (within floating-point tolerance)."""
    dataset = _dataset(tmp_path / "demos")
    reference = WorkloadProcess(TRAIN_POLICY, _extras(tmp_path, dataset, "reference"), "run", imports=POLICY_IMPORTS)
    assert reference.wait() == 0, reference.tail()
    extras = _extras(tmp_path, dataset, "gang")
    log = tmp_path / "gang.log"
    with log.open("wb") as out:
        gang = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}", "-m", TRAIN_POLICY, "--extras", str(extras)],
            cwd=REPO_ROOT, env=child_env({"OMP_NUM_THREADS": "1"}), stdout=out, stderr=subprocess.STDOUT, timeout=300, check=False,
        )
    assert gang.returncode == 0, log.read_text()[-3000:]
    assert "× 2 rank(s)" in log.read_text()
    store = CheckpointStore(str(tmp_path / "gang"))
    assert Path(store.step_uri(100), "dcp").is_dir()  # an intermediate checkpoint: every rank's shards
    expected = CheckpointStore(str(tmp_path / "reference")).latest_valid().tensors["policy"]
    actual = store.latest_valid().tensors["policy"]
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_robot_cell_results_with_a_broken_trial_line_are_quarantined(instance, resources, home, storage):
    from control_plane.intake.landing import seal_drop
    from robotics_lane.defs.assets.real_robot import real_robot_evaluation

    folder = home / "landing" / "robot_eval" / "eval-broken"
    folder.mkdir(parents=True)
    (folder / "trials.jsonl").write_text('{"trial": 0, "task_id": "t", "seed": 1, "success": true}\nnot json\n')
    seal_drop(storage, "robot_eval", "eval-broken", robot="r", cell="c", policy_version="v")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    instance.add_dynamic_partitions("robot_evals", ["eval-broken"])
    result = dg.materialize([real_robot_evaluation], instance=instance, resources=resources, partition_key="eval-broken", raise_on_error=False)
    assert not result.success
    report = json.loads((home / "quarantine" / "robot_eval" / "eval-broken" / "QUARANTINE.json").read_text())
    assert {i["rule"] for i in report["issues"]} == {"trials_field", "trials_json"}
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # landing untouched
