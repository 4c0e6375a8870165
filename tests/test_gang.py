"""Gangs: a step that trains data-parallel as nodes × ranks, all of them or none.

The real pretraining workload runs as a gang of 2 nodes × 2 ranks on a local pool (one
`torchrun` per node, gloo on the CPU) through the compute resource, and is checked against the
same training on one process with the same global batch; a node killed mid-run takes its ranks
with it, the gang is relaunched and resumes from its sharded checkpoint to the same weights; a
gang's checkpoint resumes on another number of ranks.

(No `from __future__ import annotations`: Dagster reads the asset's annotations.)
"""

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

from control_plane.accounting.ledger import read_ledger
from control_plane.catalog.step_spec import StepSpec
from control_plane.compute.backends.gang import (
    AGENT_IMPORTS,
    GangProcess,
    free_port,
    kill_node,
    local_nodes,
    torchrun_command,
)
from control_plane.compute.cooldowns import SLOTS_ENV
from control_plane.compute.inflight import InFlight
from control_plane.compute.monitor import slow_rank
from drills.faults import CpuQuota, Injector
from drills.runner import STRAGGLER_DRILL_FACTOR
from tests.fixtures.gang import (
    EVERY,
    IMPORTS,
    PRETRAIN,
    STEPS,
    assert_close_weights,
    final_weights,
    pretrain_spec,
    run_pretrain,
)
from tests.helpers import WorkloadProcess
from workload_runtime.checkpoints import CheckpointStore
from workload_runtime.gang import member_from_env
from workload_runtime.inputs import Failpoint
from workload_runtime.messages import Telemetry
from workload_runtime.storage import Storage

e2e = pytest.mark.e2e  # runs the workload end to end, as a gang of processes


SPARE_POOL = """
  spare:
    provider: local
    region: local
    backend: local
    purchasing: on_demand
    accelerator: local
    gpus_per_node: 2
    nodes: 3
    price_per_gpu_hour: 2.0
    qualify: false
"""

CATALOG = """
pools:
  steady:
    provider: local
    region: local
    backend: local
    purchasing: reserved
    accelerator: local
    gpus_per_node: 2
    nodes: 3
    price_per_gpu_hour: 1.0
    qualify: false
"""


# Where a rank stands ----------------------------------------------------------------------------


