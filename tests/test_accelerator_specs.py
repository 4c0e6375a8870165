"""What the Kubernetes backend asks real clusters for, per accelerator family: device resources,
node selectors, and Kueue's topology-aware scheduling (TAS) annotations on a gang's pod template;
and the Kueue `Topology` a pool with a domain label gets.

The expectations are written out from the vendors' and Kueue's documentation (never computed with
control_plane/compute/backends/kubernetes_devices.py): GKE's `google.com/tpu` and
`cloud.google.com/gke-tpu-*` labels, EKS's `aws.amazon.com/neuron` and `vpc.amazonaws.com/efa`,
ROCm's `amd.com/gpu`, Kueue's `kueue.x-k8s.io/podset-*` annotations. Every pod goes through the
`kubernetes` client's `V1Pod` (the JobSet's through `V1JobTemplateSpec`), every Kueue object through
tests/kueue_api.py (and a release's CRDs when KUEUE_CRDS names them). No real cluster, GKE, EKS or
Kueue runs here: one JobSet goes through the fake API server of tests/engines/fake_kube_api.py.
"""

import json
import os
import re
from pathlib import Path

import kubernetes
import pytest
import yaml
from dagster_k8s.pipes import build_pod_body
from kubernetes.client import ApiClient, CustomObjectsApi

from control_plane.catalog.backends import settings_for
from control_plane.catalog.pools import Pool, load_catalog
from control_plane.catalog.quotas import load_quotas
from control_plane.catalog.step_spec import StepSpec
from control_plane.compute.backends.kubernetes_gang import GROUP, PLURAL, VERSION, jobset_for
from control_plane.compute.backends.kubernetes_pod import pod_spec_for
from control_plane.queues.kueue import KueueObjectsError, kueue_objects
from control_plane.settings import REPO_ROOT
from tests.engines.fake_kube_api import FakeKubeAPI, FakeNode
from tests.kueue_api import check_against_crds, crd_schemas, fits_the_api

