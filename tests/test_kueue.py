"""Kubernetes pools enforce the team quotas with Kueue: the objects the quotas become, and the
labels on the pods and JobSets the backend creates.

The objects are checked against Kueue's `v1beta1` API (tests/kueue_api.py: a strict schema of its
four kinds, and with `KUEUE_CRDS` set, a Kueue release's own CRDs); the labels against the
`kubernetes` client's models and on what reaches the fake API server of
tests/engines/fake_kube_api.py. No real Kueue, API server or webhook runs here.

(No `from __future__ import annotations`: Dagster reads the assets' annotations.)
"""

import os
import re
import threading
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster_k8s.pipes import build_pod_body
from kubernetes.client import ApiClient

from control_plane.catalog.backends import settings_for
from control_plane.catalog.pools import PoolCatalogError, load_pools
from control_plane.catalog.quotas import QuotaCatalogError, load_quotas
from control_plane.compute.backends.kubernetes import KubernetesBackend
from control_plane.compute.backends.kubernetes_gang import jobset_for
from control_plane.compute.backends.kubernetes_pod import pod_spec_for
from control_plane.queues.kueue import (
    PRIORITY_LABEL,
    QUEUE_LABEL,
    KueueObjectsError,
    NoTeamOnKueuePool,
    kueue_manifests,
    kueue_objects,
    workload_labels,
)
from control_plane.settings import REPO_ROOT
from testbed.counting_step import counting_spec
from tests.engines.fake_kube_api import FakeKubeAPI, FakeNode
from tests.fixtures.gang import pretrain_spec
from tests.kueue_api import (
    DNS_LABEL,
    KUEUE_V1BETA1,
    LABEL_VALUE,
    check_against_crds,
    crd_schemas,
    fits_the_api,
    table_disagreements,
)
from workload_runtime.inputs import WorkloadInputs

IMAGE = "registry.example.com/sinewgrid/workload:test"
QUOTAS = {
    "teams": {"cell": {"members": ["cell", "lab-a", "lab-b"]}, "robotics": {"members": ["robotics"], "weight": 1.5}, "solo": {"members": ["solo"]}},
    "cohorts": {"fleet": {"teams": ["cell", "robotics"]}},
    "quotas": {
        "k8s-train": {"cell": {"gpus": 4, "lending_limit": 2}, "robotics": {"gpus": 2, "borrowing_limit": 2}, "solo": {"gpus": 1, "borrowing_limit": 3}},
        "k8s-eval": {"robotics": {"gpus": 2}},
        "slurm-big": {"cell": {"gpus": 64}},
    },
    "priority_classes": {"deadline": 1000, "training": 500, "sweep": 100},
    "default_priority": "training",
}  # fmt: skip


def _kube_pool(namespace: str, selector: dict, kubeconfig: str = "/kube/config", gpus_per_node: int = 4, nodes: int = 2, **settings) -> dict:
    return {
        "provider": "test", "region": "local", "backend": "kubernetes", "purchasing": "on_demand", "accelerator": "l4",
        "backend_settings": {"namespace": namespace, "node_selector": selector, "kubeconfig": kubeconfig, "poll_seconds": 0.2, **settings},
        "gpus_per_node": gpus_per_node, "nodes": nodes, "price_per_gpu_hour": 1.0, "runtimes": {"default": IMAGE}, "qualify": False,
    }  # fmt: skip


POOLS = {
    "k8s-train": _kube_pool("train", {"sinewgrid.test/pool": "train"}, kueue=True),
    "k8s-eval": _kube_pool("eval", {"sinewgrid.test/pool": "eval"}, gpus_per_node=1, gpu_resource="amd.com/gpu"),
    "slurm-big": {
        "provider": "test", "region": "local", "backend": "slurm", "backend_settings": {"partition": "gpu"}, "purchasing": "reserved",
        "accelerator": "h100-80gb", "gpus_per_node": 8, "nodes": 8, "price_per_gpu_hour": 2.0,
    },
}  # fmt: skip


def _write(folder: Path, name: str, doc: dict) -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture
def quotas_file(tmp_path, monkeypatch) -> Path:
    path = _write(tmp_path, "quotas.yaml", QUOTAS)
    monkeypatch.setenv("SINEWGRID_QUOTAS", str(path))
    return path


def _objects(tmp_path: Path, quotas: dict = QUOTAS, pools: dict = POOLS) -> list[dict]:
    return kueue_objects(load_quotas(_write(tmp_path, "q.yaml", quotas)), load_pools(_write(tmp_path, "p.yaml", {"pools": pools})))