def test_a_rank_reads_its_place_from_torchrun_or_srun():
    torchrun = member_from_env(
        {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "SINEWGRID_NODE": "n1"}
    )
    assert torchrun is not None and (torchrun.rank, torchrun.world_size, torchrun.local_rank, torchrun.node_rank, torchrun.nodes, torchrun.node) == (3, 4, 1, 1, 2, "n1")
    srun = member_from_env(
        {"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "1", "SLURM_NODEID": "2", "SLURMD_NODENAME": "node3", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    )
    assert srun is not None and (srun.rank, srun.world_size, srun.node_rank, srun.nodes, srun.node, srun.leader) == (2, 4, 2, 4, "node3", False)
    assert member_from_env({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is None  # a batch job of one task is no gang
    assert member_from_env({}) is None


def test_a_rank_without_a_meeting_point_says_what_to_set():
    with pytest.raises(RuntimeError, match=r"rank 1 of 2: MASTER_ADDR and MASTER_PORT are not set.*torchrun"):
        member_from_env({"RANK": "1", "WORLD_SIZE": "2"})


def test_a_step_is_a_gang_when_it_runs_as_more_than_one_process():
    step = StepSpec(name="s", entry_point="m", tenant="t", nodes=2, ranks_per_node=2)
    assert (step.world_size, step.gang) == (4, True)
    assert not StepSpec(name="s", entry_point="m", tenant="t", gpus=8).gang  # one process that uses its GPUs itself
    assert StepSpec(name="s", entry_point="m", tenant="t", nodes=2).world_size == 2


# Finding the one slow rank -----------------------------------------------------------------------


def _report(*seconds: float) -> Telemetry:
    return Telemetry(step=1, step_seconds=max(seconds), rank_seconds=list(seconds), nodes=["n0", "n0", "n1", "n1"])


def test_the_one_slow_rank_is_found_among_its_peers_and_named_with_its_node():
    slow = slow_rank([_report(0.02, 0.021, 0.02, 0.11)] * 3, factor=3.0, patience=3)
    assert slow is not None and (slow.rank, slow.node, slow.seconds, slow.peers) == (3, "n1", 0.11, 0.02)
    # A window in which the slow rank waited on a stalled peer (a busy machine) does not hide it.
    stalled = [_report(0.02, 0.021, 0.02, 0.11), _report(0.02, 0.021, 0.02, 0.02), _report(0.02, 0.021, 0.02, 0.11)]
    assert slow_rank(stalled, factor=3.0, patience=3).rank == 3  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "reports",
    [
        [_report(0.02, 0.021, 0.02, 0.11)] * 2,  # not yet `patience` reports
        [_report(0.02, 0.021, 0.02, 0.11), _report(0.02, 0.021, 0.02, 0.02), _report(0.02, 0.021, 0.02, 0.02)],  # one slow report in three
        [_report(0.02, 0.021, 0.02, 0.5), _report(0.02, 0.021, 0.02, 0.02), _report(0.02, 0.021, 0.02, 0.02)],  # one long stall: no straggler
        [_report(0.02, 0.021, 0.02, 0.05)] * 3,  # under the factor
        [_report(0.001, 0.001, 0.001, 0.008)] * 3,  # 8× but a few milliseconds: noise
        [_report(0.02, 0.021, 0.11, 0.11)] * 3,  # two slow ranks: a slow gang, not one rank
    ],
)
def test_no_rank_is_blamed_without_a_clear_case(reports):
    assert slow_rank(reports, factor=3.0, patience=3) is None


# The real workload as a gang ------------------------------------------------------------------------


def _materialize(home: Path, spec: StepSpec, catalog_text: str = CATALOG, logs: list[str] | None = None) -> dict:
    catalog = home.parent / "pools.yaml"
    catalog.write_text(catalog_text)
    return run_pretrain(home, catalog, spec, logs)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(SLOTS_ENV, str(tmp_path / "slots"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def gang_run(tmp_path_factory, gang_dataset_uri) -> tuple[Path, dict]:
    """One uninterrupted run of the 2 × 2 gang through the compute resource."""
    folder = tmp_path_factory.mktemp("gang")
    os.environ[SLOTS_ENV] = str(folder / "slots")
    try:
        meta = _materialize(folder / "home", pretrain_spec(gang_dataset_uri, nodes=2, ranks=2))
    finally:
        os.environ.pop(SLOTS_ENV, None)
    return folder / "home", meta


@e2e
def test_a_two_by_two_gang_trains_the_model_one_process_trains(gang_run, one_process):
    home, meta = gang_run
    assert meta["final_step"] == STEPS
    assert_close_weights(one_process, final_weights(home))
    (row,) = read_ledger(Storage.at(str(home))).itertuples()
    assert (row.pool, row.outcome) == ("steady", "succeeded")


@e2e
def test_a_killed_node_is_replaced_by_a_spare_and_the_gang_resumes_to_the_same_weights(home, tmp_path, gang_dataset_uri, gang_run):
    marker = tmp_path / "held.json"
    spec = pretrain_spec(gang_dataset_uri, nodes=2, ranks=2, failpoint=Failpoint(kind="hold", at_step=30, marker=str(marker)))
    killed: list[int] = []

    def kill_a_node_once_held() -> None:
        deadline = time.monotonic() + 300
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        (record,) = InFlight(Storage.at(str(home))).records()
        node1_pid = record["handle"]["info"]["nodes"][1][0]
        kill_node(node1_pid)  # the node and its ranks, without notice
        killed.append(node1_pid)

    killer = threading.Thread(target=kill_a_node_once_held, daemon=True)
    killer.start()
    logs: list[str] = []
    meta = _materialize(home, spec, logs=logs)
    killer.join(timeout=10)
    assert killed, "the node was never killed"
    ledger = read_ledger(Storage.at(str(home))).sort_values("attempt")
    # The default policy would move a preempted step to another pool; a gang with a spare node stays.
    assert [(r.pool, r.outcome, r.cause, r.node, r.ranks) for r in ledger.itertuples()] == [
        ("steady", "preempted", "lost-node", "steady-node1", 4),
        ("steady", "succeeded", "", "", 4),
    ]
    assert any("node steady-node1 (lost-node) is replaced by a spare" in line for line in logs)
    assert any("rank 0 of a gang of 4 ranks on 2 node(s): steady-node0, steady-node2" in line for line in logs)
    resumed_row = meta["recovery"].splitlines()[-1]  # the relaunched gang's row of the recovery timeline
    assert resumed_row.startswith("| 2 |") and "(20)" in resumed_row  # the last checkpoint before the kill at step 30
    uninterrupted, resumed = final_weights(gang_run[0]), final_weights(home)
    for name in uninterrupted:  # the same ranks, the same reductions: the same bits
        assert torch.equal(uninterrupted[name], resumed[name]), f"{name} differs after the node was replaced"


@e2e
def test_a_gang_checkpoint_resumes_on_one_process(tmp_path, gang_dataset_uri, one_process):
    """Two ranks write sharded checkpoints and are preempted at step 30; one process resumes."""
    extras = tmp_path / "extras.json"
    marker = tmp_path / "held.json"
    inputs = {
        "config": {"dataset_uri": gang_dataset_uri, "steps": STEPS, "seed": 3}, "checkpoint_uri": str(tmp_path / "ck"),
        "checkpoint_every_steps": EVERY, "failpoint": Failpoint(kind="hold", at_step=30, marker=str(marker)).model_dump(),
    }  # fmt: skip
    extras.write_text(json.dumps(inputs))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}
    spec = StepSpec(name="s", entry_point=PRETRAIN, tenant="cell", nodes=1, ranks_per_node=2)
    command = [*torchrun_command(sys.executable, spec, 0, free_port(), fork_ranks=True), "--extras", str(extras)]
    with (tmp_path / "gang.log").open("ab") as out:
        gang = GangProcess.start([command], ["local-node0"], env=env, cwd=str(Path(__file__).parents[1]), output=out, imports=[*AGENT_IMPORTS, *IMPORTS])
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert gang.poll() is None and time.monotonic() < deadline, (tmp_path / "gang.log").read_text()[-3000:]
            time.sleep(0.02)
        gang.send_signal(signal.SIGTERM)  # every rank checkpoints step 30 and exits 75
        gang.wait(timeout=120)
    store = CheckpointStore(str(tmp_path / "ck"))
    last = store.latest_valid()
    assert last is not None and (last.step, last.sharded) == (30, True), (tmp_path / "gang.log").read_text()[-3000:]

    resumed = WorkloadProcess(PRETRAIN, extras, "resumed", imports=IMPORTS)
    assert resumed.wait() == 0, resumed.tail()
    assert "(step 30)" in resumed.log.read_text()
    final = store.latest_valid()
    assert final is not None and final.final
    assert_close_weights(one_process, final.tensors["model"])


def _rank_process(home: Path, node: int, rank: int) -> psutil.Process:
    """The process of global rank `rank`, found under its node's agent (the in-flight record). The
    agent forks its ranks: each names itself `rank<N>` (workload_runtime/run_module.py)."""
    (record,) = InFlight(Storage.at(str(home))).records()
    agent = psutil.Process(record["handle"]["info"]["nodes"][node][0])
    (found,) = [p for p in agent.children(recursive=True) if p.name() == f"rank{rank}"]
    return found


@e2e
def test_one_slow_rank_is_named_with_its_node_and_that_node_is_replaced(home, tmp_path, gang_dataset_uri):
    marker = tmp_path / "held.json"
    failpoint = Failpoint(kind="hold", at_step=10, marker=str(marker))
    spec = pretrain_spec(gang_dataset_uri, nodes=2, ranks=1, failpoint=failpoint, on_straggler="replace", straggler_patience=3, straggler_factor=STRAGGLER_DRILL_FACTOR)
    throttles: list[CpuQuota] = []

    # A node with a failing fan: its rank computes at a fiftieth of the speed (~25x slower per step).
    # Millisecond steps on a busy two-core machine drift 4x apart on their own, so the detector is
    # set between the two, as the drills set it.
    def slow_down_rank_1() -> None:
        throttles.append(CpuQuota([_rank_process(home, node=1, rank=1).pid], share=0.02))

    injector = Injector(slow_down_rank_1, failpoint)
    injector.start()
    logs: list[str] = []
    try:
        meta = _materialize(home, spec, CATALOG + SPARE_POOL, logs)
    finally:
        injector.cancelled.set()
        for throttle in throttles:
            throttle.stop()
    assert injector.error is None and throttles, injector.error
    ledger = read_ledger(Storage.at(str(home))).sort_values("attempt")
    # The slow node is replaced by the pool's spare; the other pool is not needed.
    assert [(r.pool, r.outcome, r.cause, r.node) for r in ledger.itertuples()] == [("steady", "preempted", "straggler", "steady-node1"), ("steady", "succeeded", "", "")]
    (flagged,) = [line for line in logs if "straggler: rank" in line]
    assert "rank 1 on steady-node1 works" in flagged, flagged
    assert meta["final_step"] == STEPS


def test_a_local_pool_without_enough_nodes_refuses_the_gang_before_starting_any():
    from control_plane.catalog.pools import Pool
    from control_plane.compute.backends.local import LocalBackend
    from workload_runtime.inputs import WorkloadInputs

    pool = Pool(name="steady", provider="local", region="local", backend="local", purchasing="reserved", accelerator="local", gpus_per_node=1, nodes=3, price_per_gpu_hour=1.0)
    spec = StepSpec(name="s", entry_point="m", tenant="t", nodes=2, ranks_per_node=2, exclude_nodes=["steady-node0", "steady-node2"])
    assert local_nodes(pool, spec) == ["steady-node1"]
    result = LocalBackend().run_attempt(None, pool, spec, WorkloadInputs())  # type: ignore[arg-type]  # refused before it needs a context
    assert result.outcome.value == "refused" and "steady has 3 nodes, 2 of them replaced; the gang needs 2" in result.log_tail


def test_a_backend_that_cannot_start_a_gang_whole_refuses_it_so_it_moves():
    from control_plane.catalog.pools import Pool
    from control_plane.compute.backends.base import Backend

    class OneProcessOnly(Backend):  # every backend here starts gangs now (Kubernetes as a JobSet); a new one may not yet
        kind = "one-process"
        run_attempt = status = signal = cancel = None  # type: ignore[assignment]

    pool = Pool(
        name="p", provider="local", region="local", backend="local", purchasing="on_demand", accelerator="local",
        gpus_per_node=1, nodes=4, price_per_gpu_hour=1.0,
    )  # fmt: skip
    gang = StepSpec(name="s", entry_point="m", tenant="t", nodes=2, ranks_per_node=1)
    result = OneProcessOnly().gang_refusal(pool, gang)
    assert result is not None and result.outcome.value == "refused"
    assert "p (one-process) does not start gangs yet: s needs 2 node(s) × 1 rank(s)" in result.log_tail
    assert OneProcessOnly().gang_refusal(pool, StepSpec(name="s", entry_point="m", tenant="t")) is None


def test_a_pool_counts_its_spares_once_per_replaced_node():
    from control_plane.catalog.pools import Pool
    from control_plane.compute.recovery import Action, Decision
    from shared_resources.compute import PoolChooser

    pool = Pool(name="big", provider="local", region="local", backend="local", purchasing="reserved", accelerator="local", gpus_per_node=1, nodes=5, price_per_gpu_hour=1.0)
    chooser = PoolChooser.__new__(PoolChooser)  # only its node bookkeeping is used here
    chooser.replaced, chooser.excluded, chooser.again = {}, set(), None
    chooser.drains = chooser.cooldowns = None
    gang = StepSpec(name="s", entry_point="m", tenant="t", nodes=2, ranks_per_node=1)
    assert chooser.spare_nodes(gang, pool) == 3
    chooser.apply(Decision(Action.retry, replace_node="big-node1"), pool)
    running = chooser.spec_on(gang, pool)  # what the next attempt runs as
    assert running.exclude_nodes == ["big-node1"] and chooser.spec_on(running, pool).exclude_nodes == ["big-node1"]
    assert chooser.spare_nodes(running, pool) == chooser.spare_nodes(gang, pool) == 2
    assert chooser.spare_nodes(StepSpec(name="s", entry_point="m", tenant="t"), pool) == 0  # one process has no spares
