"""The Slurm backend's health hooks against a real single-node Slurm cluster (started and
stopped here): `qualify` tells whether a pool's partition can take work (partition state,
drained nodes with the health check's reason, an unreachable controller), `node_problem`
tells whether a running job's node went bad, and the drill cluster can drain and resume
its node and find a job's processes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from testbed.ports import free_port
from testbed.slurm_cluster import NODE, PARTITIONS, SlurmCluster
from control_plane.compute.backends.base import JobHandle, JobState
from control_plane.compute.backends.engine import Launch
from control_plane.compute.backends.slurm import SlurmBackend
from control_plane.compute.backends.slurm_nodes import parse_nodes
from control_plane.catalog.pools import Pool, load_pools
from control_plane.settings import REPO_ROOT
from testbed.counting_step import counting_spec

# What NHC writes as the reason when it drains a node with a GPU gone.
NHC_REASON = "NHC: check_hw_gpu: GPU 0 fell off the bus (Xid 79)"


def _pools(folder: Path, env: dict[str, str]) -> dict[str, Pool]:
    """One pool per partition of the cluster, reached through `env` (its SLURM_CONF)."""
    pools = {
        f"slurm-{partition}": {
            "provider": "test-slurm",
            "region": "local",
            "backend": "slurm",
            "backend_settings": {"partition": partition, "env": env, "time_limit": "00:10:00"},
            "purchasing": "spot" if partition == "spot" else "on_demand",
            "accelerator": "local",
            "gpus_per_node": 2,
            "price_per_gpu_hour": 1.0,
        }
        for partition in (*PARTITIONS, "nosuch")
    }
    path = folder / "pools.yaml"
    path.write_text(yaml.safe_dump({"pools": pools}))
    return load_pools(path)


def _submit_sleep(backend: SlurmBackend, pool: Pool, folder: Path, seconds: int = 60) -> JobHandle:
    """A job that only sleeps, submitted the way the attempt loop submits a step."""
    folder.mkdir(parents=True, exist_ok=True)
    launch = Launch(
        name=f"test.sleep-{folder.name}",
        command=["sleep", str(seconds)],
        env={"SINEWGRID_POOL": pool.name},
        workdir=str(REPO_ROOT),
        output_path=str(folder / "output.log"),
    )
    return backend.submit(pool, counting_spec(), launch)


def _stop(backend: SlurmBackend, handle: JobHandle) -> None:
    backend.cancel(handle)
    _wait_for(lambda: backend.status(handle).state.ended, f"job {handle.job_id} to end after scancel")


def test_qualify_passes_on_healthy_partitions(slurm, tmp_path):
    pools = _pools(tmp_path, slurm.env)
    backend = SlurmBackend()
    assert backend.qualify(pools["slurm-gpu"]) is None
    assert backend.qualify(pools["slurm-spot"]) is None


def test_qualify_reports_a_drained_node_with_its_reason_until_resumed(slurm, tmp_path):
    pools = _pools(tmp_path, slurm.env)
    backend = SlurmBackend()
    slurm.drain_node(NHC_REASON)
    for name in ("slurm-gpu", "slurm-spot"):  # the one node serves both partitions
        problem = backend.qualify(pools[name])
        assert problem is not None
        partition = name.removeprefix("slurm-")
        assert f"pool {name}" in problem and f"partition `{partition}`" in problem, problem
        assert f"{NODE} IDLE+DRAIN" in problem and NHC_REASON in problem, problem
        assert f"scontrol update NodeName={NODE} State=RESUME" in problem, problem
    slurm.resume_node()
    assert slurm.node_state() == "IDLE"
    assert backend.qualify(pools["slurm-gpu"]) is None
    assert backend.qualify(pools["slurm-spot"]) is None


@pytest.mark.parametrize("state", ["INACTIVE", "DOWN"])
def test_qualify_reports_a_partition_that_is_not_up(slurm, tmp_path, state):
    pools = _pools(tmp_path, slurm.env)
    backend = SlurmBackend()
    slurm.set_partition_state("spot", state)
    problem = backend.qualify(pools["slurm-spot"])
    assert problem is not None and f"partition `spot` is {state}" in problem, problem
    assert "scontrol update PartitionName=spot State=UP" in problem, problem
    assert backend.qualify(pools["slurm-gpu"]) is None  # the other partition on the same node is fine
    slurm.set_partition_state("spot", "UP")
    assert backend.qualify(pools["slurm-spot"]) is None


def test_qualify_reports_an_unknown_partition_and_a_silent_controller(slurm, tmp_path):
    backend = SlurmBackend()
    problem = backend.qualify(_pools(tmp_path, slurm.env)["slurm-nosuch"])
    assert problem is not None and "partition `nosuch` does not exist" in problem, problem
    assert "backend_settings.partition" in problem, problem
    # The same cluster's configuration, pointing at a port no controller listens on.
    silent = tmp_path / "silent" / "slurm.conf"
    silent.parent.mkdir()
    lines = slurm.conf.read_text().splitlines()
    silent.write_text("\n".join(f"SlurmctldPort={free_port()}" if line.startswith("SlurmctldPort=") else line for line in lines) + "\n")
    (silent.parent / "gres.conf").write_text((slurm.conf.parent / "gres.conf").read_text())
    problem = backend.qualify(_pools(tmp_path, {"SLURM_CONF": str(silent)})["slurm-gpu"])
    assert problem is not None and "controller did not answer" in problem, problem
    assert str(silent) in problem and "scontrol ping" in problem, problem


def test_node_problem_reports_the_drain_of_a_running_jobs_node(slurm, tmp_path):
    pools = _pools(tmp_path, slurm.env)
    backend = SlurmBackend()
    handle = _submit_sleep(backend, pools["slurm-gpu"], tmp_path / "running")
    _wait_for(lambda: backend.status(handle).state is JobState.running, "the sleep job to run")
    assert backend.node_problem(handle) is None  # healthy node
    slurm.drain_node(NHC_REASON)
    problem = backend.node_problem(handle)
    assert problem is not None, slurm.node_state()
    assert f"Slurm job {handle.job_id}" in problem and f"{NODE} MIXED+DRAIN" in problem, problem
    assert NHC_REASON in problem and f"scontrol update NodeName={NODE} State=RESUME" in problem, problem
    # Draining lets the job run on: moving the step is the platform's call, not Slurm's.
    assert backend.status(handle).state is JobState.running
    _stop(backend, handle)
    assert backend.node_problem(handle) is None  # an ended job has no node to worry about


def test_node_problem_is_none_for_a_pending_job(slurm, tmp_path):
    pools = _pools(tmp_path, slurm.env)
    backend = SlurmBackend()
    slurm.set_partition_state("spot", "DOWN")  # the job queues and never starts
    handle = _submit_sleep(backend, pools["slurm-spot"], tmp_path / "pending")
    _wait_for(lambda: backend.status(handle).reason == "PartitionDown", "the job to wait on the down partition")
    slurm.drain_node(NHC_REASON)
    assert backend.node_problem(handle) is None
    assert slurm.job_pids(handle.job_id) == []  # nothing runs yet
    backend.cancel(handle)
    _wait_for(lambda: backend.status(handle).state.ended, "the pending job to end after scancel")


def test_job_pids_finds_the_workload_so_a_drill_can_signal_it(slurm, tmp_path):
    pools = _pools(tmp_path, slurm.env)
    backend = SlurmBackend()
    handle = _submit_sleep(backend, pools["slurm-gpu"], tmp_path / "signalled", seconds=300)
    # listpids sees the batch script first; it becomes the workload once the script exec's it.
    commands = _wait_for(lambda: _sleeping(slurm.job_pids(handle.job_id)), "the job's `sleep 300` process")
    pids = list(commands)
    assert all(Path(f"/proc/{pid}/comm").read_text().strip() != "slurmstepd" for pid in pids)
    workload = next(pid for pid, command in commands.items() if command == [b"sleep", b"300"])
    os.kill(workload, signal.SIGTERM)  # what a drill does to the workload directly
    ended = _wait_for(lambda: (s := backend.status(handle)).state.ended and s, "the signalled job to end")
    assert (ended.state, ended.exit_code) == (JobState.failed, -signal.SIGTERM), ended
    assert slurm.job_pids(handle.job_id) == []


def test_parse_nodes_keeps_reasons_with_spaces_and_stamps():
    text = (
        "NodeName=gpu01 Arch=x86_64 State=MIXED+DRAIN OS=Linux 6.1 #1 SMP Partitions=a,b "
        "Reason=NHC: check_fs_mount: /scratch not mounted, x=1 [root@2026-11-30T11:39:07]\n"
        "NodeName=gpu02 State=IDLE Partitions=a\n"
        "NodeName=gpu03 State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@2026-11-30T10:00:00]\n"
        "NodeName=gpu02 State=IDLE Partitions=a\n"
    )
    nodes = parse_nodes(text)
    assert [(n.name, n.state, n.reason, n.reason_by) for n in nodes] == [
        ("gpu01", "MIXED+DRAIN", "NHC: check_fs_mount: /scratch not mounted, x=1", "root@2026-11-30T11:39:07"),
        ("gpu02", "IDLE", "", ""),
        ("gpu03", "DOWN+NOT_RESPONDING", "Not responding", "slurm@2026-11-30T10:00:00"),
    ]
    assert [sorted(n.problems) for n in nodes] == [["DRAIN"], [], ["DOWN", "NOT_RESPONDING"]]


def _sleeping(pids: list[int]) -> dict[int, list[bytes]]:
    """The command lines of a job's processes, once one of them is the `sleep 300` workload."""
    commands = {}
    for pid in pids:
        try:
            commands[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2]
        except OSError:
            continue  # ended or replaced since listpids
    return commands if [b"sleep", b"300"] in commands.values() else {}


def _wait_for(probe, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := probe():
            return value
        time.sleep(0.3)
    pytest.fail(f"no {what} after {timeout:g}s")