def _named(objects: list[dict], kind: str, name: str, namespace: str | None = None) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name and o["metadata"].get("namespace") == namespace]
    return found


def _quota(cluster_queue: dict, pool: str) -> dict:
    (resource,) = [f["resources"][0] for g in cluster_queue["spec"]["resourceGroups"] for f in g["flavors"] if f["name"] == pool]
    return resource


# The objects ---------------------------------------------------------------------------------------
def test_the_quotas_become_kueues_objects(tmp_path):
    objects = _objects(tmp_path)
    kinds = [(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in objects]
    assert kinds == [
        ("ResourceFlavor", "k8s-train", None), ("ResourceFlavor", "k8s-eval", None),  # the Slurm pool is none of Kueue's
        ("ClusterQueue", "cell", None), ("ClusterQueue", "robotics", None), ("ClusterQueue", "solo", None), ("ClusterQueue", "fleet-unassigned", None),
        *[("LocalQueue", team, ns) for ns in ("train", "eval") for team in ("cell", "robotics", "solo")],
        ("WorkloadPriorityClass", "deadline", None), ("WorkloadPriorityClass", "training", None), ("WorkloadPriorityClass", "sweep", None),
    ]  # fmt: skip
    assert _named(objects, "ResourceFlavor", "k8s-train")["spec"] == {"nodeLabels": {"sinewgrid.test/pool": "train"}}
    cell, robotics, solo = (_named(objects, "ClusterQueue", t) for t in ("cell", "robotics", "solo"))
    # Nominal quotas, limits, one resource group per GPU resource name (one flavor per pool), the cohort, the weight.
    assert cell["spec"]["resourceGroups"] == [
        {"coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": "k8s-train", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4, "lendingLimit": 2}]}]},
        {"coveredResources": ["amd.com/gpu"], "flavors": [{"name": "k8s-eval", "resources": [{"name": "amd.com/gpu", "nominalQuota": 0}]}]},
    ]  # fmt: skip
    assert _quota(robotics, "k8s-train") == {"name": "nvidia.com/gpu", "nominalQuota": 2, "borrowingLimit": 2}
    assert _quota(robotics, "k8s-eval") == {"name": "amd.com/gpu", "nominalQuota": 2}
    assert (cell["spec"]["cohort"], robotics["spec"]["cohort"]) == ("fleet", "fleet")
    assert (cell["spec"]["fairSharing"], robotics["spec"]["fairSharing"]) == ({"weight": 1}, {"weight": "1.5"})
    # A team in no cohort neither lends nor borrows: no cohort, no limits (Kueue refuses them without one).
    assert "cohort" not in solo["spec"] and _quota(solo, "k8s-train") == {"name": "nvidia.com/gpu", "nominalQuota": 1}
    # What preempts what (docs/queues.md): reclaiming takes back from borrowers of any priority; within
    # a team a higher class preempts a lower; borrowing never preempts another team.
    assert cell["spec"]["preemption"] == {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority", "borrowWithinCohort": {"policy": "Never"}}
    assert cell["spec"]["queueingStrategy"] == "BestEffortFIFO" and cell["spec"]["namespaceSelector"] == {}
    # The GPU of k8s-train no team was given is the cohort's to borrow, held by a queue no LocalQueue names.
    holder = _named(objects, "ClusterQueue", "fleet-unassigned")
    assert holder["spec"]["cohort"] == "fleet" and "namespaceSelector" not in holder["spec"]
    assert (_quota(holder, "k8s-train")["nominalQuota"], _quota(holder, "k8s-eval")["nominalQuota"]) == (1, 0)
    assert _named(objects, "LocalQueue", "robotics", "eval")["spec"] == {"clusterQueue": "robotics"}
    assert {o["metadata"]["name"]: o["value"] for o in objects if o["kind"] == "WorkloadPriorityClass"} == QUOTAS["priority_classes"]
    for obj in objects:
        fits_the_api(obj)


def _production_example() -> tuple[str, str]:
    """The quotas and the objects docs/queues_kubernetes.md shows for deploy/pools/aws.yaml."""
    text = (REPO_ROOT / "docs" / "queues_kubernetes.md").read_text()
    quotas, rendered = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)[:2]
    return quotas, rendered


