"""The Young/Daly interval placement works out for an interruptible pool reaches the workload,
which checkpoints on it; checkpoint-writing and queue time reach the ledger."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from control_plane.accounting.ledger import read_ledger
from control_plane.placement.ranking import checkpoint_interval_seconds
from testbed.counting_step import counting_spec, materialize_counting, result_metadata
from workload_runtime.storage import Storage

pytestmark = pytest.mark.e2e  # runs workloads end to end, in their own processes

# λ = 3600 interruptions per hour → M = 1 s; δ = 0.125 s → τ = √(2·δ·M) = 0.5 s.
SPOT = {
    "provider": "local",
    "region": "local",
    "backend": "local",
    "purchasing": "spot",
    "accelerator": "local",
    "gpus_per_node": 1,
    "price_per_gpu_hour": 1.0,
    "interruption_rate_per_hour": 3600.0,
}


def test_the_workload_checkpoints_on_the_young_daly_interval(home: Path, tmp_path: Path):
    assert checkpoint_interval_seconds(3600.0, 0.125) == 0.5
    pools = tmp_path / "pools.yaml"
    pools.write_text(yaml.safe_dump({"pools": {"spot": SPOT}}))
    # The step cadence alone (every 1,000 steps) would give no checkpoint before the final one.
    spec = counting_spec(checkpoint_every_steps=1000, checkpoint_seconds=0.125, config={"steps": 12, "step_seconds": 0.2})

    metadata = result_metadata(materialize_counting(home, pools, spec))

    steps = sorted(int(p.name.split("-")[1]) for p in (home / "checkpoints" / "counting").glob("step-*"))
    assert steps[-1] == 12 and len(steps) >= 3, steps  # 12 × 0.2 s = 2.4 s of work at τ = 0.5 s
    assert metadata["attempts"] == 1
    (row,) = read_ledger(Storage.at(str(home))).to_dict("records")
    assert row["checkpoint_seconds"] > 0  # the writes are booked apart from productive time
    assert row["productive_seconds"] + row["checkpoint_seconds"] <= row["allocated_seconds"]


def test_a_steady_pool_gives_no_time_cadence(home: Path, tmp_path: Path):
    pools = tmp_path / "pools.yaml"
    pools.write_text(yaml.safe_dump({"pools": {"steady": {**SPOT, "purchasing": "on_demand", "interruption_rate_per_hour": 0.0}}}))
    spec = counting_spec(checkpoint_every_steps=1000, config={"steps": 6, "step_seconds": 0.2})
    materialize_counting(home, pools, spec)
    steps = [p.name for p in (home / "checkpoints" / "counting").glob("step-*")]
    assert steps == ["step-00000006"]  # only the final one
