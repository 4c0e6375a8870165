"""The Slurm backend against a real single-node Slurm cluster (started and stopped here):
a step runs as a batch job and gets its GPUs, a requeue resumes it from its checkpoint, a
pool whose partition turns the job down hands it to the next pool, a crash in the workload
fails the asset once. The batch script itself is checked without a cluster."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml

from control_plane.catalog.backends import SlurmSettings
from control_plane.compute.backends.base import AttemptOutcome, outcome_of
from control_plane.compute.backends.base import JobState
from control_plane.compute.backends.engine import Launch
from control_plane.compute.backends.slurm import SlurmBackend
from control_plane.compute.backends.slurm_batch import render_batch_script
from control_plane.accounting.ledger import read_ledger
from control_plane.catalog.pools import Pool, load_pools
from workload_runtime.storage import Storage
from control_plane.settings import REPO_ROOT
from workload_runtime.workload import EXTRAS_ENV, PREEMPTED_EXIT_CODE
from testbed.slurm_cluster import SlurmCluster
from testbed.counting_step import counting_spec, held, materialize_counting, result_metadata

STEPS = {"steps": 20, "seed": 7}


def _catalog(folder: Path, cluster: SlurmCluster, *partitions: str, **per_pool: dict) -> Path:
    """A pool catalog whose pools are the cluster's partitions; `spot` is cheaper, so ranked first."""
    pools = {}
    for partition in partitions:
        pools[f"slurm-{partition}"] = {
            "provider": "test-slurm",
            "region": "local",
            "backend": "slurm",
            "backend_settings": {"partition": partition, "env": cluster.env, "time_limit": "00:10:00"},
            "purchasing": "spot" if partition == "spot" else "on_demand",
            "accelerator": "local",  # the test cluster's GPUs are character devices
            "gpus_per_node": 2,
            "price_per_gpu_hour": 1.0 if partition == "spot" else 2.0,
            "cooldown_seconds": 600,
            **per_pool.get(partition, {}),
        }
    path = folder / "pools.yaml"
    path.write_text(yaml.safe_dump({"pools": pools}))
    return path


