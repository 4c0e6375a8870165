"""A gang on Slurm: `srun` starts every rank inside the batch job, the ranks meet at the first
node's address, and the pretraining trains the model one process trains. The cluster has four
nodes, each `slurmd` in a network namespace of its own with its own address on a bridge
(`testbed/slurm_multinode.py`, started here: about a second), so the gang of 4 nodes × 1 rank
talks across real interfaces. The batch script of a gang is also checked as text.
"""

import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from control_plane.accounting.ledger import read_ledger
from control_plane.compute.backends.engine import Launch
from control_plane.compute.backends.slurm_batch import render_batch_script
from drills.faults import Injector
from testbed.slurm_multinode import PARTITION, MultiNodeSlurmCluster
from tests.fixtures.gang import (
    assert_close_weights,
    final_weights,
    pretrain_spec,
    run_pretrain,
)
from workload_runtime.inputs import Failpoint
from workload_runtime.storage import Storage


@pytest.fixture(scope="module")
def cluster() -> Iterator[MultiNodeSlurmCluster]:
    with MultiNodeSlurmCluster(nodes=4) as started:
        yield started


def _catalog(folder: Path, cluster: MultiNodeSlurmCluster) -> Path:
    pool = {
        "provider": "test-slurm", "region": "local", "backend": "slurm",
        "backend_settings": {"partition": PARTITION, "env": cluster.env, "time_limit": "00:10:00"},
        "purchasing": "reserved", "accelerator": "local", "gpus_per_node": 1, "nodes": len(cluster.nodes),
        "price_per_gpu_hour": 1.0, "qualify": False,
    }  # fmt: skip
    path = folder / "pools.yaml"
    path.write_text(yaml.safe_dump({"pools": {"slurm-gang": pool}}))
    return path


def test_a_gang_batch_script_starts_every_rank_with_srun(tmp_path, slurm_pool_for_text):
    launch = Launch(name="cell.foundation_model-a1-0123abcd", command=["/opt/venv/bin/python", "-m", "cell_lane.workloads.pretrain"], env={}, workdir="/srv", output_path="/shared/out.log")
    script = render_batch_script(slurm_pool_for_text, pretrain_spec("unused", nodes=4, ranks=8).model_copy(update={"gpus": 32}), launch)
    directives = [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]
    assert {"--nodes=4", "--ntasks-per-node=8", "--gres=gpu:8"} <= set(directives)
    assert "export MASTER_ADDR=$(scontrol show node" in script and "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 12768))" in script  # below the ephemeral ports
    assert script.rstrip().endswith("exec srun --kill-on-bad-exit=1 --ntasks-per-node=8 /opt/venv/bin/python -m cell_lane.workloads.pretrain")


def test_one_process_steps_keep_their_plain_batch_script(slurm_pool_for_text):
    launch = Launch(name="x", command=["python", "-m", "m"], env={}, workdir="/srv", output_path="/shared/out.log")
    script = render_batch_script(slurm_pool_for_text, pretrain_spec("unused", nodes=1, ranks=1), launch)
    assert "exec srun" not in script and "export MASTER_ADDR" not in script and script.rstrip().endswith("exec python -m m")


@pytest.fixture
def slurm_pool_for_text():
    from control_plane.catalog.pools import Pool

    return Pool(
        name="hpc", provider="campus", region="eu", backend="slurm", backend_settings={"partition": "a100"},
        purchasing="reserved", accelerator="a100-80gb", gpus_per_node=8, nodes=8, price_per_gpu_hour=1.0,
    )  # fmt: skip


@pytest.mark.e2e
@pytest.mark.engines
def test_a_gang_of_four_slurm_nodes_trains_the_model_one_process_trains(cluster, tmp_path, gang_dataset_uri, one_process):
    home = tmp_path / "home"
    catalog = _catalog(tmp_path, cluster)
    meta = run_pretrain(home, catalog, pretrain_spec(gang_dataset_uri, nodes=4, ranks=1))
    log = Path(meta["workload_log"]).read_text()
    assert "a gang of 4 ranks on sgn[0-3]; rank 0 listens on " + cluster.addresses["sgn0"] in log, log[-3000:]
    (row,) = read_ledger(Storage.at(str(home))).itertuples()
    assert (row.pool, row.backend, row.outcome) == ("slurm-gang", "slurm", "succeeded")
    assert_close_weights(one_process, final_weights(home))


