"""Failure drills on a real single-node Slurm cluster: the faults Slurm itself sees.

No notice (the job's process is killed), the pool lost (its partition stops taking jobs),
a straggler (the job's process slowed), an unhealthy node (drained, as NHC does): each step
recovers to the uninterrupted run's end state, on the pool the platform picks next.
"""

from __future__ import annotations

import os

import pytest

from drills import runner
from testbed.slurm_cluster import SlurmCluster
from tests.test_drills import assert_recovered, drill, outcomes


@pytest.fixture(scope="module")
def cluster(slurm_cluster: SlurmCluster):
    """The session's Slurm cluster, handed to the drill runner while this module runs."""
    runner.ACTIVE_CLUSTERS["slurm"] = slurm_cluster
    yield slurm_cluster
    runner.ACTIVE_CLUSTERS.pop("slurm", None)


@pytest.fixture(scope="module")
def slurm_home(tmp_path_factory, cluster):
    root = tmp_path_factory.mktemp("slurm-drills") / "home"
    root.mkdir()
    saved = os.environ.get("SINEWGRID_SLOTS_DIR")
    os.environ["SINEWGRID_SLOTS_DIR"] = str(root / "slots")
    yield root
    if saved is None:
        os.environ.pop("SINEWGRID_SLOTS_DIR", None)
    else:
        os.environ["SINEWGRID_SLOTS_DIR"] = saved


@pytest.fixture
def healthy(cluster, slurm):
    """The cluster, back to healthy with no job left after each drill (the `slurm` fixture)."""
    return cluster


def test_a_killed_slurm_job_resumes_from_its_checkpoint(slurm_home, healthy):
    r = drill(slurm_home, "preempt-no-notice", "slurm-pretrain")
    assert_recovered(r)
    assert outcomes(r)[0] == ("drill-slurm-spot", "preempted", "lost-node")
    assert r.attempts[1]["pool"] == "drill-slurm-spot"  # the pool is healthy: the step stays


def test_a_partition_that_stops_taking_jobs_is_refused_and_the_step_moves(slurm_home, healthy):
    r = drill(slurm_home, "pool-loss", "slurm-pretrain")
    assert_recovered(r)
    assert outcomes(r) == [
        ("drill-slurm-spot", "preempted", "lost-node"),
        ("drill-slurm-spot", "refused", "refused"),
        ("drill-slurm-gpu", "succeeded", ""),
    ]


def test_a_drained_node_moves_the_step_off_the_cluster(slurm_home, healthy):
    r = drill(slurm_home, "unhealthy-node", "slurm-pretrain")
    assert_recovered(r)
    pools = outcomes(r)
    assert pools[0] == ("drill-slurm-spot", "preempted", "unhealthy-node")
    # The other partition shares the drained node: it is disqualified too, and the step
    # lands on the fallback pool outside the cluster.
    assert ("drill-slurm-gpu", "disqualified", "unhealthy-node") in pools
    assert pools[-1] == ("drill-local-b", "succeeded", "")
    assert "drain" in r.attempts[0]["flags"].lower()


def test_a_straggling_slurm_job_is_replaced(slurm_home, healthy):
    r = drill(slurm_home, "straggler", "slurm-pretrain")
    assert_recovered(r)
    assert outcomes(r)[0] == ("drill-slurm-spot", "preempted", "straggler")
    assert outcomes(r)[-1] == ("drill-slurm-gpu", "succeeded", "")