@pytest.fixture(scope="module")
def uninterrupted(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The counting step run start to finish on the `gpu` partition: its metadata and job log."""
    folder = tmp_path_factory.mktemp("slurm-uninterrupted")
    home = folder / "home"
    home.mkdir()
    result = materialize_counting(home, _catalog(folder, slurm_cluster, "gpu"), counting_spec(config=STEPS))
    metadata = result_metadata(result)
    return {"metadata": metadata, "log": Path(metadata["workload_log"]).read_text(), "ledger": read_ledger(Storage.at(str(home)).ledger())}


def test_step_runs_as_a_slurm_job_with_its_gpus(slurm, uninterrupted):
    metadata, log = uninterrupted["metadata"], uninterrupted["log"]
    assert metadata["pool"] == "slurm-gpu" and metadata["backend"] == "slurm"
    assert metadata["hostname_pool"] == "slurm-gpu"  # the workload ran with the pool's variables
    assert metadata["attempts"] == 1 and metadata["resumed_from"] == 0
    assert len(metadata["digest"]) == 16
    # The batch script's banner: Slurm gave the job one of the node's GPUs.
    banner = next(line for line in log.splitlines() if line.startswith("sinewgrid: "))
    assert "is Slurm job" in banner and "GPUs none" not in banner, banner
    assert banner.rsplit("GPUs ", 1)[1].strip() in ("0", "1"), banner
    assert list(uninterrupted["ledger"]["outcome"]) == ["succeeded"]


def test_requeue_resumes_from_checkpoint_with_the_same_result(slurm, home, instance, tmp_path, uninterrupted):
    catalog = _catalog(tmp_path, slurm, "gpu")
    storage = Storage.at(str(home))
    # The run waits after step 5 until it is requeued: it cannot finish first, however fast.
    with slurm.requeue_after_first_checkpoint(home) as requeued:
        result = materialize_counting(home, catalog, counting_spec(config=STEPS, failpoint=held(tmp_path / "held")), instance=instance)
    assert requeued, "the step finished before a checkpoint and a job to requeue were seen"
    metadata = result_metadata(result)
    assert metadata["digest"] == uninterrupted["metadata"]["digest"]
    assert metadata["attempts"] >= 2 and metadata["preemptions"] >= 1
    assert metadata["resumed_from"] > 0  # the last attempt started from a checkpoint, not from zero
    outcomes = list(read_ledger(storage.ledger())["outcome"])
    assert outcomes[0] == "preempted" and outcomes[-1] == "succeeded", outcomes
    # Slurm's requeued copy was cancelled rather than left to run a second time.
    state = slurm.client(["scontrol", "show", "job", "--oneliner", requeued[0]]).stdout
    assert "JobState=CANCELLED" in state and "Restarts=1" in state, state


@pytest.mark.parametrize(
    ("spot_state", "spot_pool"),
    [
        ("INACTIVE", {}),  # sbatch is turned down at once
        # Unqualified, so the job is submitted: it queues and never starts, past the deadline.
        # (Qualified, the DOWN partition would be refused before submission, like INACTIVE.)
        ("DOWN", {"pending_deadline_seconds": 3, "qualify": False}),
    ],
    ids=["sbatch-rejected", "pending-past-deadline"],
)
def test_a_refused_step_lands_on_the_next_pool(slurm, home, instance, tmp_path, spot_state, spot_pool):
    catalog = _catalog(tmp_path, slurm, "spot", "gpu", spot=spot_pool)
    slurm.set_partition_state("spot", spot_state)
    # Named for this case: the session's cluster also lists jobs other tests ran (MinJobAge).
    spec = counting_spec(f"test.refused-{spot_state.lower()}")
    result = materialize_counting(home, catalog, spec, instance=instance)
    metadata = result_metadata(result)
    assert metadata["pools_tried"] == "slurm-spot, slurm-gpu"
    assert metadata["pool"] == metadata["hostname_pool"] == "slurm-gpu"
    ledger = read_ledger(Storage.at(str(home)).ledger())
    assert list(zip(ledger["pool"], ledger["outcome"])) == [("slurm-spot", "refused"), ("slurm-gpu", "succeeded")]
    if spot_state == "DOWN":  # the engine loop cancelled the job it gave up on
        listed = slurm.client(["squeue", "-h", "-t", "all", "-p", "spot", "-o", "%j %T"]).stdout.split("\n")
        jobs = [line.split()[1] for line in listed if line.startswith(f"{spec.name}-")]
        assert jobs and set(jobs) == {"CANCELLED"}, listed


def test_a_crash_in_the_workload_fails_once_with_its_log(slurm, home, instance, tmp_path):
    catalog = _catalog(tmp_path, slurm, "gpu")
    with pytest.raises(dg.Failure) as failure:
        materialize_counting(home, catalog, counting_spec(config={"fail_at_step": 3}), instance=instance)
    message = str(failure.value.description)
    assert "failed on pool slurm-gpu" in message
    assert "told to fail at step 3" in message  # the job's own output, in the error
    assert list(read_ledger(Storage.at(str(home)).ledger())["outcome"]) == ["failed"]


def test_batch_script_carries_the_pool_and_spec(tmp_path):
    pool = Pool(
        name="hpc-a100",
        provider="campus",
        region="eu",
        backend="slurm",
        backend_settings={
            "partition": "a100",
            "account": "lab-42",
            "qos": "long",
            "time_limit": "2-00:00:00",
            "gpu_flag": "gpus",
            "cpus_per_gpu": 8,
            "time_limit_notice_seconds": 600,
        },
        purchasing="reserved",
        accelerator="a100-80gb",
        gpus_per_node=8,
        price_per_gpu_hour=1.0,
    )
    launch = Launch(
        name="test.counting-a1-0123abcd",
        command=["/opt/venv/bin/python", "-m", "testbed.counting_workload"],
        env={"DAGSTER_PIPES_CONTEXT": "eyJwYXRoIjog", "SINEWGRID_POOL": "hpc-a100", "ODD": "it's $HOME, a;b"},
        workdir="/srv/sinewgrid",
        output_path="/shared/pipes/run/attempt/output.log",
    )
    script = render_batch_script(pool, counting_spec(gpus=4), launch)
    directives = [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]
    assert directives == [
        "--job-name=test.counting-a1-0123abcd",
        "--partition=a100",
        "--account=lab-42",
        "--qos=long",
        "--time=2-00:00:00",
        "--nodes=1",
        "--gpus=4",
        "--cpus-per-gpu=8",
        "--output=/shared/pipes/run/attempt/output.log",
        "--open-mode=append",
        "--chdir=/srv/sinewgrid",
        "--requeue",
        "--signal=B:TERM@600",
    ]
    assert script.rstrip().splitlines()[-1] == "exec /opt/venv/bin/python -m testbed.counting_workload"
    gres = render_batch_script(pool.model_copy(update={"backend_settings": {"partition": "a100"}}), counting_spec(gpus=2), launch)
    assert "#SBATCH --gres=gpu:2" in gres and "--gpus=" not in gres and "--account" not in gres
    # The exported variables reach the workload unchanged, whatever they hold.
    script_path = tmp_path / "step.sbatch"
    script_path.write_text(script.replace("exec /opt/venv/bin/python -m testbed.counting_workload", 'printf "%s\\n" "$ODD" "$SINEWGRID_POOL"'))
    shown = subprocess.run(["bash", str(script_path)], capture_output=True, text=True, check=True).stdout.splitlines()
    assert shown == ["it's $HOME, a;b", "hpc-a100"]


def test_signal_and_cancel_reach_the_job(slurm, tmp_path):
    """What a cancelled Dagster run does: SIGTERM a running job (it checkpoints, exits 75),
    cancel a pending one (nothing ran: the pool counts as refusing)."""
    backend = SlurmBackend()
    pools = load_pools(_catalog(tmp_path, slurm, "spot", "gpu"))
    extras = {
        "config": STEPS,
        "checkpoint_uri": str(tmp_path / "ckpt"),
        "checkpoint_every_steps": 5,
        "failpoint": held(tmp_path / "held").model_dump(),
    }

    def launch(name: str) -> Launch:
        (tmp_path / name).mkdir()
        return Launch(
            name=name,
            command=backend.command(pools["slurm-gpu"], counting_spec()),
            env={EXTRAS_ENV: json.dumps(extras), "SINEWGRID_POOL": "slurm-gpu"},
            workdir=str(REPO_ROOT),
            output_path=str(tmp_path / name / "output.log"),
        )

    running = backend.submit(pools["slurm-gpu"], counting_spec(), launch("signalled"))
    _wait_for(lambda: (tmp_path / "held").exists(), "the job to checkpoint and wait after step 5")
    backend.signal(running, signal.SIGTERM)
    ended = _wait_for(lambda: (s := backend.status(running)).state.ended and s, "the signalled job to end")
    assert (ended.state, ended.exit_code) == (JobState.failed, PREEMPTED_EXIT_CODE), ended
    assert outcome_of(ended) is AttemptOutcome.preempted
    assert b"preempted: checkpoint at step" in backend.collect(running)
    # Once the controller forgets the job, the completion log tells the same ending.
    settings = SlurmSettings(**running.info["settings"])
    logged = backend.status_from_completion_log(settings, running)
    assert (logged.state, logged.exit_code) == (ended.state, ended.exit_code), logged

    slurm.set_partition_state("spot", "DOWN")
    waiting = backend.submit(pools["slurm-spot"], counting_spec(), launch("waiting"))
    assert _wait_for(lambda: (s := backend.status(waiting)).state is JobState.pending and s, "a pending job").reason == "PartitionDown"
    backend.signal(waiting, signal.SIGTERM)  # nothing to signal yet: returns at once
    backend.cancel(waiting)
    cancelled = _wait_for(lambda: (s := backend.status(waiting)).state.ended and s, "the cancelled job to end")
    assert (cancelled.state, cancelled.exit_code) == (JobState.cancelled, None)
    assert outcome_of(cancelled) is AttemptOutcome.refused


def _wait_for(probe, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := probe():
            return value
        time.sleep(0.3)
    pytest.fail(f"no {what} after {timeout:g}s")
