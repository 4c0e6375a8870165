"""A gang on Kubernetes: one JobSet of indexed pods, all of them or none.

The JobSet's pod template is checked against the official `kubernetes` client models; the gangs
run for real (the pretraining, 2 nodes × 1 rank, gloo) through the backend and the fake API
server of tests/engines/fake_kube_api.py, whose JobSet controller admits all of a JobSet's pods
or none (as Kueue does), stands in for cluster DNS and runs each pod as local processes. No real
API server, JobSet controller, Kueue or network runs here (docs/gangs.md, "Kubernetes").

(No `from __future__ import annotations`: Dagster reads the asset's annotations.)
"""

import json
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import torch
import yaml
from kubernetes.client import ApiClient

from control_plane.accounting.ledger import read_ledger
from control_plane.catalog.backends import settings_for
from control_plane.catalog.pools import Pool
from control_plane.compute.backends.kubernetes import KubernetesBackend
from control_plane.compute.backends.kubernetes_gang import (
    INDEX_LABEL,
    JOBSET_LABEL,
    jobset_for,
    master_port,
)
from control_plane.compute.backends.kubernetes_pod import pod_spec_for
from drills.faults import Injector
from tests.engines.fake_kube_api import FakeKubeAPI, FakeNode
from tests.fixtures.gang import (
    STEPS,
    assert_close_weights,
    final_weights,
    pretrain_spec,
    run_pretrain,
)
from workload_runtime.inputs import Failpoint, WorkloadInputs
from workload_runtime.storage import Storage

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

IMAGE = "registry.example.com/sinewgrid/workload:test"
GANG_NODES = ["gpu-a", "gpu-b", "gpu-c"]  # a gang of two and one spare


def _pool_fields(kubeconfig: str, **settings) -> dict:
    return {
        "provider": "test", "region": "local", "backend": "kubernetes",
        "backend_settings": {"namespace": "training", "node_selector": {"sinewgrid.test/pool": "gang"}, "kubeconfig": kubeconfig, "poll_seconds": 0.2, **settings},
        "purchasing": "reserved", "accelerator": "l4", "gpus_per_node": 1, "nodes": 3, "price_per_gpu_hour": 1.0,
        "runtimes": {"default": IMAGE}, "qualify": False,
    }  # fmt: skip


def _catalog(folder: Path, api: FakeKubeAPI, **fields) -> Path:
    path = folder / "pools.yaml"
    path.write_text(yaml.safe_dump({"pools": {"k8s-gang": {**_pool_fields(str(api.kubeconfig)), **fields}}}))
    return path


@pytest.fixture
def kube(tmp_path) -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI([FakeNode(n, labels={"sinewgrid.test/pool": "gang"}) for n in GANG_NODES]) as api:
        api.write_kubeconfig(tmp_path / "kubeconfig")
        yield api
    assert api.pods() == [] and api.jobsets() == [], "the attempts left pods or JobSets behind"


