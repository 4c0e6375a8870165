"""Failover and resume across pools: a pool that refuses a step is skipped for the next in the
plan and cooled down; a preempted step resumes on the next pool; a retry budget bounds it."""

from __future__ import annotations

import time
from pathlib import Path

import dagster as dg
import pytest
import torch

from cell_lane.defs.assets.dataset import omics_dataset
from cell_lane.defs.assets.training import foundation_model
from cell_lane.standins.lab import LabStandIn
from control_plane.accounting.ledger import read_ledger
from control_plane.catalog.pools import load_pools
from control_plane.compute.cooldowns import SLOTS_ENV, Cooldowns, pool_slot
from shared_resources.resources import platform_resources
from tests.helpers import LAB, Preemptor
from workload_runtime.checkpoints import CheckpointStore
from workload_runtime.storage import Storage

pytestmark = pytest.mark.e2e  # runs workloads end to end, in their own processes

CATALOG = """
pools:
  steady-a:
    provider: local
    region: local
    backend: local
    purchasing: reserved
    capacity: steady
    accelerator: local
    gpus_per_node: 1
    price_per_gpu_hour: 1.0
    max_concurrent_steps: 1
    cooldown_seconds: 600
    tenants: [cell]
  steady-b:
    provider: local
    region: local
    backend: local
    purchasing: on_demand
    capacity: steady
    accelerator: local
    gpus_per_node: 1
    price_per_gpu_hour: 2.0
    max_concurrent_steps: 1
    tenants: [cell]
"""
CONFIG = {"ops": {"cell__foundation_model": {"config": {"steps": 300, "checkpoint_every_steps": 50}}}}


@pytest.fixture
def catalog(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(SLOTS_ENV, str(tmp_path / "slots"))
    path = tmp_path / "pools.yaml"
    path.write_text(CATALOG)
    return path


def _prepare(instance, home: Path, catalog: Path) -> dict:
    resources = platform_resources(root=str(home), pools_file=str(catalog))
    LabStandIn.of_tenant(str(home), LAB).seed_drops(plates=1, include_bad=False)
    dg.materialize([omics_dataset], instance=instance, resources=resources, partition_key=LAB)
    return resources


def _train(instance, resources, **kw):
    return dg.materialize(
        [omics_dataset, foundation_model], instance=instance, resources=resources, run_config=CONFIG, selection=[foundation_model], partition_key=LAB, **kw
    )


def _md(result) -> dict:
    event = next(e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == "cell/foundation_model")
    return {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}


def test_a_refusing_pool_is_skipped_for_the_next_and_cooled_down(instance, home, catalog):
    resources = _prepare(instance, home, catalog)
    pool_a = load_pools(catalog)["steady-a"]
    with pool_slot(pool_a) as held:  # another step holds steady-a's only slot
        assert held == 0
        before = time.time()
        result = _train(instance, resources)
        after = time.time()
    md = _md(result)
    assert md["pool"] == "steady-b" and md["pools_tried"] == "steady-a, steady-b"
    ledger = read_ledger(Storage.at(str(home)).ledger())
    assert list(zip(ledger["pool"], ledger["outcome"], strict=True)) == [("steady-a", "refused"), ("steady-b", "succeeded")]
    cooldown = Cooldowns(Storage.at(str(home))).active("steady-a")
    assert cooldown is not None and cooldown.reason.startswith("refused")
    # Its full cool-down, from the moment it refused: however long the training on steady-b took.
    assert before + pool_a.cooldown_seconds <= cooldown.until <= after + pool_a.cooldown_seconds


def test_no_capacity_anywhere_is_a_clear_failure(instance, home, catalog):
    resources = _prepare(instance, home, catalog)
    pools = load_pools(catalog)
    with pool_slot(pools["steady-a"]), pool_slot(pools["steady-b"]):
        result = _train(instance, resources, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert "No pool had capacity" in failure.step_failure_data.error.message


HELD_AT = 100  # each attempt is held (and preempted) once it has done this step or later


def test_a_preempted_step_resumes_on_the_next_pool_with_the_same_result(instance, home, catalog, tmp_path, monkeypatch):
    resources = _prepare(instance, home, catalog)
    with Preemptor(monkeypatch, tmp_path / "held", at_step=HELD_AT, times=1) as preemptor:
        result = _train(instance, resources)
    md = _md(result)
    assert preemptor.preempted and md["preemptions"] == 1 and md["pools_tried"] == "steady-a, steady-b"
    ledger = read_ledger(Storage.at(str(home)).ledger())
    assert list(ledger["outcome"]) == ["preempted", "succeeded"]

    # The same step, never interrupted, on a fresh root gives the same weights (the failpoint's
    # marker is still there, so it holds nothing).
    other = tmp_path / "reference"
    (other / "dagster").mkdir(parents=True)
    with dg.instance_for_test(temp_dir=str(other / "dagster")) as reference_instance:
        reference = _prepare(reference_instance, other, catalog)
        assert _md(_train(reference_instance, reference))["preemptions"] == 0
    ours = CheckpointStore(str(md["checkpoints"])).latest_valid().tensors["model"]
    theirs_uri = next(p.parent.parent for p in (other / "tenants" / LAB / "checkpoints").rglob("manifest.json"))
    theirs = CheckpointStore(str(theirs_uri)).latest_valid().tensors["model"]
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


def test_the_retry_budget_bounds_preemptions(instance, home, catalog, tmp_path, monkeypatch):
    resources = _prepare(instance, home, catalog)
    with Preemptor(monkeypatch, tmp_path / "held", at_step=HELD_AT, times=10) as preemptor:
        result = _train(instance, resources, raise_on_error=False)
    assert not result.success
    assert len(preemptor.preempted) == 4  # the fourth preemption ended the step: no fifth attempt
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert "preempted 4 times, more than its limit of 3" in failure.step_failure_data.error.message


def test_cooldowns_expire_and_the_soonest_is_used_when_all_are_cooling(home, catalog):
    storage = Storage.at(str(home))
    pools = load_pools(catalog)
    cooldowns = Cooldowns(storage)
    assert cooldowns.active("steady-a") is None
    cooldowns.start(pools["steady-a"], "preempted")
    assert cooldowns.active("steady-a").reason == "preempted"
    instant = pools["steady-b"].model_copy(update={"cooldown_seconds": 0.0})
    cooldowns.start(instant, "preempted")
    assert cooldowns.active("steady-b") is None  # a zero cool-down is over at once
