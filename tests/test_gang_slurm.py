"""A gang on Slurm: `srun` starts every rank inside the batch job, the ranks meet at the first
node's address, and the pretraining trains the model one process trains. On the suite's
single-node cluster the gang is 1 node × 2 ranks; the batch script of a multi-node gang is
checked as text.
"""

import dagster as dg
import pytest

from shared_resources.accounting.ledger import read_ledger
from shared_resources.compute.backends.engine import Launch
from shared_resources.compute.backends.slurm import render_batch_script
from shared_resources.compute.resource import ComputeResource
from shared_resources.runtime.storage import Storage
from tests.test_gang import _assert_close, _final_weights, _pretrain, _spec, dataset_uri, one_process  # noqa: F401 (fixtures)
from tests.test_slurm_backend import _catalog


def test_a_gang_batch_script_starts_every_rank_with_srun(tmp_path, slurm_pool_for_text):
    launch = Launch(name="cell.foundation_model-a1-0123abcd", command=["/opt/venv/bin/python", "-m", "cell_lane.workloads.pretrain"], env={}, workdir="/srv", output_path="/shared/out.log")
    script = render_batch_script(slurm_pool_for_text, _spec("unused", nodes=4, ranks=8).model_copy(update={"gpus": 32}), launch)
    directives = [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]
    assert {"--nodes=4", "--ntasks-per-node=8", "--gres=gpu:8"} <= set(directives)
    assert "export MASTER_ADDR=$(scontrol show node" in script and "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))" in script
    assert script.rstrip().endswith("exec srun --kill-on-bad-exit=1 --ntasks-per-node=8 /opt/venv/bin/python -m cell_lane.workloads.pretrain")


def test_one_process_steps_keep_their_plain_batch_script(slurm_pool_for_text):
    launch = Launch(name="x", command=["python", "-m", "m"], env={}, workdir="/srv", output_path="/shared/out.log")
    script = render_batch_script(slurm_pool_for_text, _spec("unused", nodes=1, ranks=1), launch)
    assert "exec srun" not in script and "export MASTER_ADDR" not in script and script.rstrip().endswith("exec python -m m")


@pytest.fixture
def slurm_pool_for_text():
    from shared_resources.catalog.pools import Pool

    return Pool(
        name="hpc", provider="campus", region="eu", backend="slurm", backend_settings={"partition": "a100"},
        purchasing="reserved", accelerator="a100-80gb", gpus_per_node=8, nodes=8, price_per_gpu_hour=1.0,
    )  # fmt: skip


@pytest.mark.e2e
def test_a_gang_on_slurm_trains_the_model_one_process_trains(slurm, tmp_path, dataset_uri, one_process):
    home = tmp_path / "home"
    catalog = _catalog(tmp_path, slurm, "gpu")
    result = dg.materialize(
        [_pretrain(_spec(dataset_uri, nodes=1, ranks=2))],
        resources={"compute": ComputeResource(storage_root=str(home), pools_file=str(catalog))},
        instance=dg.DagsterInstance.ephemeral(),
    )
    (mat,) = result.asset_materializations_for_node("foundation")
    log = open(mat.metadata["workload_log"].value).read()
    assert "a gang of 2 ranks" in log, log[-3000:]
    (row,) = read_ledger(Storage.at(str(home))).itertuples()
    assert (row.pool, row.backend, row.outcome) == ("slurm-gpu", "slurm", "succeeded")
    _assert_close(one_process, _final_weights(home))
