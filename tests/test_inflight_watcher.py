"""The in-flight watcher: a workload left running by an orchestrator that died is found,
stopped and booked; one whose run is still going is left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dagster as dg
import psutil
import pytest

from control_plane.accounting.ledger import read_ledger
from control_plane.catalog.pools import load_pools
from control_plane.compute.backends.base import JobHandle
from control_plane.compute.backends.local import LocalBackend
from control_plane.compute.inflight import InFlight
from control_plane.settings import REPO_ROOT
from sensors.inflight_watcher import make_inflight_watcher
from tests.helpers import wait_for
from shared_resources.resources import platform_resources
from workload_runtime.storage import Storage

pytestmark = pytest.mark.e2e  # runs workloads end to end, in their own processes

CATALOG = """
pools:
  here:
    provider: local
    region: local
    backend: local
    purchasing: on_demand
    accelerator: local
    gpus_per_node: 1
    price_per_gpu_hour: 3.6
"""

ORCHESTRATOR = textwrap.dedent(
    """
    import dagster as dg
    from testbed.counting_step import counting_spec, materialize_counting
    from pathlib import Path
    import sys
    home, pools = Path(sys.argv[1]), Path(sys.argv[2])
    with dg.DagsterInstance.get() as instance:
        materialize_counting(home, pools, counting_spec(config={"steps": 400, "step_seconds": 0.25}), instance=instance)
    """
)


def _watcher_tick(instance: dg.DagsterInstance, home: Path, pools: Path) -> dg.SensorResult:
    watcher = make_inflight_watcher(name="test_watcher", asset_prefix="counting")
    resources = platform_resources(root=str(home), pools_file=str(pools))
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        return watcher(context)


def test_watcher_stops_the_workload_of_a_dead_orchestrator(home: Path, tmp_path: Path):
    pools = tmp_path / "pools.yaml"
    pools.write_text(CATALOG)
    storage = Storage.at(str(home))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    # Engines other tests share (the S3 server, a Slurm cluster) are children too: leave them be.
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    orchestrator = subprocess.Popen([sys.executable, "-c", ORCHESTRATOR, str(home), str(pools)], env=env, cwd=REPO_ROOT)
    try:
        # (The pool's qualification probe is in flight first, for a moment.)
        (record,) = wait_for("the step to be in flight", lambda: [r for r in InFlight(storage).records() if r["owner"]["step"] == "test.counting"])
        workload = psutil.Process(int(record["handle"]["job_id"]))
        wait_for("a checkpoint", lambda: storage.fs.exists(storage.checkpoints("counting").removeprefix("file://")))
        orchestrator.send_signal(signal.SIGKILL)  # the run worker dies; the GPU job does not
        orchestrator.wait(timeout=30)
        assert workload.is_running(), "the workload should outlive its orchestrator (that is the problem)"

        with dg.DagsterInstance.get() as instance:
            run = instance.get_run_by_id(record["owner"]["run_id"])
            assert run is not None and run.status == dg.DagsterRunStatus.STARTED
            # While the run still counts as running, the watcher leaves the job alone.
            result = _watcher_tick(instance, home, pools)
            assert not result.asset_events and workload.is_running()
            # Dagster's run monitoring marks a run whose worker died as failed; do what it does.
            instance.report_run_failed(run)
            result = _watcher_tick(instance, home, pools)

        (observation,) = result.asset_events
        assert observation.asset_key == dg.AssetKey("counting")
        assert observation.metadata["watcher"].value == "orphaned"
        assert observation.metadata["action"].value == "cancelled"
        workload.wait(timeout=30)
        assert not workload.is_running()
        assert InFlight(storage).records() == []
        ledger = read_ledger(storage.ledger())
        orphaned = ledger[ledger.outcome == "orphaned"]
        assert len(orphaned) == 1 and orphaned.iloc[0].pool == "here" and orphaned.iloc[0].cost_usd > 0
    finally:
        if orchestrator.poll() is None:
            orchestrator.kill()
        for child in psutil.Process().children(recursive=True):
            if child.pid not in before:
                child.kill()


def test_watcher_clears_a_stale_record_and_ignores_other_lanes(home: Path, tmp_path: Path, instance: dg.DagsterInstance):
    pools = tmp_path / "pools.yaml"
    pools.write_text(CATALOG)
    inflight = InFlight(Storage.at(str(home)))
    gone = JobHandle("local", "here", "999999999", time.time(), {"create_time": 0.0})
    owner = {"run_id": "0" * 36, "step": "x", "partition": None, "attempt": 1, "gpus": 1}
    inflight.add(gone, **owner, asset="counting")
    other_lane = JobHandle("local", "here", "999999998", time.time(), {"create_time": 0.0})
    inflight.add(other_lane, **owner, asset="elsewhere/model")

    result = _watcher_tick(instance, home, pools)

    (observation,) = result.asset_events
    assert observation.metadata["watcher"].value == "stale"
    remaining = [r["owner"]["asset"] for r in inflight.records()]
    assert remaining == ["elsewhere/model"]
    assert read_ledger(Storage.at(str(home)).ledger()).empty  # nothing held a pool: nothing booked


def test_a_record_removed_while_the_records_are_read_is_left_out(home: Path, monkeypatch: pytest.MonkeyPatch):
    """An attempt that ends between the listing of the records and their reads is no longer in
    flight; the watcher (and a drill's fault thread) must not fail on it."""
    import control_plane.compute.inflight as inflight_module

    inflight = InFlight(Storage.at(str(home)))
    owner = {"run_id": "0" * 36, "step": "x", "partition": None, "attempt": 1, "gpus": 1, "asset": "counting"}
    staying, ending = (JobHandle("local", "here", job_id, time.time(), {"create_time": 0.0}) for job_id in ("101", "102"))
    inflight.add(staying, **owner)
    inflight.add(ending, **owner)
    listed = inflight_module.glob_uris

    def list_then_end(pattern: str) -> list[str]:
        uris = listed(pattern)
        inflight.remove(ending)  # the attempt ends right after the listing
        return uris

    monkeypatch.setattr(inflight_module, "glob_uris", list_then_end)
    assert [r["handle"]["job_id"] for r in inflight.records()] == ["101"]


# A child that dies on SIGTERM, whatever it inherits. After an in-process Dagster run, Dagster
# leaves SIGTERM at SIGINT's original handler (dagster/_utils/interrupts.py), and a pytest-xdist
# worker ignores SIGINT; an ignored signal stays ignored across exec, so a plain child started
# later in the same worker ignored SIGTERM too, and `cancel` waited out its 10 s grace.
SLEEPER = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_DFL); print('ready', flush=True); time.sleep(300)"


