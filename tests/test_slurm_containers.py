"""Steps in containers on a Slurm pool: the pool's runtime names an OCI bundle, and the step runs
as `srun --container` in it (Slurm's own `oci.conf`, runc), on the suite's real Slurm cluster.

The bundle here is this machine's own system and Python, read-only (testbed/oci_bundle.py's
`host_bundle`): what is tested is the path through Slurm and runc, not an image. `make rehearsal`
runs the same path with the workload image unpacked as the bundle."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from control_plane.accounting.ledger import read_ledger
from control_plane.catalog.pools import load_pools
from control_plane.compute.backends.base import JobHandle
from control_plane.compute.backends.engine import Launch
from control_plane.compute.backends.slurm import SlurmBackend
from control_plane.compute.backends.slurm_batch import render_batch_script
from testbed.counting_step import counting_spec, held, materialize_counting, result_metadata
from testbed.oci_bundle import Bind, host_bundle
from testbed.slurm_cluster import SlurmCluster
from workload_runtime.allowed_env import LAUNCHER_OWN
from workload_runtime.storage import Storage

STEPS = {"steps": 20, "seed": 7}


def _catalog(folder: Path, cluster: SlurmCluster, runtime: dict | str) -> Path:
    path = folder / "pools.yaml"
    path.write_text(yaml.safe_dump({"pools": {"slurm-image": {
        "provider": "test-slurm", "region": "local", "backend": "slurm",
        "backend_settings": {"partition": "gpu", "env": cluster.env, "time_limit": "00:10:00"},
        "purchasing": "on_demand", "accelerator": "local", "gpus_per_node": 2, "price_per_gpu_hour": 2.0,
        "runtimes": {"default": runtime},
    }}}))  # fmt: skip
    return path


@pytest.fixture
def contained(slurm: SlurmCluster, home: Path, tmp_path: Path) -> Path:
    """A pool catalog whose one Slurm pool runs every step in a container of this machine's own
    files, with the storage root (checkpoints, Pipes files, the job's output) bound in."""
    bundle = host_bundle(tmp_path / "bundle", binds=[Bind(str(home), writable=True), Bind(str(tmp_path / "marks"), writable=True)])
    (tmp_path / "marks").mkdir()
    return _catalog(tmp_path, slurm, {"container": str(bundle), "python": sys.executable})


def test_a_step_runs_in_a_container_of_the_pools_bundle(slurm, home, instance, contained):
    result = materialize_counting(home, contained, counting_spec(config={**STEPS, "report_environ": True}), instance=instance)
    metadata = result_metadata(result)
    assert metadata["pool"] == "slurm-image" and metadata["attempts"] == 1
    assert metadata["pid"] == 1, metadata  # the first process of a PID namespace of its own: runc's container
    scripts = list((home / "state" / "pipes").rglob("step.sbatch"))  # each job's batch script, kept beside its output
    assert len(scripts) == 2  # the pool's qualification and the step: both in the container
    assert all("\nexec srun --container=" in script.read_text() for script in scripts)
    started_with = set(metadata["environ"].split(","))
    # The job's variables reach it (Pipes, the pool, Slurm's own and the GPU it was given) ...
    assert {"DAGSTER_PIPES_CONTEXT", "SINEWGRID_POOL", "SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES"} <= started_with, started_with
    # ... but what describes the launching host stays there: PATH and HOME are the bundle's.
    assert "VIRTUAL_ENV" not in started_with and {"PATH", "HOME"} <= started_with
    assert list(read_ledger(Storage.at(str(home)).ledger())["outcome"]) == ["succeeded"]


def test_sigterm_reaches_the_contained_workload_which_resumes(slurm, home, instance, contained, tmp_path):
    """What a cancelled run, a straggler's stop or Slurm's time-limit notice does: SIGTERM to the
    job's steps. Slurm reports the step as terminated; the workload's checkpoint says preempted,
    and the next attempt resumes from it with the same result."""
    marker = tmp_path / "marks" / "held"
    # Once it is held after its checkpoint, SIGTERM its job the way the platform does.
    with slurm.on_first_job(home, marker.exists, lambda job: SlurmBackend().signal(JobHandle.from_json(job), signal.SIGTERM)) as signalled:
        result = materialize_counting(home, contained, counting_spec(config=STEPS, failpoint=held(marker)), instance=instance)
    assert signalled, "the step finished before it was held and signalled"
    metadata = result_metadata(result)
    assert metadata["attempts"] == 2 and metadata["preemptions"] == 1 and metadata["resumed_from"] == 5, metadata
    bare = _catalog(tmp_path, slurm, "")  # the same pool without the container: the interpreter the suite runs
    uninterrupted = materialize_counting(home, bare, counting_spec("test.bare", config=STEPS), instance=instance, lineage="bare")
    assert metadata["digest"] == result_metadata(uninterrupted)["digest"]  # bare or contained, interrupted or not
    ledger = read_ledger(Storage.at(str(home)).ledger())
    attempts = ledger[ledger["step"] == "test.counting"]
    assert list(attempts["outcome"]) == ["preempted", "succeeded"], attempts
    # Slurm said "terminated" (128 + SIGTERM), not the workload's 75: its checkpoint message decided.
    assert attempts["exit_code"].iloc[0] == 128 + signal.SIGTERM and attempts["cause"].iloc[0] == "notice"


def test_the_batch_script_starts_the_step_with_srun_in_the_bundle(slurm, tmp_path):
    pools = load_pools(_catalog(tmp_path, slurm, {"container": "/shared/bundles/workload", "python": "/opt/venv/bin/python"}))
    pool, spec = pools["slurm-image"], counting_spec()
    backend = SlurmBackend()
    launch = Launch(
        name="test.counting-a1-0123abcd", command=backend.command(pool, spec), env={"DAGSTER_PIPES_CONTEXT": "x", "SINEWGRID_POOL": "slurm-image"},
        workdir="/opt/sinewgrid", output_path="/shared/pipes/run/attempt/output.log",
    )  # fmt: skip
    script = render_batch_script(pool, spec, launch, job_env=["PATH", "HOME", "LD_LIBRARY_PATH", "AWS_ENDPOINT_URL", "OMP_NUM_THREADS"])
    last = script.rstrip().splitlines()[-1]
    assert last.startswith("exec srun --container=/shared/bundles/workload --export=") and last.endswith(" --nodes=1 --ntasks=1 /opt/venv/bin/python -m testbed.counting_workload")
    exported = last.split("--export=", 1)[1].split()[0].split(",")
    assert exported == sorted(["AWS_ENDPOINT_URL", "CUDA_VISIBLE_DEVICES", "DAGSTER_PIPES_CONTEXT", "GPU_DEVICE_ORDINAL", "OMP_NUM_THREADS", "ROCR_VISIBLE_DEVICES", "SINEWGRID_POOL"])
    assert not LAUNCHER_OWN & set(exported)
    # The notice before the time limit goes to the steps (srun would kill its step on its own SIGTERM),
    # and the batch script starts in the attempt's folder, which the nodes mount.
    assert "#SBATCH --signal=TERM@300" in script and "#SBATCH --chdir=/shared/pipes/run/attempt" in script


@pytest.mark.parametrize(
    ("runtime", "problem"),
    [({"container": "bundles/workload"}, "container: String should match pattern '^/'"), ({"image": "workload:1"}, "container: Field required")],
    ids=["relative-bundle", "an-image-not-a-bundle"],
)
def test_a_bad_container_runtime_is_refused_by_name(slurm, tmp_path, runtime, problem):
    pool = load_pools(_catalog(tmp_path, slurm, runtime))["slurm-image"]
    with pytest.raises(dg.Failure) as refused:
        SlurmBackend().command(pool, counting_spec())
    message = refused.value.description
    assert "pool slurm-image: runtime `default` is not a Slurm container" in message and problem in message, message
    assert "deploy/slurm/README.md" in message