@pytest.mark.e2e
@pytest.mark.engines
def test_a_lost_slurm_node_is_drained_and_the_gang_resumes_on_the_spare(cluster, tmp_path, gang_dataset_uri, one_process):
    """2 nodes × 1 rank on the 4-node pool: killing the ranks of sgn1 mid-run (held at step 30)
    ends the gang (`srun --kill-on-bad-exit`); sgn1 is drained, the gang is submitted again with
    `--exclude=sgn1`, lands on the spare and resumes from the step-20 checkpoint."""
    home, marker = tmp_path / "home", tmp_path / "held.json"
    spec = pretrain_spec(gang_dataset_uri, nodes=2, ranks=1, failpoint=Failpoint(kind="hold", at_step=30, marker=str(marker)))

    def kill_the_ranks_of_sgn1() -> None:
        for pid in cluster.node_pids("sgn1"):
            if Path(f"/proc/{pid}/comm").read_text().strip().startswith("python"):
                os.kill(pid, signal.SIGKILL)

    injector = Injector(kill_the_ranks_of_sgn1, Failpoint(kind="hold", at_step=30, marker=str(marker)), release=False)
    injector.start()
    try:
        meta = run_pretrain(home, _catalog(tmp_path, cluster), spec)
        assert injector.error is None, injector.error
        assert "DRAIN" in cluster.node_state("sgn1")
    finally:
        injector.cancelled.set()
        cluster.reset()
    ledger = read_ledger(Storage.at(str(home))).sort_values("attempt")
    assert [(r.outcome, r.cause, r.node, r.ranks) for r in ledger.itertuples()] == [("preempted", "lost-node", "sgn1", 2), ("succeeded", "", "", 2)]
    second = Path(meta["workload_log"]).read_text()
    (nodelist,) = re.findall(r"a gang of 2 ranks on (\S+);", second) or [second[-2000:]]
    relaunched_on = cluster.client(["scontrol", "show", "hostnames", nodelist]).stdout.split()
    assert len(relaunched_on) == 2 and "sgn1" not in relaunched_on, relaunched_on  # on the spare, without the lost node
    scripts = sorted((home / "state" / "pipes").rglob("step.sbatch"))
    assert "--exclude=sgn1" in scripts[-1].read_text() and "--exclude" not in scripts[0].read_text()
    resumed_row = meta["recovery"].splitlines()[-1]
    assert resumed_row.startswith("| 2 |") and "(20)" in resumed_row
    assert_close_weights(one_process, final_weights(home))


LOCAL_FALLBACK = {
    "provider": "local", "region": "local", "backend": "local", "purchasing": "on_demand", "accelerator": "local",
    "gpus_per_node": 1, "nodes": 2, "price_per_gpu_hour": 5.0, "qualify": False,
}  # fmt: skip


@pytest.mark.e2e
@pytest.mark.engines
def test_a_gang_that_cannot_get_all_its_nodes_waits_then_moves_and_never_starts_partly(cluster, tmp_path, gang_dataset_uri, one_process):
    """Three of the four nodes are drained: a gang of two waits in Slurm's queue (all its nodes
    or none), is cancelled at the pool's pending deadline, and runs whole on the next pool."""
    home = tmp_path / "home"
    catalog = _catalog(tmp_path, cluster)
    pools = yaml.safe_load(catalog.read_text())
    pools["pools"]["slurm-gang"]["pending_deadline_seconds"] = 8
    pools["pools"]["local-fallback"] = LOCAL_FALLBACK
    catalog.write_text(yaml.safe_dump(pools))
    for node in ("sgn1", "sgn2", "sgn3"):
        cluster.drain_node("test: out of service", node)
    try:
        meta = run_pretrain(home, catalog, pretrain_spec(gang_dataset_uri, nodes=2, ranks=1))
    finally:
        cluster.reset()
    ledger = read_ledger(Storage.at(str(home))).sort_values("attempt")
    assert [(r.pool, r.outcome, r.cause) for r in ledger.itertuples()] == [("slurm-gang", "refused", "refused"), ("local-fallback", "succeeded", "")]
    first_output = sorted((home / "state" / "pipes").rglob("output.log"))
    assert not any("a gang of" in p.read_text() for p in first_output)  # no rank of it ever started on Slurm
    assert meta["final_step"] > 0
    assert_close_weights(one_process, final_weights(home))