@pytest.mark.parametrize("catalog", ["aws.yaml", "gcp.yaml"])
def test_a_production_quotas_file_on_the_deploy_pools_fits_kueues_api(tmp_path, catalog):
    quotas = yaml.safe_load(_production_example()[0])
    pools = load_pools(REPO_ROOT / "deploy" / "pools" / catalog)
    if catalog == "gcp.yaml":  # the same teams on GCP's Kubernetes pool
        quotas["quotas"] = {"gcp-gke-g2-spot": {"cell": {"gpus": 48}, "robotics": {"gpus": 32, "borrowing_limit": 16}}}
    objects = kueue_objects(load_quotas(_write(tmp_path, "q.yaml", quotas)), pools)
    assert {o["metadata"]["name"] for o in objects if o["kind"] == "ResourceFlavor"} == {n for n, p in pools.items() if p.backend == "kubernetes"}
    for obj in objects:
        fits_the_api(obj)


def test_the_docs_example_is_what_the_code_renders(tmp_path):
    quotas, rendered = _production_example()
    manifests = kueue_manifests(load_quotas(_write(tmp_path, "quotas.yaml", yaml.safe_load(quotas))), load_pools(REPO_ROOT / "deploy" / "pools" / "aws.yaml"))
    assert list(yaml.safe_load_all(manifests)) == list(yaml.safe_load_all(rendered))
    assert manifests.startswith("# Kueue objects for the quotas of ") and "aws-eks-g6e-spot (sinewgrid)" in manifests.splitlines()[0]


def test_the_api_table_rejects_a_field_kueue_does_not_have(tmp_path):
    """The table is strict where the CRDs are not (an API server prunes unknown fields silently)."""
    cell = _named(_objects(tmp_path), "ClusterQueue", "cell")
    import jsonschema

    for broken in ({**cell, "spec": {**cell["spec"], "cohortName": "fleet"}}, {**cell, "spec": {**cell["spec"], "queueingStrategy": "FIFO"}}):
        with pytest.raises(jsonschema.ValidationError):
            fits_the_api(broken)


@pytest.mark.skipif(not os.environ.get("KUEUE_CRDS"), reason="KUEUE_CRDS names no Kueue release's config/components/crd/bases")
def test_the_objects_and_the_api_table_agree_with_kueues_crds(tmp_path):
    """Run with KUEUE_CRDS=<a Kueue checkout, v0.9 to v0.13>/config/components/crd/bases."""
    schemas = crd_schemas(Path(os.environ["KUEUE_CRDS"]))
    for kind, table in KUEUE_V1BETA1.items():
        assert table_disagreements(table, schemas[kind], kind) == []
    quotas = yaml.safe_load(_production_example()[0])
    for obj in [*_objects(tmp_path), *kueue_objects(load_quotas(_write(tmp_path, "aws.yaml", quotas)), load_pools(REPO_ROOT / "deploy" / "pools" / "aws.yaml"))]:
        check_against_crds(obj, schemas)


# What cannot be Kueue objects ------------------------------------------------------------------------
def test_names_kubernetes_refuses_are_named(tmp_path):
    quotas = {
        **QUOTAS,
        "teams": {**QUOTAS["teams"], "lab_a": {"members": ["lab-x"]}},
        "cohorts": {"Fleet": {"teams": ["cell", "robotics"]}},
        "priority_classes": {"deadline": 1000, "training": 500, "sweep": 100, "Best.Effort": 1},
    }
    pools = {**POOLS, "k8s_odd": _kube_pool("Team_NS", {"sinewgrid.test/pool": "odd"})}
    with pytest.raises(KueueObjectsError) as refused:
        _objects(tmp_path, quotas, pools)
    said = str(refused.value)
    for kind, name, fix in [
        ("team", "lab_a", "rename the team, e.g. `lab-a`"), ("cohort", "Fleet", "rename the cohort, e.g. `fleet`"),
        ("priority class", "Best.Effort", "rename the class, e.g. `best-effort`"), ("pool", "k8s_odd", "rename the pool, e.g. `k8s-odd`"),
        ("namespace", "Team_NS", "set `backend_settings.namespace` to one, e.g. `team-ns`"),
    ]:  # fmt: skip
        assert f"{kind} `{name}` names Kueue objects, and it is not a DNS-1123 label" in said and fix in said, (kind, said)
    assert "team `cell`" not in said and "pool `k8s-train`" not in said  # only the bad names


