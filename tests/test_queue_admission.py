"""Admission in the compute resource (control_plane/queues/gate.py, waiting_step.py) on the local
pool: a team taking back its lent quota preempts the borrower through the notice → checkpoint →
resume path, the ledger books it to `quota`, the borrower waits with its reason and resumes from
its checkpoint; waiting work goes in queue order; pools without quotas are not queued."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml

from control_plane.accounting.ledger import read_ledger
from control_plane.catalog.pools import load_pools
from control_plane.catalog.quotas import load_quotas
from control_plane.compute.backends.base import JobHandle
from control_plane.compute.inflight import InFlight
from control_plane.compute.step_run import StepFailedError
from control_plane.queues.gate import Gate, Waiting, WaitingRecords
from control_plane.queues.admission import Request
from testbed.counting_step import counting_spec, held, materialize_counting, result_metadata
from workload_runtime.storage import Storage

POOLS = {"pools": {"gpu": {
    "provider": "test", "region": "local", "backend": "local", "purchasing": "reserved", "accelerator": "local",
    "gpus_per_node": 2, "price_per_gpu_hour": 1.0, "qualify": False,
}, "elsewhere": {
    "provider": "test", "region": "local", "backend": "local", "purchasing": "on_demand", "accelerator": "local",
    "gpus_per_node": 2, "price_per_gpu_hour": 9.0, "qualify": False,
}}}  # fmt: skip
QUOTAS = {
    "teams": {"owners": {"members": ["owner"]}, "borrowers": {"members": ["borrower"]}, "others": {"members": ["other"]}},
    "cohorts": {"all": {"teams": ["owners", "borrowers", "others"]}},
    "quotas": {"gpu": {"owners": {"gpus": 2}}},
    "priority_classes": {"high": 10, "low": 1},
    "default_priority": "low",
}


@pytest.fixture
def queued(tmp_path: Path, home: Path, monkeypatch) -> tuple[Path, Storage]:
    (tmp_path / "quotas.yaml").write_text(yaml.safe_dump(QUOTAS))
    (tmp_path / "pools.yaml").write_text(yaml.safe_dump(POOLS))
    monkeypatch.setenv("SINEWGRID_QUOTAS", str(tmp_path / "quotas.yaml"))
    monkeypatch.setenv("SINEWGRID_QUEUE_POLL_SECONDS", "0.2")
    return tmp_path / "pools.yaml", Storage.at(str(home))


def test_an_owner_takes_its_quota_back_and_the_borrower_resumes_from_its_checkpoint(queued, home, tmp_path):
    _reclaimed(POOLS["pools"]["gpu"], queued[1], home, tmp_path)


def test_on_slurm_an_owner_takes_its_node_back_and_the_borrower_resumes(slurm, queued, home, tmp_path):
    pool = {**POOLS["pools"]["gpu"], "backend": "slurm", "backend_settings": {"partition": "gpu", "env": slurm.env, "time_limit": "00:10:00"}}
    _reclaimed(pool, queued[1], home, tmp_path)


def test_on_ray_an_owner_takes_its_quota_back_and_the_borrower_resumes(ray, queued, home, tmp_path):
    pool = {**POOLS["pools"]["gpu"], "backend": "ray", "backend_settings": {"address": ray.address, "resources": {"pool_ray": 1}, "gpu_resource": None}}
    _reclaimed(pool, queued[1], home, tmp_path)


def _reclaimed(pool: dict, storage: Storage, home: Path, tmp_path: Path) -> None:
    """The owners' step arrives while the borrowers hold all of its pool: the borrower is
    preempted (notice, checkpoint, exit 75, cause `quota`), waits while the owner runs, and
    resumes from its checkpoint after it: never both at once."""
    catalog = tmp_path / "one-pool.yaml"
    catalog.write_text(yaml.safe_dump({"pools": {"gpu": pool}}))
    marker = tmp_path / "borrower-at-step-5"
    # The borrower holds after its checkpoint at step 5 (once), so the owner arrives while it runs.
    borrower = counting_spec("test.borrower", tenant="borrower", gpus=2, config={"steps": 20}, failpoint=held(marker))
    owner = counting_spec("test.owner", tenant="owner", gpus=2, config={"steps": 30, "step_seconds": 0.1})
    results: dict[str, object] = {}

    instances = {"borrower": dg.DagsterInstance.ephemeral(), "owner": dg.DagsterInstance.ephemeral()}

    def run(name, spec):
        results[name] = materialize_counting(home, catalog, spec, lineage=name, instance=instances[name])

    first = threading.Thread(target=run, args=("borrower", borrower))
    first.start()
    _wait(marker.exists, "the borrower to checkpoint at step 5 and hold")
    run("owner", owner)  # within its quota: it reclaims the pool
    first.join(timeout=120)

    ledger = read_ledger(storage)
    mine = ledger[ledger["step"] == "test.borrower"]
    assert list(zip(mine["outcome"], mine["cause"])) == [("preempted", "quota"), ("succeeded", "")], mine[["outcome", "cause"]]
    metadata = result_metadata(results["borrower"])
    assert metadata["resumed_from"] == 5, metadata
    theirs = ledger[ledger["step"] == "test.owner"]
    assert list(theirs["outcome"]) == ["succeeded"] and set(theirs["pool"]) == {"gpu"}
    # Never both at once: the owner started after the borrower's attempt ended, the borrower
    # resumed after the owner ended (it waited, saying why).
    assert theirs["started_at"].iloc[0] >= mine["ended_at"].iloc[0] and mine["started_at"].iloc[1] >= theirs["ended_at"].iloc[0]
    said = "\n".join(e.user_message for e in instances["borrower"].all_logs(results["borrower"].run_id))
    assert "preempted by admission for test.owner" in said and "waits in the queue" in said and "borrow" in said, said
    assert WaitingRecords(storage).all() == []  # nothing left waiting
    tags = instances["borrower"].get_run_by_id(results["borrower"].run_id).tags
    assert tags["sinewgrid/queue"].startswith("admitted on gpu after"), tags  # the Runs page shows it waited


def test_a_step_on_on_demand_moves_to_committed_capacity_that_came_free(queued, home, monkeypatch):
    """The reserved pool is full (the owners' step), so the other team's step starts on the
    on-demand pool; when the owners' step ends, it moves: notice, checkpoint, resume on `gpu`."""
    catalog, storage = queued
    monkeypatch.setenv("SINEWGRID_QUEUE_MOVE_MIN_HOURS", "0.001")  # the steps here last seconds
    owner = counting_spec("test.owner", tenant="owner", gpus=2, config={"steps": 20, "step_seconds": 0.1})
    mover = counting_spec("test.mover", tenant="other", gpus=2, expected_hours=1.0, config={"steps": 200, "step_seconds": 0.05})
    instances = {"owner": dg.DagsterInstance.ephemeral(), "mover": dg.DagsterInstance.ephemeral()}
    results: dict[str, object] = {}

    def run(name, spec):
        results[name] = materialize_counting(home, catalog, spec, lineage=name, instance=instances[name])

    first = threading.Thread(target=run, args=("owner", owner))
    first.start()
    _wait(lambda: any(r["owner"].get("step") == "test.owner" for r in InFlight(storage).records()), "the owners' step to hold the reserved pool")
    run("mover", mover)
    first.join(timeout=120)

    ledger = read_ledger(storage)
    moved = ledger[ledger["step"] == "test.mover"]
    assert list(zip(moved["pool"], moved["outcome"], moved["cause"])) == [("elsewhere", "preempted", "moved"), ("gpu", "succeeded", "")], moved[["pool", "outcome", "cause"]]
    assert result_metadata(results["mover"])["resumed_from"] > 0
    said = "\n".join(e.user_message for e in instances["mover"].all_logs(results["mover"].run_id))
    assert "moving test.mover to gpu: committed pool gpu of its plan came free, before elsewhere (on_demand)" in said, said


def test_waiting_work_goes_in_queue_order_and_a_pool_without_quotas_is_not_queued(queued, home):
    catalog, storage = queued
    pools, quotas = load_pools(catalog), load_quotas()
    gate = Gate(storage, pools, quotas)
    # One GPU of `gpu` held by the owners; a borrower waits (fairer: it holds nothing) for it.
    InFlight(storage).add(JobHandle("local", "gpu", "1", time.time(), {}), run_id="r", step="s", tenant="owner", gpus=1, checkpoint_uri="c")
    ahead = Waiting(Request("borrowers-step", "borrowers", 1, 1, arrived=0.0), "robotics.sweep", "r2", {"gpu": 1})
    WaitingRecords(storage).put(ahead)
    spec = counting_spec("test.later", tenant="other", gpus=1)
    placed = gate.place(spec, [pools["gpu"]], request_id="mine", run_id="r3", arrived=time.time())
    assert placed.pool is None and "robotics.sweep of team borrowers is ahead of it" in placed.refusals["gpu"], placed
    # The pool without quotas is not queued: the same step starts there at once.
    placed = gate.place(spec, [pools["gpu"], pools["elsewhere"]], request_id="mine", run_id="r3", arrived=time.time())
    assert placed.pool == "elsewhere" and "not queued" in placed.decision.reason
    # A tenant whose team cannot borrow past a full pool waits with the reason.
    InFlight(storage).add(JobHandle("local", "gpu", "2", time.time(), {}), run_id="r", step="s2", tenant="borrower", gpus=1, checkpoint_uri="c2")
    WaitingRecords(storage).remove("borrowers-step")
    placed = gate.place(spec, [pools["gpu"]], request_id="mine", run_id="r3", arrived=time.time())
    assert placed.pool is None and "team others would borrow 1 GPUs on pool gpu" in placed.refusals["gpu"], placed


def test_a_bad_priority_class_is_refused_by_name_before_anything_runs(queued, home):
    catalog, storage = queued
    spec = counting_spec("test.bad", tenant="owner", priority_class="urgent", accelerators=["local"])
    with pytest.raises(StepFailedError, match="was not started: .*no priority class `urgent`"):
        materialize_counting(home, catalog, spec)
    assert read_ledger(storage).empty


def _wait(ready, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_the_gpu_queues_asset_charts_who_holds_each_pool_and_what_waits(queued, home):
    from platform_location.defs.assets.queues import gpu_queues
    from shared_resources.compute import ComputeResource
    from shared_resources.resources import StorageResource

    catalog, storage = queued
    InFlight(storage).add(JobHandle("local", "gpu", "1", time.time(), {}), run_id="r", step="test.owner", tenant="owner", gpus=2, checkpoint_uri="c")
    WaitingRecords(storage).put(Waiting(Request("w", "borrowers", 1, 1, time.time()), "robotics.sim_rollouts", "r2", {"gpu": 1},
                                        {"gpu": "team borrowers would borrow 1 GPUs on pool gpu; its cohort has 0 free to lend (owners 2/2); waits"}, time.time()))  # fmt: skip
    result = dg.materialize([gpu_queues], resources={"storage": StorageResource(root=str(home)), "compute": ComputeResource(storage_root=str(home), pools_file=str(catalog))})
    (mat,) = result.asset_materializations_for_node("platform__gpu_queues")
    meta = {k: v.value for k, v in mat.metadata.items()}
    assert (meta["gpus_in_use"], meta["gpus_borrowed"], meta["steps_waiting"]) == (2, 0, 1)
    assert "| `gpu` | 2 | 0 | owners | 2 | 2 | 0 |" in meta["queues"] and "`elsewhere` (not queued)" in meta["queues"]
    assert "robotics.sim_rollouts | borrowers | 1 | low |" in meta["queues"] and "its cohort has 0 free to lend" in meta["queues"]
    assert meta["chart"].startswith("![GPUs by pool](data:image/png;base64,") and (home / "reports" / "queues" / "gpu_queues.png").exists()
