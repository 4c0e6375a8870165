"""The Ray backend against a real Ray 2.60 head started for this module: a step runs as a Ray
job on the pool its custom resource names; a Ray job stopped from outside resumes from its
checkpoint with the same result; a pool whose resource the cluster lacks is refused after
its pending deadline; a crash fails once; a runtime given as a Ray runtime environment
reaches the job; an exit 75 reads as a preemption."""

from __future__ import annotations

import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from ray.job_submission import JobDetails, JobSubmissionClient, JobType
from ray.job_submission import JobStatus as RayJobStatus

from control_plane.compute.backends.base import AttemptOutcome, outcome_of
from control_plane.compute.backends.base import JobState
from control_plane.compute.backends.engine import Launch
from control_plane.compute.backends.ray import RayBackend, job_status
from control_plane.accounting.ledger import read_ledger
from control_plane.catalog.pools import load_pools
from workload_runtime.storage import Storage
from control_plane.settings import REPO_ROOT
from testbed.ray_head import RayHead
from testbed.counting_step import counting_spec, held, materialize_counting, result_metadata

STEPS, SEED = 30, 7


def _catalog(address: str, extra: str = "") -> str:
    return textwrap.dedent(
        f"""
        pools:
          ray-spot:
            provider: test-ray
            region: local
            backend: ray
            backend_settings: {{address: "{address}", resources: {{pool_spot: 1}}, gpu_resource: null}}
            purchasing: spot
            capacity: steady
            accelerator: cpu
            gpus_per_node: 1
            price_per_gpu_hour: 1.0
            cooldown_seconds: 600
            pending_deadline_seconds: 60
          ray-steady:
            provider: test-ray
            region: local
            backend: ray
            backend_settings: {{address: "{address}", resources: {{pool_steady: 1}}, gpu_resource: null}}
            purchasing: on_demand
            capacity: steady
            accelerator: cpu
            gpus_per_node: 1
            price_per_gpu_hour: 2.0
            pending_deadline_seconds: 60
        """
    ) + textwrap.indent(textwrap.dedent(extra), "  ")


@pytest.fixture
def pools_file(tmp_path: Path, ray: RayHead) -> Path:
    path = tmp_path / "pools.yaml"
    path.write_text(_catalog(ray.address))
    return path


@pytest.fixture(scope="module")
def uninterrupted_digest(ray_head: RayHead, tmp_path_factory) -> str:
    """The counting workload's digest from one uninterrupted run on the Ray spot pool."""
    root = tmp_path_factory.mktemp("uninterrupted")
    home = root / "home"
    home.mkdir()
    pools = root / "pools.yaml"
    pools.write_text(_catalog(ray_head.address))
    spec = counting_spec("test.ray-uninterrupted", config={"steps": STEPS, "seed": SEED})
    md = result_metadata(materialize_counting(home, pools, spec))
    assert md["pool"] == "ray-spot" and md["backend"] == "ray" and md["attempts"] == 1, md
    return md["digest"]


def _jobs_of(client: JobSubmissionClient, step: str, pool: str | None = None) -> list:
    return [
        j for j in client.list_jobs()
        if (j.metadata or {}).get("sinewgrid_step") == step and pool in (None, (j.metadata or {}).get("sinewgrid_pool"))
    ]


def test_counting_runs_end_to_end_as_a_ray_job(home, pools_file, ray, uninterrupted_digest):
    spec = counting_spec("test.ray-counting", config={"steps": STEPS, "seed": SEED})
    md = result_metadata(materialize_counting(home, pools_file, spec))
    assert md["digest"] == uninterrupted_digest
    assert (md["pool"], md["backend"], md["attempts"], md["resumed_from"]) == ("ray-spot", "ray", 1, 0)
    (job,) = _jobs_of(JobSubmissionClient(ray.address), spec.name)
    assert job.status == "SUCCEEDED"
    assert "testbed.counting_workload" in job.entrypoint