def test_quotas_kueue_could_not_hold_are_refused_with_the_fix(tmp_path):
    over = {**QUOTAS, "quotas": {**QUOTAS["quotas"], "k8s-eval": {"robotics": {"gpus": 3}}}}
    with pytest.raises(KueueObjectsError, match=r"nominal quotas on pool `k8s-eval` add up to 3 GPUs, more than its 2; lower them"):
        _objects(tmp_path, over)
    two_cohorts = {**QUOTAS, "cohorts": {"fleet": {"teams": ["cell", "robotics"]}, "side": {"teams": ["solo"]}}}
    with pytest.raises(KueueObjectsError, match=r"1 GPUs of pool `k8s-train` are given to no team, and the file has 2 cohorts \(fleet, side\).*give them to a team"):
        _objects(tmp_path, two_cohorts)
    overlapping = {**POOLS, "k8s-any": _kube_pool("train", {})}
    with pytest.raises(KueueObjectsError, match=r"pools `k8s-any` and `k8s-train`: every label of `k8s-any`'s `node_selector` \(none\) is also `k8s-train`'s"):
        _objects(tmp_path, QUOTAS, overlapping)
    with pytest.raises(KueueObjectsError, match="no pool with `backend: kubernetes`"):
        _objects(tmp_path, QUOTAS, {"slurm-big": POOLS["slurm-big"]})


def test_a_pool_names_one_way_to_queue(tmp_path):
    both = {"k8s-train": _kube_pool("train", {"a": "b"}, kueue=True, queue="gpu-team")}
    with pytest.raises(PoolCatalogError, match=r"`queue: gpu-team` and `kueue: true` both name the LocalQueue"):
        load_pools(_write(tmp_path, "p.yaml", {"pools": both}))


# The labels on the workloads ----------------------------------------------------------------------
def _v1pod(pod: dict):
    """The pod PipesK8sClient creates from `pod`, read back into the `kubernetes` client's V1Pod."""
    body = build_pod_body("dagster-run-0123", None, None, {"DAGSTER_PIPES_CONTEXT": "e30="}, pod["metadata"], pod["spec"])
    api = ApiClient()
    return api._ApiClient__deserialize(api.sanitize_for_serialization(body), "V1Pod")  # type: ignore[attr-defined]


def _valid_labels(labels: dict) -> None:
    for key, value in labels.items():
        assert len(value) <= 63 and LABEL_VALUE.match(value), f"label {key}={value!r} is no Kubernetes label value"


def test_a_pod_names_its_teams_local_queue_and_its_priority_class(tmp_path, quotas_file):
    pool = load_pools(_write(tmp_path, "p.yaml", {"pools": POOLS}))["k8s-train"]
    for tenant, priority, expected in [("lab-a", None, ("cell", "training")), ("robotics", "deadline", ("robotics", "deadline"))]:
        spec = counting_spec(tenant=tenant, priority_class=priority, gpus=2)
        pod = _v1pod(pod_spec_for(pool, spec, storage_root="s3://x", run_id="r", attempt=1))
        assert (pod.metadata.labels[QUEUE_LABEL], pod.metadata.labels[PRIORITY_LABEL]) == expected
        assert DNS_LABEL.match(pod.metadata.labels[QUEUE_LABEL]) and pod.spec.containers[0].resources.limits == {"nvidia.com/gpu": "2"}
        _valid_labels(pod.metadata.labels)
    # The Kueue labels only where the pool's Kueue enforces the quotas.
    plain = load_pools(_write(tmp_path, "p.yaml", {"pools": POOLS}))["k8s-eval"]
    labels = _v1pod(pod_spec_for(plain, counting_spec(tenant="lab-a"), storage_root="s3://x", run_id="r", attempt=1)).metadata.labels
    assert QUEUE_LABEL not in labels and PRIORITY_LABEL not in labels


def test_a_tenant_of_no_team_or_a_class_of_none_is_said_before_any_pod(tmp_path, quotas_file):
    pool = load_pools(_write(tmp_path, "p.yaml", {"pools": POOLS}))["k8s-train"]
    with pytest.raises(NoTeamOnKueuePool) as refused:
        workload_labels(pool, counting_spec(tenant="nobody"))
    assert all(w in str(refused.value) for w in ("pool k8s-train", "tenant `nobody`", str(quotas_file), "Add `nobody` or its lane to a team's `members`"))
    with pytest.raises(QuotaCatalogError, match=r"no priority class `urgent`.*name one of them"):
        workload_labels(pool, counting_spec(tenant="cell", priority_class="urgent"))