def test_local_handle_never_matches_a_reused_pid():
    process = subprocess.Popen([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"  # its SIGTERM is at the default now
        pool = load_pools()["local"]
        handle = LocalBackend.handle_for(pool, process.pid)
        assert LocalBackend().status(handle).state.value == "running"
        reused = JobHandle("local", pool.name, str(process.pid), handle.submitted_at, {"create_time": 1.0})
        assert LocalBackend().status(reused).state.value == "gone"
        LocalBackend().cancel(handle)
        assert LocalBackend().status(handle).state.value == "gone"
        assert _reaped(process.pid, handle), "cancel returns once the process it stopped is gone, not a zombie"
    finally:
        process.kill()
        process.communicate()  # reaps it and closes its pipe


def _reaped(pid: int, handle: JobHandle) -> bool:
    """Nothing left of the handle's process, not even a zombie (its pid gone, or another's)."""
    try:
        return abs(psutil.Process(pid).create_time() - handle.info["create_time"]) > 0.01
    except psutil.NoSuchProcess:
        return True


def test_a_zombie_counts_as_ended():
    """A child that died and that nobody has waited for yet (a zombie) is gone, deterministically:
    the test waits until the kernel shows it as a zombie, then asks."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        handle = LocalBackend.handle_for(load_pools()["local"], process.pid)
        os.kill(process.pid, signal.SIGKILL)  # not through Popen: nothing waits for it
        wait_for("the killed child to be a zombie", lambda: psutil.Process(process.pid).status() == psutil.STATUS_ZOMBIE)
        assert LocalBackend().status(handle).state.value == "gone"
        LocalBackend().signal(handle)  # nothing to signal, nothing raised
        LocalBackend().cancel(handle, grace_seconds=0)
        assert process.wait(timeout=30) == -signal.SIGKILL  # status and cancel left its exit code to its parent
    finally:
        process.kill()


def test_cancel_kills_a_process_that_ignores_sigterm_and_reaps_it():
    """Past its grace period cancel kills, and returns only once the process has ended (the case
    where status read `running` after cancel: a SIGKILL sent and not waited for)."""
    ignores = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(300)"
    process = subprocess.Popen([sys.executable, "-c", ignores], stdout=subprocess.PIPE)
    try:
        assert process.stdout.readline() == b"ready\n"  # SIGTERM is ignored from here on
        handle = LocalBackend.handle_for(load_pools()["local"], process.pid)
        LocalBackend().cancel(handle, grace_seconds=0.2)
        assert LocalBackend().status(handle).state.value == "gone"
        assert _reaped(process.pid, handle)
    finally:
        process.kill()
        process.stdout.close()