def test_a_stopped_ray_job_resumes_from_its_checkpoint_with_the_same_digest(home, pools_file, ray, uninterrupted_digest):
    # The run waits after step 5 until its job is stopped: it cannot finish first, however fast.
    spec = counting_spec("test.ray-stopped", config={"steps": STEPS, "seed": SEED}, failpoint=held(home / "held"))
    client = JobSubmissionClient(ray.address)
    stopped: list[str] = []
    done = threading.Event()

    def stop_once_checkpointed() -> None:
        # Like an operator's `ray job stop`: once the first attempt has a checkpoint, stop its job.
        while not done.is_set():
            running = [j for j in _jobs_of(client, spec.name) if j.status == "RUNNING"]
            if running and (home / "held").exists():
                client.stop_job(running[0].submission_id)
                stopped.append(running[0].submission_id)
                return
            time.sleep(0.2)

    stopper = threading.Thread(target=stop_once_checkpointed, daemon=True)
    stopper.start()
    try:
        md = result_metadata(materialize_counting(home, pools_file, spec))
    finally:
        done.set()
        stopper.join(timeout=10)
    assert stopped, "the test never found a running Ray job with a checkpoint to stop"
    assert md["digest"] == uninterrupted_digest
    assert md["preemptions"] == 1 and md["resumed_from"] > 0, md
    ledger = read_ledger(Storage.at(str(home)).ledger())
    assert list(ledger["outcome"]) == ["preempted", "succeeded"]
    # The stopped spot pool cools down, so the resumed attempt lands on the steady pool.
    assert list(ledger["pool"]) == ["ray-spot", "ray-steady"]


def test_a_pool_whose_resource_the_cluster_lacks_is_refused_and_the_next_pool_runs_it(home, tmp_path, ray):
    missing = f"""
        ray-missing:
          provider: test-ray
          region: local
          backend: ray
          backend_settings: {{address: "{ray.address}", resources: {{pool_missing: 1}}, gpu_resource: null}}
          purchasing: reserved
          capacity: steady
          accelerator: cpu
          gpus_per_node: 1
          price_per_gpu_hour: 0.5
          pending_deadline_seconds: 3
    """
    pools_file = tmp_path / "pools.yaml"
    pools_file.write_text(_catalog(ray.address, missing))
    spec = counting_spec("test.ray-refused", config={"steps": 5, "seed": SEED})
    md = result_metadata(materialize_counting(home, pools_file, spec))
    assert md["pools_tried"] == "ray-missing, ray-spot" and md["pool"] == "ray-spot"
    ledger = read_ledger(Storage.at(str(home)).ledger())
    assert list(ledger["outcome"]) == ["refused", "succeeded"]
    client = JobSubmissionClient(ray.address)
    # What ray-missing never placed was the pool's qualification probe: the step itself never went there.
    (probe,) = _jobs_of(client, f"{spec.name}.qualify", pool="ray-missing")
    assert not _jobs_of(client, spec.name, pool="ray-missing")
    # Ray 2.60 keeps a stopped never-placed job PENDING (its stop is queued); it never started.
    assert probe.status in ("PENDING", "STOPPED") and probe.driver_exit_code is None
    (ran,) = _jobs_of(client, spec.name, pool="ray-spot")
    assert ran.status == "SUCCEEDED"


def test_a_crash_in_the_workload_fails_once_and_is_not_retried(home, pools_file, ray):
    spec = counting_spec("test.ray-crash", config={"steps": STEPS, "seed": SEED, "fail_at_step": 3})
    with pytest.raises(Exception, match="exit code 1"):
        materialize_counting(home, pools_file, spec)
    ledger = read_ledger(Storage.at(str(home)).ledger())
    assert list(ledger["outcome"]) == ["failed"] and list(ledger["exit_code"]) == [1]
    (job,) = _jobs_of(JobSubmissionClient(ray.address), spec.name)
    assert job.status == "FAILED" and job.driver_exit_code == 1