POOLS = load_catalog(REPO_ROOT / "deploy" / "pools").pools
TPU, TRN2, AMD, NVIDIA = "gcp-gke-tpu-v5p-spot", "aws-eks-trn2-ondemand", "oci-oke-mi300x-ondemand", "aws-eks-g6e-spot"
RUNS_ON = {"tpu": {"tpu": 1.0}, "trainium": {"trainium": 1.0}, "amd": {"amd": 1.0}, "nvidia": None}
REQUIRED, PREFERRED = "kueue.x-k8s.io/podset-required-topology", "kueue.x-k8s.io/podset-preferred-topology"
SLICE_REQUIRED, SLICE_SIZE = "kueue.x-k8s.io/podset-slice-required-topology", "kueue.x-k8s.io/podset-slice-size"
GKE_TPU = {"cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice", "cloud.google.com/gke-tpu-topology": "4x4x4"}
# A qualified name (label key, extended resource): an optional DNS-subdomain prefix and a name of at most 63.
QUALIFIED = re.compile(r"^(([a-z0-9]([-a-z0-9]*[a-z0-9])?)(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


def _step(pool: Pool, *, nodes: int = 1, gang: bool = False, **fields) -> StepSpec:
    """A training step for `pool`'s family: `nodes` nodes holding all their devices."""
    return StepSpec(
        name="cell.foundation_model", entry_point="cell_lane.workloads.pretrain", tenant="cell", gpus=nodes * pool.gpus_per_node,
        nodes=nodes, ranks_per_node=pool.gpus_per_node if gang else None, runs_on=RUNS_ON[pool.family], **fields,
    )  # fmt: skip


def _spanning(pool: Pool, nodes: int) -> StepSpec:
    return _step(pool, nodes=nodes, gang=True, tightly_coupled=True, span_domains=True, allreduce_gb=2.0, compute_seconds_per_step=1.0)


def _v1pod(pod: dict) -> dict:
    """The pod PipesK8sClient creates from `pod`, after a round trip through the client's V1Pod
    (a field the models lack fails the comparison); its names checked as Kubernetes checks them."""
    body = build_pod_body("dagster-run-0123", None, None, {"DAGSTER_PIPES_CONTEXT": "e30="}, pod["metadata"], pod["spec"])
    api = ApiClient()
    serialized = api.sanitize_for_serialization(body)
    reparsed = api._ApiClient__deserialize(json.loads(json.dumps(serialized)), "V1Pod")  # type: ignore[attr-defined]
    assert api.sanitize_for_serialization(reparsed) == serialized
    _names_kubernetes_takes(serialized)
    return serialized


def _names_kubernetes_takes(pod: dict) -> None:
    for container in pod["spec"]["containers"]:
        for resource, quantity in ((container.get("resources") or {}).get("limits") or {}).items():
            prefix = resource.partition("/")[0]
            assert "/" in resource and QUALIFIED.match(resource) and len(prefix) <= 253, f"{resource}: not an extended resource name"
            assert not (prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io") or prefix == "requests"), f"{resource}: a reserved prefix"
            assert quantity.isdigit() and int(quantity) > 0, f"{resource}: {quantity} (extended resources are whole numbers)"
    for key, value in (pod["spec"].get("nodeSelector") or {}).items():
        assert QUALIFIED.match(key) and LABEL_VALUE.match(value), f"node selector {key}={value!r}"
    for key in (REQUIRED, PREFERRED, SLICE_REQUIRED):  # Kueue validates these values as label names
        if key in pod["metadata"].get("annotations", {}):
            assert QUALIFIED.match(pod["metadata"]["annotations"][key]), key


def _jobset(pool: Pool, spec: StepSpec) -> tuple[dict, dict]:
    """The JobSet of the gang `spec` on `pool`, and its pod template read back through V1JobTemplateSpec."""
    jobset = jobset_for(pod_spec_for(pool, spec, storage_root="s3://x", run_id="r", attempt=1), spec, settings_for(pool), name="cell-fm-a1-abc123")
    (replicated,) = jobset["spec"]["replicatedJobs"]
    api = ApiClient()
    job = api._ApiClient__deserialize(json.loads(json.dumps(replicated["template"])), "V1JobTemplateSpec")  # type: ignore[attr-defined]
    assert api.sanitize_for_serialization(job) == replicated["template"], "a field the Kubernetes models do not know"
    template = replicated["template"]["spec"]["template"]
    assert api.sanitize_for_serialization(api._ApiClient__deserialize(template, "V1PodTemplateSpec")) == template  # type: ignore[attr-defined]
    _names_kubernetes_takes(template)
    return jobset, template


def _limits(pod: dict) -> dict:
    return pod["spec"]["containers"][0]["resources"]["limits"]


def _tas(pod: dict) -> dict:
    return {k: v for k, v in pod["metadata"].get("annotations", {}).items() if k.startswith("kueue.x-k8s.io/podset-")}


# One pod per family --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("pool_name", "limits", "selector"),
    [
        # GKE: a multi-host slice's pod asks for all 4 chips of its host, on nodes of the slice's type and shape.
        (TPU, {"google.com/tpu": "4"}, {**GKE_TPU, "cloud.google.com/gke-spot": "true"}),
        # EKS: the Neuron device plugin's chips, and the EFA device plugin's interfaces (16 on trn2).
        (TRN2, {"aws.amazon.com/neuron": "16", "vpc.amazonaws.com/efa": "16"}, {"node.kubernetes.io/instance-type": "trn2u.48xlarge"}),
        (AMD, {"amd.com/gpu": "8"}, {"node.kubernetes.io/instance-type": "BM.GPU.MI300X.8"}),
        (NVIDIA, {"nvidia.com/gpu": "4"}, {"eks.amazonaws.com/capacityType": "SPOT", "node.kubernetes.io/instance-type": "g6e.12xlarge"}),
    ],
)
def test_a_pod_asks_for_its_familys_devices_on_its_familys_nodes(pool_name, limits, selector):
    pool = POOLS[pool_name]
    pod = _v1pod(pod_spec_for(pool, _step(pool, tightly_coupled=True), storage_root="s3://x", run_id="r", attempt=1))
    assert _limits(pod) == limits and pod["spec"]["nodeSelector"] == selector
    assert _tas(pod) == {}  # one pod is no gang: nothing for Kueue to keep together
    assert pod["spec"]["tolerations"] == pool.backend_settings["tolerations"]


def test_the_pools_own_selector_wins_over_the_accelerators():
    pool = POOLS[TPU]
    mine = pool.model_copy(update={"backend_settings": {**pool.backend_settings, "node_selector": {"cloud.google.com/gke-tpu-topology": "8x8x8"}}})
    pod = _v1pod(pod_spec_for(mine, _step(mine), storage_root="s3://x", run_id="r", attempt=1))
    assert pod["spec"]["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice", "cloud.google.com/gke-tpu-topology": "8x8x8"}


def test_an_explicit_gpu_resource_still_wins():
    trn2 = POOLS[TRN2]
    cores = trn2.model_copy(update={"backend_settings": {**trn2.backend_settings, "gpu_resource": "aws.amazon.com/neuroncore"}})
    assert _limits(_v1pod(pod_spec_for(cores, _step(cores), storage_root="s3://x", run_id="r", attempt=1))) == {
        "aws.amazon.com/neuroncore": "16", "vpc.amazonaws.com/efa": "16",
    }  # fmt: skip
    _, template = _jobset(cores, _step(cores, nodes=4, gang=True, tightly_coupled=True))
    assert _limits(template) == {"aws.amazon.com/neuroncore": "16", "vpc.amazonaws.com/efa": "16"}


def test_a_pod_holding_part_of_a_node_asks_for_its_share_of_the_efa_interfaces():
    trn2 = POOLS[TRN2]
    spec = _step(trn2).model_copy(update={"gpus": 4})
    assert _limits(_v1pod(pod_spec_for(trn2, spec, storage_root="s3://x", run_id="r", attempt=1))) == {"aws.amazon.com/neuron": "4", "vpc.amazonaws.com/efa": "4"}
    assert "resources" not in pod_spec_for(trn2, spec.model_copy(update={"gpus": 0}), storage_root="s3://x", run_id="r", attempt=1)["spec"]["containers"][0]


# A gang's JobSet ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("pool_name", "spec_of", "limits", "tas"),
    [
        # One 4x4x4 slice (16 hosts): all in one slice, i.e. one GKE node pool.
        (TPU, lambda p: _step(p, nodes=16, gang=True, tightly_coupled=True), {"google.com/tpu": "4"}, {REQUIRED: "cloud.google.com/gke-nodepool"}),
        # Two slices: each slice's 16 hosts inside one node pool, the slices over DCN (Kueue v0.13+).
        (TPU, lambda p: _spanning(p, 32), {"google.com/tpu": "4"}, {SLICE_REQUIRED: "cloud.google.com/gke-nodepool", SLICE_SIZE: "16"}),
        # One UltraServer (4 nodes over NeuronLink), or two when the step may span them.
        (TRN2, lambda p: _step(p, nodes=4, gang=True, tightly_coupled=True), {"aws.amazon.com/neuron": "16", "vpc.amazonaws.com/efa": "16"},
         {REQUIRED: "neuron.amazonaws.com/ultraserver-server-id-4"}),
        (TRN2, lambda p: _spanning(p, 8), {"aws.amazon.com/neuron": "16", "vpc.amazonaws.com/efa": "16"},
         {PREFERRED: "neuron.amazonaws.com/ultraserver-server-id-4"}),
        # No domain label in the catalog: no topology request (Kueue would refuse it on a flavor without a Topology).
        (AMD, lambda p: _step(p, nodes=2, gang=True, tightly_coupled=True), {"amd.com/gpu": "8"}, {}),
        (NVIDIA, lambda p: _step(p, nodes=2, gang=True, tightly_coupled=True), {"nvidia.com/gpu": "4"}, {}),
    ],
)  # fmt: skip
def test_a_gangs_pod_template_carries_its_devices_selector_and_topology_request(pool_name, spec_of, limits, tas):
    pool = POOLS[pool_name]
    spec = spec_of(pool)
    jobset, template = _jobset(pool, spec)
    assert _limits(template) == limits  # per pod, one per node
    assert template["spec"]["nodeSelector"] == _v1pod(pod_spec_for(pool, spec, storage_root="s3://x", run_id="r", attempt=1))["spec"]["nodeSelector"]
    assert _tas(template) == tas
    assert _tas(jobset) == {}  # Kueue reads them on the pod template (spec.replicatedJobs[].template.spec.template.metadata)
    assert jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] == spec.nodes
    if SLICE_SIZE in tas:  # Kueue's webhook: the slice size at most the pod set's count
        assert 1 <= int(tas[SLICE_SIZE]) <= spec.nodes and spec.nodes % int(tas[SLICE_SIZE]) == 0


