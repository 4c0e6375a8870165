"""What a pod on a Kubernetes pool asks for, by accelerator family, in the names real clusters read.

- **Device resources** (`device_limits`): the pool's `gpu_resource` if it names one, else the
  accelerator's own extended resource: `nvidia.com/gpu` (NVIDIA device plugin / GPU Operator),
  `amd.com/gpu` (ROCm device plugin), `google.com/tpu` (GKE), `aws.amazon.com/neuron` (Neuron
  device plugin: Trainium chips). A pod asks for its node's share of the step's devices; on a TPU
  pool, every chip of its host (GKE admits a multi-host slice's pod only when it asks for all of
  them). On EFA pools (`efa_per_node`) it also asks for `vpc.amazonaws.com/efa` (EKS's EFA device
  plugin), in proportion to the devices it holds.
- **Node selectors** (`node_selector`): on GKE TPU pools `cloud.google.com/gke-tpu-accelerator`
  and `cloud.google.com/gke-tpu-topology` (the slice's shape); the pool's own `node_selector` is
  merged over them (it wins). NVIDIA, AMD and Trainium pools need none beyond the pool's.
- **Kueue topology-aware scheduling** (`topology_annotations`): on the pod template of a tightly
  coupled gang, where the pool's `topology.domain_label` names the node label of its fast domains
  (and so its ResourceFlavor a Kueue `Topology`: control_plane/queues/kueue.py).
  `kueue.x-k8s.io/podset-required-topology: <label>` keeps the gang inside one domain;
  `kueue.x-k8s.io/podset-preferred-topology: <label>` when the step may span domains
  (`span_domains`); a TPU gang of several whole slices asks for each slice's hosts inside one
  domain (`kueue.x-k8s.io/podset-slice-required-topology` with `kueue.x-k8s.io/podset-slice-size`,
  Kueue v0.13 and later). The annotations' names are Kueue's (apis/kueue/v1alpha1/topology_types.go
  up to v0.13, v1beta1 from v0.14); Kueue reads them on `spec.replicatedJobs[].template.spec.template.metadata`.

These are written from the vendors' and Kueue's documentation and checked against the Kubernetes
client's models and Kueue's API (tests/test_accelerator_specs.py); no real cluster runs here.
"""

from __future__ import annotations

from control_plane.catalog.accelerators import ACCELERATORS
from control_plane.catalog.backends import KubernetesSettings
from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec

GKE_TPU_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
GKE_TPU_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
SLICE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-slice-required-topology"
SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"
TOPOLOGY_ANNOTATIONS = (REQUIRED_TOPOLOGY, PREFERRED_TOPOLOGY, SLICE_REQUIRED_TOPOLOGY, SLICE_SIZE)
HOSTNAME_LABEL = "kubernetes.io/hostname"


def device_resource(pool: Pool, settings: KubernetesSettings) -> str:
    """The extended resource the pool's accelerators are asked for as: the pool's `gpu_resource`,
    else its accelerator's (`nvidia.com/gpu` for a pool of CPUs too: it is asked for only by steps with GPUs)."""
    return settings.gpu_resource or ACCELERATORS[pool.accelerator].device_resource or "nvidia.com/gpu"


def devices_per_pod(pool: Pool, spec: StepSpec) -> int:
    """Devices one pod of the step asks for: its node's share; on a TPU pool, all of its host's chips."""
    if not spec.gpus:
        return 0
    if pool.family == "tpu" and pool.gpus_per_node:
        return pool.gpus_per_node
    return -(-spec.gpus // spec.nodes)


def device_limits(pool: Pool, spec: StepSpec, settings: KubernetesSettings) -> dict[str, str]:
    """The container's `resources.limits` for its accelerators (and EFA interfaces); empty: none."""
    devices = devices_per_pod(pool, spec)
    if not devices:
        return {}
    limits = {device_resource(pool, settings): str(devices)}
    if settings.efa_per_node:
        share = -(-settings.efa_per_node * devices // pool.gpus_per_node) if pool.gpus_per_node else settings.efa_per_node
        limits[EFA_RESOURCE] = str(min(max(share, 1), settings.efa_per_node))
    return limits


def node_selector(pool: Pool, settings: KubernetesSettings) -> dict[str, str]:
    """The pod's node selector: what the accelerator's nodes must carry, with the pool's own merged over it."""
    accelerator = ACCELERATORS[pool.accelerator]
    needed: dict[str, str] = {}
    if accelerator.family == "tpu":
        needed[GKE_TPU_ACCELERATOR] = accelerator.gke_tpu
        if pool.topology is not None and pool.topology.slice:
            needed[GKE_TPU_TOPOLOGY] = pool.topology.slice
    return {**needed, **settings.node_selector}


def topology_annotations(pool: Pool, spec: StepSpec) -> dict[str, str]:
    """Kueue's topology-aware scheduling request for a gang's pod template; empty for a step that is
    not a tightly coupled gang, or on a pool whose topology names no node label."""
    topology = pool.topology
    if not (spec.gang and spec.tightly_coupled and topology is not None and topology.domain_label):
        return {}
    label, hosts = topology.domain_label, pool.domain_nodes
    if topology.whole_domains:  # a TPU slice: the gang holds whole slices, each one inside one domain
        if hosts and spec.nodes > hosts:
            return {SLICE_REQUIRED_TOPOLOGY: label, SLICE_SIZE: str(hosts)}
        return {REQUIRED_TOPOLOGY: label}
    return {PREFERRED_TOPOLOGY if spec.span_domains else REQUIRED_TOPOLOGY: label}


def kueue_topology(pool: Pool) -> list[dict[str, str]] | None:
    """The levels of the Kueue `Topology` of the pool's ResourceFlavor: its domain label, then the
    host (the lowest level, as Kueue requires); None: the pool declares no domain label."""
    label = pool.topology.domain_label if pool.topology is not None else None
    if not label:
        return None
    return [{"nodeLabel": label}, *([{"nodeLabel": HOSTNAME_LABEL}] if label != HOSTNAME_LABEL else [])]