def test_a_runtime_given_as_a_ray_runtime_env_reaches_the_job(home, tmp_path, ray):
    # A `sitecustomize` on the runtime's PYTHONPATH prints what the job's Python sees at start.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, sys\nprint('runtime-env-check', os.environ.get('SINEWGRID_TEST_MARKER'), sys.executable, flush=True)\n"
    )
    catalog = _catalog(ray.address).replace(
        "gpus_per_node: 1\n    price_per_gpu_hour: 1.0",
        "gpus_per_node: 1\n    price_per_gpu_hour: 1.0\n    runtimes:\n      marked:\n"
        "        py_executable: .venv/bin/python\n"
        f"        env_vars: {{SINEWGRID_TEST_MARKER: from-the-runtime, PYTHONPATH: '{site}'}}",
    )
    pools_file = tmp_path / "pools.yaml"
    pools_file.write_text(catalog)
    assert isinstance(load_pools(pools_file)["ray-spot"].runtimes["marked"], dict)
    spec = counting_spec("test.ray-runtime", runtime="marked", config={"steps": 5, "seed": SEED})
    md = result_metadata(materialize_counting(home, pools_file, spec))
    assert md["pool"] == "ray-spot"  # the only pool with the `marked` runtime
    (job,) = _jobs_of(JobSubmissionClient(ray.address), spec.name)
    python = str(REPO_ROOT / ".venv" / "bin" / "python")
    assert job.runtime_env["py_executable"] == python
    assert job.runtime_env["env_vars"]["SINEWGRID_TEST_MARKER"] == "from-the-runtime"
    assert "DAGSTER_PIPES_CONTEXT" in job.runtime_env["env_vars"]  # Pipes bootstrap rides along
    log = Path(md["workload_log"].removeprefix("file://")).read_text()
    assert f"runtime-env-check from-the-runtime {python}" in log


def test_an_entrypoint_exit_75_reads_as_a_preemption(tmp_path, ray):
    pool = load_pools(_write(tmp_path, _catalog(ray.address)))["ray-steady"]
    spec = counting_spec("test.ray-exit75")
    backend = RayBackend()
    launch = Launch(
        name=f"exit75-{tmp_path.name}",
        command=[sys.executable, "-c", "import sys; print('yielding'); sys.exit(75)"],
        env={},
        workdir=str(REPO_ROOT),
        output_path=str(tmp_path / "out.log"),
    )
    handle = backend.submit(pool, spec, launch)
    status = _until(lambda: (s := backend.status(handle)).state.ended and s, "the job to end")
    assert (status.state, status.exit_code) == (JobState.failed, 75)
    assert outcome_of(status) is AttemptOutcome.preempted
    assert b"yielding" in backend.collect(handle)


def test_a_job_stopped_by_the_backend_is_cancelled_not_preempted(tmp_path, ray):
    pool = load_pools(_write(tmp_path, _catalog(ray.address)))["ray-steady"]
    backend = RayBackend()
    launch = Launch(
        name=f"stopme-{tmp_path.name}",
        command=[sys.executable, "-c", "import time; print('workload-' + 'started', flush=True); time.sleep(60)"],
        env={},
        workdir=str(REPO_ROOT),
        output_path=str(tmp_path / "out.log"),
    )
    handle = backend.submit(pool, counting_spec("test.ray-stopme"), launch)
    # Stopped once the workload runs (not merely once Ray's supervisor does), so the stop
    # reaches the workload rather than the entrypoint shell.
    _until(lambda: b"workload-started" in backend.collect(handle), "the workload to start")
    backend.signal(handle, signal.SIGTERM)
    status = _until(lambda: (s := backend.status(handle)).state.ended and s, "the stopped job to end")
    assert status.state is JobState.cancelled
    # Another process (the watcher) that did not stop it sees a preemption.
    assert RayBackend().status(handle).state is JobState.preempted


