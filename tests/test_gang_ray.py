"""A gang on Ray: a placement group of one bundle per node (STRICT_SPREAD), one actor per rank,
on a Ray cluster of two nodes on this machine (a head and a second raylet, as Ray's own tests
run several nodes on one host), started here for the module. The pretraining as 2 nodes × 2
ranks trains the model one process trains.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from control_plane.accounting.ledger import read_ledger
from testbed.ray_head import RayHead, add_worker_node, start_ray_head
from tests.fixtures.gang import (
    assert_close_weights,
    final_weights,
    pretrain_spec,
    run_pretrain,
)
from workload_runtime.storage import Storage

pytestmark = [pytest.mark.e2e, pytest.mark.engines]


@pytest.fixture(scope="module")
def two_node_ray() -> Iterator[tuple[RayHead, str]]:
    head = start_ray_head({"pool_gang": 1}, num_cpus=2, ip="127.0.0.2")
    try:
        worker = add_worker_node(head, num_cpus=2)
        yield head, worker
    finally:
        head.stop()


def test_a_gang_of_two_ray_nodes_trains_the_model_one_process_trains(two_node_ray, tmp_path, gang_dataset_uri, one_process):
    head, worker = two_node_ray
    pool = {
        "provider": "local", "region": "local", "backend": "ray", "purchasing": "on_demand", "accelerator": "local",
        "backend_settings": {"address": head.address, "resources": {"pool_gang": 1}, "gpu_resource": None},
        "gpus_per_node": 1, "nodes": 2, "price_per_gpu_hour": 1.0, "qualify": False,
    }  # fmt: skip
    catalog = tmp_path / "pools.yaml"
    catalog.write_text(yaml.safe_dump({"pools": {"ray-gang": pool}}))
    home = tmp_path / "home"
    meta = run_pretrain(home, catalog, pretrain_spec(gang_dataset_uri, nodes=2, ranks=2))
    log = Path(meta["workload_log"]).read_text()
    assert "a gang of 4 ranks on 2 Ray node(s): " in log and worker[:12] in log, log[-3000:]
    (row,) = read_ledger(Storage.at(str(home))).itertuples()
    assert (row.pool, row.backend, row.outcome, row.ranks) == ("ray-gang", "ray", "succeeded", 4)
    assert_close_weights(one_process, final_weights(home))
