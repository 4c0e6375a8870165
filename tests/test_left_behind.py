"""A resumed run's new worker stops the GPU job its dead worker left running before it runs the
step again (control_plane/compute/left_behind.py), on the suite's real Slurm cluster: one copy of
the step at a time, the left-behind job booked once as orphaned, the new attempt resumed from
its checkpoint and numbered after it."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import dagster as dg
import yaml

from control_plane.accounting.ledger import read_ledger
from control_plane.catalog.pools import load_pools
from control_plane.compute.backends.base import JobHandle
from control_plane.compute.backends.engine import Launch
from control_plane.compute.backends.slurm import SlurmBackend
from control_plane.compute.inflight import InFlight
from control_plane.settings import REPO_ROOT
from shared_resources.compute import ComputeResource
from testbed.counting_step import counting_asset, counting_spec, held, result_metadata
from testbed.slurm_cluster import SlurmCluster
from workload_runtime.storage import Storage
from workload_runtime.workload import EXTRAS_ENV

STEPS = {"steps": 20, "seed": 7}


def _catalog(folder: Path, cluster: SlurmCluster) -> Path:
    path = folder / "pools.yaml"
    path.write_text(yaml.safe_dump({"pools": {"slurm-gpu": {
        "provider": "test-slurm", "region": "local", "backend": "slurm",
        "backend_settings": {"partition": "gpu", "env": cluster.env, "time_limit": "00:10:00"},
        "purchasing": "on_demand", "accelerator": "local", "gpus_per_node": 2, "price_per_gpu_hour": 2.0,
    }}}))  # fmt: skip
    return path


def _job(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    shown = cluster.client(["scontrol", "show", "job", "--oneliner", job_id]).stdout
    return dict(word.split("=", 1) for word in shown.split() if "=" in word)


def test_a_resumed_worker_stops_the_job_its_dead_worker_left_and_resumes_the_step(slurm, home, instance, tmp_path):
    catalog = _catalog(tmp_path, slurm)
    pool, spec, storage = load_pools(catalog)["slurm-gpu"], counting_spec(config=STEPS), Storage.at(str(home))
    run_id = str(uuid.uuid4())
    # The dead worker's attempt 1: submitted, recorded in flight for the run, and held after its
    # checkpoint at step 5 (its worker would have collected it; none will).
    marker = tmp_path / "held"
    extras = {"config": STEPS, "checkpoint_uri": storage.checkpoints("counting"), "checkpoint_every_steps": 5, "failpoint": held(marker).model_dump()}
    folder = home / "state" / "pipes" / run_id / "test.counting-a1-deadbeef"
    folder.mkdir(parents=True)
    backend = SlurmBackend()
    launch = Launch(name=folder.name, command=backend.command(pool, spec), env={EXTRAS_ENV: json.dumps(extras), "SINEWGRID_POOL": pool.name},
                    workdir=str(REPO_ROOT), output_path=str(folder / "output.log"))  # fmt: skip
    left = backend.submit(pool, spec, launch)
    inflight = InFlight(storage)
    inflight.add(left, run_id=run_id, step=spec.name, asset="counting", partition=None, attempt=1, gpus=1, tenant=spec.tenant, checkpoint_uri=extras["checkpoint_uri"])
    # A sibling in flight in the same run under the same step name, writing elsewhere (a sweep's
    # other shard): not this step instance's, so left alone.
    sibling = JobHandle("slurm", pool.name, "999999", time.time(), dict(left.info))
    inflight.add(sibling, run_id=run_id, step=spec.name, asset="counting", partition=None, attempt=1, gpus=1, checkpoint_uri=storage.checkpoints("shard-1"))
    _wait(lambda: marker.exists(), "the left-behind job to checkpoint and wait")

    # The run resumed with a new worker: the same run id runs the step again.
    job = dg.Definitions(
        assets=[counting_asset(spec)], resources={"compute": ComputeResource(storage_root=str(home), pools_file=str(catalog))}
    ).resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(instance=instance, run_id=run_id)
    metadata = result_metadata(result)
    assert metadata["resumed_from"] == 5 and metadata["attempts"] == 1, metadata  # from the left-behind job's checkpoint

    ledger = read_ledger(storage, run_id=run_id)
    assert list(zip(ledger["attempt"], ledger["outcome"])) == [(1, "orphaned"), (2, "succeeded")], ledger[["attempt", "outcome"]]
    assert set(ledger["tenant"]) == {spec.tenant}  # the orphan's time is the step's tenant's, as the attempt's is
    assert [r["handle"]["job_id"] for r in inflight.records()] == ["999999"]  # the sibling's record, untouched
    # One copy at a time: the left-behind job had ended (SIGTERM: it checkpointed and exited 75)
    # before the new attempt's job started.
    stopped = _job(slurm, left.job_id)
    assert stopped["ExitCode"] == "75:0", stopped
    listed = [line.split() for line in slurm.client(["squeue", "-h", "-t", "all", "-o", "%i %j"]).stdout.splitlines()]
    (new,) = [i for i, name in listed if int(i) > int(left.job_id) and name.startswith("test.counting-a2-")]  # the session's cluster lists others' too
    assert _job(slurm, new)["StartTime"] >= stopped["EndTime"]


def _wait(probe, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return
        time.sleep(0.3)
    raise AssertionError(f"no {what} after {timeout:g}s")