def test_a_stop_that_races_the_entrypoint_is_still_a_cancellation():
    # Ray's supervisor records a stop that lands while the entrypoint exits as a start error
    # (psutil cannot find the process it was about to signal); seen in CI on a loaded machine.
    raced = JobDetails(
        type=JobType.SUBMISSION,
        status=RayJobStatus.FAILED,
        entrypoint="exec python -m workload",
        error_type="JOB_ENTRYPOINT_COMMAND_START_ERROR",
        message="Traceback (most recent call last):\n  ...\npsutil.NoSuchProcess: process no longer exists (pid=4242)",
    )
    assert job_status(raced, stopped_by_us=True).state is JobState.cancelled
    # Nobody asked this one to stop: a start error is the workload's failure.
    failed = job_status(raced, stopped_by_us=False)
    assert failed.state is JobState.failed and "JOB_ENTRYPOINT_COMMAND_START_ERROR" in failed.reason
    assert outcome_of(failed) is AttemptOutcome.failed


def _until(probe, what: str, timeout_s: float = 120.0):
    """Poll `probe` until it gives something true; fail the test naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (value := probe()):
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s:g}s")
        time.sleep(0.3)
    return value


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pools.yaml"
    path.write_text(text)
    return path


def test_an_attempt_cancelled_before_ray_placed_it_never_starts_its_workload(tmp_path, ray):
    # Ray queues `stop_job` for a job it has not placed; if capacity appears later the job
    # starts. The cancel marker the backend leaves makes that late start a no-op.
    pool = load_pools(_write(tmp_path, _catalog(ray.address)))["ray-steady"]
    backend = RayBackend()
    launch = Launch(
        name=f"late-{tmp_path.name}",
        command=[sys.executable, "-c", "print('workload-' + 'ran')"],
        env={},
        workdir=str(REPO_ROOT),
        output_path=str(tmp_path / "out.log"),
    )
    (tmp_path / "cancelled").touch()  # what `cancel` leaves beside the attempt's output
    handle = backend.submit(pool, counting_spec("test.ray-late"), launch)
    _until(lambda: backend.status(handle).state.ended, "the cancelled job to end")
    log = backend.collect(handle).decode()
    assert "cancelled before Ray placed it" in log and "workload-ran" not in log


def test_runtime_env_layers_pool_then_runtime_then_pipes_and_gpus_follow_gpu_resource(tmp_path):
    catalog = """
    pools:
      gpu-ray:
        provider: p
        region: r
        backend: ray
        backend_settings:
          address: http://head:8265
          resources: {pool_a: 1}
          runtime_env: {env_vars: {A: pool, B: pool}, pip: [tqdm]}
        purchasing: on_demand
        accelerator: h100-80gb
        gpus_per_node: 8
        price_per_gpu_hour: 2.0
        runtimes:
          sim: {py_executable: .venv-sim/bin/python, env_vars: {B: runtime, C: runtime}}
          plain: /opt/py/bin/python
    """
    pool = load_pools(_write(tmp_path, textwrap.dedent(catalog)))["gpu-ray"]
    backend = RayBackend()
    sim = counting_spec("test.sim", runtime="sim", gpus=2)
    env = backend.runtime_env(pool, sim, {"C": "launch", "DAGSTER_PIPES_CONTEXT": "x"})
    assert env["env_vars"] == {"A": "pool", "B": "runtime", "C": "launch", "DAGSTER_PIPES_CONTEXT": "x"}
    assert env["pip"] == ["tqdm"] and env["py_executable"] == str(REPO_ROOT / ".venv-sim/bin/python")
    assert backend.command(pool, sim)[0] == str(REPO_ROOT / ".venv-sim/bin/python")
    assert backend.command(pool, counting_spec("test.plain", runtime="plain"))[0] == "/opt/py/bin/python"
    assert "py_executable" not in backend.runtime_env(pool, counting_spec("test.plain", runtime="plain"), {})