def test_a_gangs_jobset_carries_the_labels_and_its_pods_do_not(tmp_path, quotas_file):
    pool = load_pools(_write(tmp_path, "p.yaml", {"pools": POOLS}))["k8s-train"]
    spec = pretrain_spec("s3://data/omics", nodes=2, ranks=4).model_copy(update={"gpus": 8, "priority_class": "sweep"})
    jobset = jobset_for(pod_spec_for(pool, spec, storage_root="s3://x", run_id="r", attempt=1), spec, settings_for(pool), name="cell-fm-a1-abc123")
    assert (jobset["metadata"]["labels"][QUEUE_LABEL], jobset["metadata"]["labels"][PRIORITY_LABEL]) == ("cell", "sweep")
    _valid_labels(jobset["metadata"]["labels"])
    template = jobset["spec"]["replicatedJobs"][0]["template"]
    job = ApiClient()._ApiClient__deserialize(template, "V1JobTemplateSpec")  # type: ignore[attr-defined]
    assert not {QUEUE_LABEL, PRIORITY_LABEL} & set(job.spec.template.metadata.labels)  # Kueue admits the JobSet whole


# Through the fake API server: what the backend creates ------------------------------------------------
@pytest.fixture
def kube(tmp_path):
    with FakeKubeAPI([FakeNode(n, labels={"sinewgrid.test/pool": "train"}, gpus=4) for n in ("gpu-a", "gpu-b")]) as api:
        api.write_kubeconfig(tmp_path / "kubeconfig")
        yield api
    assert api.pods() == [] and api.jobsets() == [], "the attempts left pods or JobSets behind"


def _attempt(tmp_path: Path, kube: FakeKubeAPI, spec, **settings):
    """One attempt on a `kueue: true` pool of the fake cluster, refused at a 1 s pending deadline
    (nothing here admits it); the JobSets the API held while it waited."""
    fields = {**_kube_pool("train", {"sinewgrid.test/pool": "train"}, str(kube.kubeconfig), kueue=True, **settings), "pending_deadline_seconds": 1}
    pool = load_pools(_write(tmp_path, "pools.yaml", {"pools": {"k8s-train": fields}}))["k8s-train"]
    results, seen, done = [], [], threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.extend(js for js in kube.jobsets() if js["metadata"]["name"] not in {s["metadata"]["name"] for s in seen})
            done.wait(0.05)

    @dg.asset
    def kueue_attempt(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        results.append(KubernetesBackend().run_attempt(context, pool, spec, WorkloadInputs(storage_root=str(tmp_path / "home"))))
        return dg.MaterializeResult()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        assert dg.materialize([kueue_attempt], instance=dg.DagsterInstance.ephemeral()).success
    finally:
        done.set()
        watcher.join(5)
    (result,) = results
    return result, seen


def test_the_pod_the_backend_creates_names_its_teams_queue(tmp_path, quotas_file, kube):
    spec = counting_spec(tenant="robotics", gpus=8, priority_class="deadline")  # 8 GPUs: no node of 4 takes it; it waits
    result, _ = _attempt(tmp_path, kube, spec)
    assert result.outcome.value == "refused" and "still Pending after 1s" in result.log_tail, result.log_tail
    ((name, labels),) = kube.created.items()
    assert (labels[QUEUE_LABEL], labels[PRIORITY_LABEL], labels["sinewgrid.io/pool"]) == ("robotics", "deadline", "k8s-train"), name
    _valid_labels(labels)


def test_the_jobset_the_backend_creates_names_its_teams_queue(tmp_path, quotas_file, kube):
    for node in ("gpu-a", "gpu-b"):
        kube.node(node).unschedulable = True  # the gang waits unadmitted
    result, jobsets = _attempt(tmp_path, kube, pretrain_spec("unused", nodes=2, ranks=1))
    assert result.outcome.value == "refused" and "still pending after 1s" in result.log_tail, result.log_tail
    ((jobset),) = jobsets
    labels = jobset["metadata"]["labels"]
    assert (labels[QUEUE_LABEL], labels[PRIORITY_LABEL]) == ("cell", "training")  # lane cell's team; the catalog's default class
    assert QUEUE_LABEL not in jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["labels"]
    assert kube.created == {}


@pytest.mark.parametrize("gang", [False, True])
def test_a_step_of_no_team_is_refused_before_anything_is_created(tmp_path, quotas_file, kube, gang):
    spec = pretrain_spec("unused", nodes=2, ranks=1) if gang else counting_spec()
    result, jobsets = _attempt(tmp_path, kube, spec.model_copy(update={"tenant": "visitor"}))
    assert result.outcome.value == "refused" and result.exit_code is None
    assert "pool k8s-train enforces team quotas with Kueue" in result.log_tail and "tenant `visitor`" in result.log_tail
    assert kube.created == {} and jobsets == []