# The JobSet --------------------------------------------------------------------------------------
def test_a_jobsets_rendezvous_port_is_never_an_ephemeral_one():
    """Pods sharing a node's network (here: every pod) must not find rank 0's port taken by an
    outgoing connection, whose port the kernel picks from 32768-60999."""
    low, high = (int(p) for p in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = {master_port(f"cell-foundation-model-a{i}-{i:06x}") for i in range(2000)}
    assert all(20000 <= p < min(low, 32768) for p in ports) and high >= low
    assert len(ports) > 1500  # spread: two gangs rarely pick the same one


def test_a_gang_is_one_jobset_of_indexed_pods_whose_template_the_kubernetes_models_accept():
    pool = Pool(name="k8s-gang", **_pool_fields("/kube/config", queue="team-a"))
    spec = pretrain_spec("s3://data/omics", nodes=4, ranks=8).model_copy(update={"gpus": 32, "exclude_nodes": ["gpu-x"]})
    pod = pod_spec_for(pool, spec, storage_root="s3://sinewgrid", run_id="run-1", attempt=2)
    jobset = jobset_for(pod, spec, settings_for(pool), name="cell-foundation-model-a2-abc123", env={"DAGSTER_PIPES_CONTEXT": "e30="})

    assert (jobset["apiVersion"], jobset["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert jobset["spec"]["failurePolicy"] == {"maxRestarts": 0} and jobset["spec"]["successPolicy"] == {"operator": "All"}
    assert jobset["spec"]["network"] == {"enableDNSHostnames": True}
    (replicated,) = jobset["spec"]["replicatedJobs"]
    api = ApiClient()
    job = api._ApiClient__deserialize(json.loads(json.dumps(replicated["template"])), "V1JobTemplateSpec")  # type: ignore[attr-defined]
    assert api.sanitize_for_serialization(job) == replicated["template"], "a field the Kubernetes models do not know"
    assert (job.spec.completion_mode, job.spec.parallelism, job.spec.completions, job.spec.backoff_limit) == ("Indexed", 4, 4, 0)

    template = job.spec.template.spec
    (container,) = template.containers
    host, port = "cell-foundation-model-a2-abc123-nodes-0-0.cell-foundation-model-a2-abc123", master_port("cell-foundation-model-a2-abc123")
    assert container.command == [
        "python", "-m", "torch.distributed.run", "--nnodes=4", "--node-rank=$(JOB_COMPLETION_INDEX)", "--nproc-per-node=8",
        f"--master-addr={host}", f"--master-port={port}", "--max-restarts=0", "--monitor-interval=0.2", "-m", "cell_lane.workloads.pretrain",
    ]  # fmt: skip
    assert container.image == IMAGE and container.resources.limits == {"nvidia.com/gpu": "8"}  # per node
    env = {e.name: e for e in container.env}
    assert env["SINEWGRID_NODE"].value_from.field_ref.field_path == "spec.nodeName" and env["DAGSTER_PIPES_CONTEXT"].value == "e30="
    assert template.node_selector == {"sinewgrid.test/pool": "gang"} and template.restart_policy == "Never"
    (spread,) = template.affinity.pod_anti_affinity.required_during_scheduling_ignored_during_execution
    assert spread.topology_key == "kubernetes.io/hostname" and spread.label_selector.match_labels == {JOBSET_LABEL: "cell-foundation-model-a2-abc123"}
    (term,) = template.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    assert [(f.key, f.operator, f.values) for f in term.match_fields] == [("metadata.name", "NotIn", ["gpu-x"])]


# Gangs through the fake API server -----------------------------------------------------------------
@pytest.fixture(scope="module")
def k8s_gang_run(tmp_path_factory, gang_dataset_uri) -> Iterator[tuple[Path, dict, list[str]]]:
    """One uninterrupted 2 × 1 gang on the Kubernetes pool."""
    folder = tmp_path_factory.mktemp("k8s-gang")
    with FakeKubeAPI([FakeNode(n, labels={"sinewgrid.test/pool": "gang"}) for n in GANG_NODES]) as api:
        api.write_kubeconfig(folder / "kubeconfig")
        logs: list[str] = []
        meta = run_pretrain(folder / "home", _catalog(folder, api), pretrain_spec(gang_dataset_uri, nodes=2, ranks=1), logs)
        assert api.pods() == [] and api.jobsets() == []
    yield folder / "home", meta, logs


def test_a_two_node_jobset_trains_the_model_one_process_trains(k8s_gang_run, one_process):
    home, meta, logs = k8s_gang_run
    assert meta["final_step"] == STEPS
    (row,) = read_ledger(Storage.at(str(home))).itertuples()
    assert (row.pool, row.backend, row.outcome, row.ranks) == ("k8s-gang", "kubernetes", "succeeded", 2)
    # Rank 0 names every rank's node (SINEWGRID_NODE, from the downward API): one pod per node.
    assert any("rank 0 of a gang of 2 ranks on 2 node(s): gpu-a, gpu-b" in line for line in logs), [line for line in logs if "gang" in line]
    assert_close_weights(one_process, final_weights(home))


def test_a_gang_the_cluster_cannot_place_whole_creates_no_pod_and_is_refused(kube, tmp_path):
    """Two of the three nodes are cordoned: the JobSet waits unadmitted, no pod of it is ever
    created, and at the pool's pending deadline it is deleted and the pool refuses the step."""
    for name in ("gpu-b", "gpu-c"):
        kube.node(name).unschedulable = True
    pool = Pool(name="k8s-gang", **{**_pool_fields(str(kube.kubeconfig)), "pending_deadline_seconds": 2})
    spec = pretrain_spec("unused", nodes=2, ranks=1)
    results = []

    @dg.asset
    def gang_attempt(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        results.append(KubernetesBackend().run_attempt(context, pool, spec, WorkloadInputs(storage_root=str(tmp_path / "home"))))
        return dg.MaterializeResult()

    assert dg.materialize([gang_attempt], instance=dg.DagsterInstance.ephemeral()).success
    (result,) = results
    assert result.outcome.value == "refused" and result.exit_code is None, result.log_tail
    assert "all or nothing: 1 of 3 nodes can take a pod of it and it needs 2 at once" in result.log_tail and "2 node(s) were unschedulable" in result.log_tail
    assert "still pending after 2s" in result.log_tail
    assert kube.created == {}, "a pod of a gang that could not start whole was created"


def test_a_lost_node_is_cordoned_and_the_gang_resumes_on_the_spare_to_the_same_weights(kube, tmp_path, gang_dataset_uri, k8s_gang_run):
    """Rank 1's node crashes at step 30 (every process of its pod killed): the JobSet fails, the
    node is cordoned, and the gang is created again on the same pool, on the spare, resuming from
    the step-20 checkpoint to the weights of the uninterrupted gang."""
    home, marker = tmp_path / "home", tmp_path / "held.json"
    failpoint = Failpoint(kind="hold", at_step=30, marker=str(marker))
    lost: list[str] = []

    def crash_rank_1s_node() -> None:
        (pod,) = kube.pods({INDEX_LABEL: "1"})
        lost.append(pod["spec"]["nodeName"])
        assert kube.lose_node(lost[0]) == [pod["metadata"]["name"]]

    injector = Injector(crash_rank_1s_node, failpoint, release=False)
    injector.start()
    logs: list[str] = []
    try:
        meta = run_pretrain(home, _catalog(tmp_path, kube), pretrain_spec(gang_dataset_uri, nodes=2, ranks=1, failpoint=failpoint), logs)
    finally:
        injector.cancelled.set()
    assert injector.error is None and lost == ["gpu-b"], injector.error
    ledger = read_ledger(Storage.at(str(home))).sort_values("attempt")
    assert [(r.pool, r.outcome, r.cause, r.node, r.ranks) for r in ledger.itertuples()] == [
        ("k8s-gang", "preempted", "lost-node", "gpu-b", 2),
        ("k8s-gang", "succeeded", "", "", 2),
    ]
    assert ledger.iloc[0].lost_seconds > 0
    assert kube.node("gpu-b").unschedulable and "lost-node" in kube.node("gpu-b").annotations["sinewgrid.io/cordoned"]
    assert any("rank 0 of a gang of 2 ranks on 2 node(s): gpu-a, gpu-c" in line for line in logs)
    resumed_row = meta["recovery"].splitlines()[-1]
    assert resumed_row.startswith("| 2 |") and "(20)" in resumed_row, meta["recovery"]
    uninterrupted, resumed = final_weights(k8s_gang_run[0]), final_weights(home)
    for name in uninterrupted:  # the same ranks, the same reductions: the same bits
        assert torch.equal(uninterrupted[name], resumed[name]), f"{name} differs after the node was replaced"