def test_an_nvidia_pool_with_a_domain_label_gets_a_topology_request():
    """GKE A3 Ultra / A4 nodes carry `cloud.google.com/gce-topology-block` (docs: Schedule GKE workloads with TAS)."""
    fields = POOLS[NVIDIA].model_dump(exclude={"name", "topology", "nodes_per_domain", "accelerator", "gpus_per_node", "nodes"})
    pool = Pool(
        name="gke-a3-ultra", **fields, accelerator="h200-141gb", gpus_per_node=8, nodes=8, nodes_per_domain=4,
        topology={"domain": "placement_group", "domain_label": "cloud.google.com/gce-topology-block"},
    )  # fmt: skip
    _, template = _jobset(pool, _step(pool, nodes=4, gang=True, tightly_coupled=True))
    assert _tas(template) == {REQUIRED: "cloud.google.com/gce-topology-block"} and _limits(template) == {"nvidia.com/gpu": "8"}
    _, template = _jobset(pool, _spanning(pool, 8))
    assert _tas(template) == {PREFERRED: "cloud.google.com/gce-topology-block"}


def test_a_step_that_is_not_tightly_coupled_gets_no_topology_request():
    for name in (TPU, TRN2):
        pool = POOLS[name]
        _, template = _jobset(pool, _step(pool, nodes=4 if name == TRN2 else 16, gang=True, tightly_coupled=False))
        assert _tas(template) == {}


