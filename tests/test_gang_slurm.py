"""A gang on Slurm: `srun` starts every rank inside the batch job, the ranks meet at the first
node's address, and the pretraining trains the model one process trains. The cluster has four
nodes, each `slurmd` in a network namespace of its own with its own address on a bridge
(`testbed/slurm_multinode.py`, started here: about a second), so the gang of 4 nodes × 1 rank
talks across real interfaces. The batch script of a gang is also checked as text.
"""

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml

from shared_resources.accounting.ledger import read_ledger
from shared_resources.compute.backends.engine import Launch
from shared_resources.compute.backends.slurm import render_batch_script
from shared_resources.compute.resource import ComputeResource
from shared_resources.runtime.storage import Storage
from testbed.slurm_multinode import PARTITION, MultiNodeSlurmCluster
from tests.fixtures.gang import (
    assert_close_weights,
    final_weights,
    pretrain_asset,
    pretrain_spec,
)


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
    assert "export MASTER_ADDR=$(scontrol show node" in script and "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))" in script
    assert script.rstrip().endswith("exec srun --kill-on-bad-exit=1 --ntasks-per-node=8 /opt/venv/bin/python -m cell_lane.workloads.pretrain")


def test_one_process_steps_keep_their_plain_batch_script(slurm_pool_for_text):
    launch = Launch(name="x", command=["python", "-m", "m"], env={}, workdir="/srv", output_path="/shared/out.log")
    script = render_batch_script(slurm_pool_for_text, pretrain_spec("unused", nodes=1, ranks=1), launch)
    assert "exec srun" not in script and "export MASTER_ADDR" not in script and script.rstrip().endswith("exec python -m m")


@pytest.fixture
def slurm_pool_for_text():
    from shared_resources.catalog.pools import Pool

    return Pool(
        name="hpc", provider="campus", region="eu", backend="slurm", backend_settings={"partition": "a100"},
        purchasing="reserved", accelerator="a100-80gb", gpus_per_node=8, nodes=8, price_per_gpu_hour=1.0,
    )  # fmt: skip


@pytest.mark.e2e
@pytest.mark.engines
def test_a_gang_of_four_slurm_nodes_trains_the_model_one_process_trains(cluster, tmp_path, gang_dataset_uri, one_process):
    home = tmp_path / "home"
    catalog = _catalog(tmp_path, cluster)
    result = dg.materialize(
        [pretrain_asset(pretrain_spec(gang_dataset_uri, nodes=4, ranks=1))],
        resources={"compute": ComputeResource(storage_root=str(home), pools_file=str(catalog))},
        instance=dg.DagsterInstance.ephemeral(),
    )
    (mat,) = result.asset_materializations_for_node("foundation")
    log = Path(mat.metadata["workload_log"].value).read_text()
    assert "a gang of 4 ranks on sgn[0-3]; rank 0 listens on " + cluster.addresses["sgn0"] in log, log[-3000:]
    (row,) = read_ledger(Storage.at(str(home))).itertuples()
    assert (row.pool, row.backend, row.outcome) == ("slurm-gang", "slurm", "succeeded")
    assert_close_weights(one_process, final_weights(home))
