"""One step, two engines: preempted on a Slurm spot partition, it resumes from its checkpoint
on a Ray pool and ends with exactly the result of an uninterrupted run on the local machine.

This is the platform's promise in one test: the step is defined once, the workload runs
unchanged on each engine, and losing capacity mid-run costs only the work since the last
checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from control_plane.accounting.ledger import read_ledger
from workload_runtime.storage import Storage
from testbed.ray_head import RayHead
from testbed.slurm_cluster import SlurmCluster
from testbed.counting_step import counting_spec, held, materialize_counting, result_metadata

STEPS = {"steps": 20, "seed": 11}


@pytest.fixture
def engines(slurm: SlurmCluster, ray: RayHead) -> tuple[SlurmCluster, RayHead]:
    """The session's Slurm cluster and Ray head, each left clean after the test."""
    return slurm, ray


def _pool(**fields) -> dict:
    return {
        "provider": "test",
        "region": "local",
        "accelerator": "local",
        "gpus_per_node": 2,
        "cooldown_seconds": 600,
        **fields,
    }


def test_preempted_on_slurm_resumes_on_ray_with_the_same_result(engines, home: Path, tmp_path: Path, instance):
    cluster, head = engines
    catalog = tmp_path / "pools.yaml"
    catalog.write_text(
        yaml.safe_dump(
            {
                "pools": {
                    # Cheapest first: placement tries the Slurm spot partition, then the Ray pool.
                    "slurm-spot": _pool(
                        backend="slurm",
                        backend_settings={"partition": "spot", "env": cluster.env, "time_limit": "00:10:00"},
                        purchasing="spot",
                        price_per_gpu_hour=1.0,
                    ),
                    "ray-on-demand": _pool(
                        backend="ray",
                        backend_settings={"address": head.address, "resources": {"pool_ray": 1}, "gpu_resource": None},
                        purchasing="on_demand",
                        price_per_gpu_hour=2.0,
                    ),
                }
            }
        )
    )
    uninterrupted_home = tmp_path / "uninterrupted"
    uninterrupted_home.mkdir()
    local = tmp_path / "local.yaml"
    local.write_text(yaml.safe_dump({"pools": {"here": _pool(backend="local", purchasing="on_demand", price_per_gpu_hour=0.0)}}))
    expected = result_metadata(materialize_counting(uninterrupted_home, local, counting_spec(config=STEPS)))["digest"]

    storage = Storage.at(str(home))
    # The Slurm attempt waits after step 5 until it is requeued (what a spot reclaim does).
    held_run = counting_spec(config=STEPS, failpoint=held(tmp_path / "held"))
    with cluster.requeue_after_first_checkpoint(home) as requeued:
        result = materialize_counting(home, catalog, held_run, instance=instance)

    assert requeued, "the step finished on Slurm before it could be preempted"
    metadata = result_metadata(result)
    assert metadata["digest"] == expected
    assert metadata["pools_tried"] == "slurm-spot, ray-on-demand"
    assert metadata["pool"] == "ray-on-demand" and metadata["backend"] == "ray"
    assert metadata["resumed_from"] > 0  # Ray picked up Slurm's checkpoint, not step 0
    ledger = read_ledger(storage.ledger())
    assert list(zip(ledger.pool, ledger.backend, ledger.outcome)) == [
        ("slurm-spot", "slurm", "preempted"),
        ("ray-on-demand", "ray", "succeeded"),
    ]
    assert ledger.lost_seconds.iloc[0] > 0  # the preempted attempt's unsaved time is on the books