# Kueue's objects ---------------------------------------------------------------------------------------
def _quotas(tmp_path: Path) -> Path:
    path = tmp_path / "quotas.yaml"
    path.write_text(yaml.safe_dump({
        "teams": {"cell": {"members": ["cell"]}, "robotics": {"members": ["robotics"]}},
        "cohorts": {"fleet": {"teams": ["cell", "robotics"]}},
        "quotas": {TPU: {"cell": {"gpus": 64}}, TRN2: {"cell": {"gpus": 64}, "robotics": {"gpus": 64}}, AMD: {"robotics": {"gpus": 16}}},
        "priority_classes": {"training": 500}, "default_priority": "training",
    }))  # fmt: skip
    return path


def test_a_pool_with_a_domain_label_gets_a_kueue_topology_its_flavor_names(tmp_path):
    objects = kueue_objects(load_quotas(_quotas(tmp_path)), POOLS)
    for obj in objects:
        fits_the_api(obj)
    if os.environ.get("KUEUE_CRDS"):  # a Kueue release's CRDs, v0.9 to v0.13 (Topology: v1alpha1)
        schemas = crd_schemas(Path(os.environ["KUEUE_CRDS"]))
        for obj in objects:
            check_against_crds(obj, schemas)
    topologies = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Topology"}
    assert set(topologies) == {TPU, TRN2}
    assert topologies[TPU]["apiVersion"] == "kueue.x-k8s.io/v1alpha1"
    assert topologies[TPU]["spec"]["levels"] == [{"nodeLabel": "cloud.google.com/gke-nodepool"}, {"nodeLabel": "kubernetes.io/hostname"}]
    assert topologies[TRN2]["spec"]["levels"] == [{"nodeLabel": "neuron.amazonaws.com/ultraserver-server-id-4"}, {"nodeLabel": "kubernetes.io/hostname"}]
    flavors = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "ResourceFlavor"}
    assert flavors[TPU] == {"nodeLabels": {**GKE_TPU, "cloud.google.com/gke-spot": "true"}, "topologyName": TPU}
    assert flavors[TRN2] == {"nodeLabels": {"node.kubernetes.io/instance-type": "trn2u.48xlarge"}, "topologyName": TRN2}
    assert flavors[AMD] == {"nodeLabels": {"node.kubernetes.io/instance-type": "BM.GPU.MI300X.8"}}  # no domain label: no Topology
    # Objects a Topology names come before the flavors that name them.
    kinds = [o["kind"] for o in objects]
    assert kinds.index("ResourceFlavor") > max(i for i, k in enumerate(kinds) if k == "Topology")
    cell = next(o for o in objects if o["kind"] == "ClusterQueue" and o["metadata"]["name"] == "cell")
    groups = {g["coveredResources"][0]: {f["name"]: f["resources"][0] for f in g["flavors"]} for g in cell["spec"]["resourceGroups"]}
    assert set(groups) == {"nvidia.com/gpu", "google.com/tpu", "aws.amazon.com/neuron", "amd.com/gpu"}
    assert groups["google.com/tpu"][TPU] == {"name": "google.com/tpu", "nominalQuota": 64}
    assert groups["aws.amazon.com/neuron"][TRN2]["nominalQuota"] == 64 and groups["amd.com/gpu"][AMD]["nominalQuota"] == 0


def test_a_topology_flavor_without_node_labels_is_refused(tmp_path):
    amd = POOLS[AMD]
    bare = Pool(**{
        **amd.model_dump(exclude={"name", "interconnect_domain_gpus"}), "name": "oke-bare", "nodes_per_domain": 2,
        "backend_settings": {**amd.backend_settings, "node_selector": {}},
        "topology": {"domain": "fabric", "domain_label": "example.com/rdma-block"},
    })  # fmt: skip
    with pytest.raises(KueueObjectsError, match=r"pool `oke-bare`: a ResourceFlavor with a Topology needs at least one node label"):
        kueue_objects(load_quotas(_quotas(tmp_path)), {**POOLS, "oke-bare": bare})


# Through the fake API server ------------------------------------------------------------------------------
def test_a_tpu_gangs_jobset_lands_only_on_hosts_of_its_slice_type_and_shape(tmp_path):
    """Two hosts of a 2x2x2 v5p slice and one of another shape: the JobSet's two pods bind to the
    slice's hosts, each holding its host's 4 chips, and carry the topology request Kueue reads."""
    pool = Pool(**{
        **POOLS[TPU].model_dump(exclude={"name", "nodes", "topology"}), "name": "tpu-small", "nodes": 2,
        "topology": {"domain": "tpu_slice", "slice": "2x2x2", "domain_label": "cloud.google.com/gke-nodepool"},
    })  # fmt: skip
    taint = [{"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}]
    labels = {"cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice", "cloud.google.com/gke-spot": "true", "cloud.google.com/gke-nodepool": "slice-a"}
    nodes = [
        FakeNode("other-shape", labels={**labels, "cloud.google.com/gke-tpu-topology": "4x4x4"}, taints=taint, gpus=4, gpu_resource="google.com/tpu"),
        *(FakeNode(f"host-{i}", labels={**labels, "cloud.google.com/gke-tpu-topology": "2x2x2"}, taints=taint, gpus=4, gpu_resource="google.com/tpu") for i in range(2)),
    ]  # fmt: skip
    spec = _step(pool, nodes=2, gang=True, tightly_coupled=True)
    jobset, _ = _jobset(pool, spec)
    jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["command"] = ["python", "-c", "pass"]
    with FakeKubeAPI(nodes) as api:
        custom = CustomObjectsApi(kubernetes.config.new_client_from_config(config_file=str(api.write_kubeconfig(tmp_path / "kubeconfig"))))
        custom.create_namespaced_custom_object(GROUP, VERSION, "sinewgrid", PLURAL, jobset)
        pods = api.wait_for(lambda: (p := api.pods()) and len(p) == 2 and p, "the JobSet's two pods", timeout=30)
        assert sorted(p["spec"]["nodeName"] for p in pods) == ["host-0", "host-1"]
        assert all(_limits(p) == {"google.com/tpu": "4"} and _tas(p) == {REQUIRED: "cloud.google.com/gke-nodepool"} for p in pods)
        custom.delete_namespaced_custom_object(GROUP, VERSION, "sinewgrid", PLURAL, jobset["metadata"]["name"])
        api.wait_for(lambda: not api.pods() and not api.jobsets(), "the JobSet and its pods gone", timeout=30)
