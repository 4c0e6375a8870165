"""The quotas catalog as Kueue objects, for the Kubernetes pools whose cluster enforces it.

The catalog's model is Kueue's, so the mapping is one to one (docs/queues_kubernetes.md):

- each Kubernetes pool is a **ResourceFlavor** named after it, whose `nodeLabels` are the pool's
  node selector (its `node_selector` over what its accelerator's nodes carry: GKE's TPU labels;
  Kueue counts a pod against the flavor its node selector matches); a pool whose `topology` names
  a `domain_label` also gets a **Topology** of that label over `kubernetes.io/hostname`, named in
  the flavor's `topologyName`, for Kueue's topology-aware scheduling of its gangs
  (control_plane/compute/backends/kubernetes_devices.py);
- each team is a **ClusterQueue** named after it, in its cohort, with one resource group per GPU
  resource name (`gpu_resource`) holding one flavor per pool: its `nominalQuota` there (0 where the
  file gives it none: it may only borrow), `borrowingLimit`, `lendingLimit`, `fairSharing.weight`,
  and the preemption of docs/queues.md, "What preempts what" (`PREEMPTION`);
- GPUs of a pool given to no team are held by the ClusterQueue `<cohort>-unassigned`, which no
  LocalQueue points at: it only lends them to the cohort (a file with several cohorts must give
  every GPU of its Kubernetes pools to a team: Kueue lends a queue's quota inside one cohort);
- each team has a **LocalQueue** named after it in every pool's namespace: what a step's pod or
  JobSet names in `kueue.x-k8s.io/queue-name` (`workload_labels`);
- each priority class is a **WorkloadPriorityClass** of its value (`kueue.x-k8s.io/priority-class`).

Kueue's API is `kueue.x-k8s.io/v1beta1`; tests/test_kueue.py checks the objects against its CRDs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from control_plane.catalog.backends import KubernetesSettings, settings_for
from control_plane.catalog.pools import Pool
from control_plane.catalog.quotas import Quota, Quotas, load_quotas
from control_plane.catalog.step_spec import StepSpec
from control_plane.compute.backends.kubernetes_devices import device_resource, kueue_topology, node_selector
from control_plane.queues.requests import NoTeam, team_and_class

API_VERSION = "kueue.x-k8s.io/v1beta1"
# Kueue serves Topology as v1alpha1 up to v0.13 and as v1beta1 (only) from v0.14: this follows the
# releases the rest is written for (tests/kueue_api.py); on Kueue v0.14 or later, write v1beta1 here.
TOPOLOGY_API_VERSION = "kueue.x-k8s.io/v1alpha1"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
MANAGED_BY = {"app.kubernetes.io/managed-by": "sinewgrid"}  # `kubectl get clusterqueues -l app.kubernetes.io/managed-by=sinewgrid`
PREEMPTION = {
    "reclaimWithinCohort": "Any",  # a team within its nominal quota takes its lent GPUs back, from borrowers of any priority
    "withinClusterQueue": "LowerPriority",  # within a team, a higher class preempts a lower one
    "borrowWithinCohort": {"policy": "Never"},  # borrowing never preempts another team's work: it waits
}
QUEUEING = "BestEffortFIFO"  # a smaller request behind a blocked one may start
MAX_NODE_LABELS = 8  # a ResourceFlavor's `nodeLabels` hold at most 8
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_INT32 = (-(2**31), 2**31 - 1)


class KueueObjectsError(ValueError):
    """Quotas and pools that cannot be Kueue objects; the message names every problem and its fix."""


class NoTeamOnKueuePool(ValueError):
    """A step whose tenant no team names, on a pool whose Kueue admits only teams' LocalQueues."""


# The objects ---------------------------------------------------------------------------------------
def kubernetes_pools(pools: Mapping[str, Pool]) -> dict[str, tuple[Pool, KubernetesSettings]]:
    """The catalog's Kubernetes pools, each with its settings, its device resource and node selector resolved."""
    return {
        name: (pool, (s := settings_for(pool)).model_copy(update={"gpu_resource": device_resource(pool, s), "node_selector": node_selector(pool, s)}))
        for name, pool in pools.items() if pool.backend == "kubernetes"
    }  # fmt: skip


def pool_gpus(pool: Pool) -> int:
    """The pool's GPUs, as `sinewgrid queue` counts them."""
    return pool.gpus_per_node * pool.nodes


def unassigned_queue(cohort: str) -> str:
    """The ClusterQueue holding a cohort's share of the pools' GPUs given to no team."""
    return f"{cohort}-unassigned"


def kueue_objects(quotas: Quotas, pools: Mapping[str, Pool]) -> list[dict[str, Any]]:
    """Every Kueue object the quotas need on the catalog's Kubernetes pools, in the order to apply them."""
    kube = kubernetes_pools(pools)
    problems = _problems(quotas, kube)
    if problems:
        raise KueueObjectsError("the quotas cannot be Kueue objects:\n  " + "\n  ".join(problems))
    objects = [{**_object("Topology", name, spec={"levels": levels}), "apiVersion": TOPOLOGY_API_VERSION}
               for name, (pool, _) in kube.items() if (levels := kueue_topology(pool))]  # fmt: skip
    objects += [
        _object("ResourceFlavor", name, spec={"nodeLabels": dict(s.node_selector), **({"topologyName": name} if kueue_topology(pool) else {})})
        for name, (pool, s) in kube.items()
    ]
    for team, spec in quotas.teams.items():
        cohort = quotas.cohort_of(team)
        body: dict[str, Any] = {"cohort": cohort} if cohort else {}
        body |= {
            "namespaceSelector": {},  # its LocalQueues, wherever the pools' namespaces are
            "queueingStrategy": QUEUEING,
            "resourceGroups": _resource_groups(kube, lambda pool: quotas.quota(pool, team), lends=cohort is not None),
            "fairSharing": {"weight": _quantity(spec.weight)},
            "preemption": PREEMPTION,
        }
        objects.append(_object("ClusterQueue", team, spec=body))
    spare = _unassigned(quotas, kube)
    if any(spare.values()):
        (cohort,) = quotas.cohorts  # `_problems` refuses spare GPUs with several cohorts; with none, nobody borrows them
        groups = _resource_groups(kube, lambda pool: Quota(gpus=spare[pool]), lends=True)
        objects.append(_object("ClusterQueue", unassigned_queue(cohort), spec={"cohort": cohort, "queueingStrategy": QUEUEING, "resourceGroups": groups}))
    for namespace in dict.fromkeys(s.namespace for _, s in kube.values()):
        objects += [_object("LocalQueue", team, namespace=namespace, spec={"clusterQueue": team}) for team in quotas.teams]
    objects += [_object("WorkloadPriorityClass", name, value=value) for name, value in quotas.priority_classes.items()]
    return objects


def kueue_manifests(quotas: Quotas, pools: Mapping[str, Pool]) -> str:
    """The objects as one multi-document YAML, for `kubectl apply --server-side -f`."""
    objects = kueue_objects(quotas, pools)
    kube = ", ".join(f"{name} ({s.namespace})" for name, (_, s) in kubernetes_pools(pools).items())
    header = (
        f"# Kueue objects for the quotas of {quotas.file or 'the quotas catalog'} on the Kubernetes pools {kube}.\n"
        "# Made by Sinewgrid (control_plane/queues/kueue.py); apply with `kubectl apply --server-side -f FILE`\n"
        "# on the pools' cluster, where Kueue runs (docs/queues_kubernetes.md).\n"
    )
    return header + yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False)


def _object(kind: str, name: str, namespace: str | None = None, **body: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, **({"namespace": namespace} if namespace else {}), "labels": dict(MANAGED_BY)}
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": metadata, **body}


def _resource_groups(kube: Mapping[str, tuple[Pool, KubernetesSettings]], quota_on: Any, *, lends: bool) -> list[dict[str, Any]]:
    """One resource group per GPU resource name, one flavor per pool; limits only in a cohort
    (Kueue refuses them outside one: such a team neither lends nor borrows)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for name, (_, settings) in kube.items():
        quota: Quota = quota_on(name)
        resource: dict[str, Any] = {"name": settings.gpu_resource, "nominalQuota": quota.gpus}
        if lends and quota.borrowing_limit is not None:
            resource["borrowingLimit"] = quota.borrowing_limit
        if lends and quota.lending_limit is not None:
            resource["lendingLimit"] = quota.lending_limit
        groups.setdefault(settings.gpu_resource, []).append({"name": name, "resources": [resource]})
    return [{"coveredResources": [gpu], "flavors": flavors} for gpu, flavors in groups.items()]


def _unassigned(quotas: Quotas, kube: Mapping[str, tuple[Pool, KubernetesSettings]]) -> dict[str, int]:
    return {name: max(0, pool_gpus(pool) - sum(q.gpus for q in quotas.quotas.get(name, {}).values())) for name, (pool, _) in kube.items()}


def _quantity(value: float) -> int | str:
    """A Kubernetes quantity: an integer when whole, else its decimal text (`1.5`)."""
    return int(value) if float(value).is_integer() else repr(float(value))


# What cannot be rendered ----------------------------------------------------------------------------
def _not_a_label(kind: str, name: str, where: str, fix: str) -> str | None:
    if len(name) <= 63 and _DNS_LABEL.match(name):
        return None
    suggested = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63].strip("-") or "name"
    return (
        f"{where}: {kind} `{name}` names Kueue objects, and it is not a DNS-1123 label (at most 63 lower-case letters, "
        f"digits and `-`, starting and ending with a letter or digit); {fix}, e.g. `{suggested}`"
    )


def _problems(quotas: Quotas, kube: Mapping[str, tuple[Pool, KubernetesSettings]]) -> list[str]:
    file = quotas.file or "the quotas file"
    if not kube:
        return ["the pool catalog has no pool with `backend: kubernetes`: there is nothing for Kueue to enforce"]
    said = [_not_a_label("team", t, file, "rename the team") for t in quotas.teams]
    said += [_not_a_label("cohort", c, file, "rename the cohort") for c in quotas.cohorts]
    said += [_not_a_label("priority class", p, file, "rename the class") for p in quotas.priority_classes]
    said += [_not_a_label("pool", name, "the pool catalog", "rename the pool") for name in kube]
    said += [_not_a_label("namespace", s.namespace, f"pool `{name}`", "set `backend_settings.namespace` to one") for name, (_, s) in kube.items()]
    said += [
        f"{file}: priority class `{name}` has value {value}; a WorkloadPriorityClass holds a 32-bit integer ({_INT32[0]} to {_INT32[1]})"
        for name, value in quotas.priority_classes.items() if not _INT32[0] <= value <= _INT32[1]
    ]  # fmt: skip
    for name, (pool, settings) in kube.items():
        nominal = sum(q.gpus for q in quotas.quotas.get(name, {}).values())
        if nominal > pool_gpus(pool):
            said.append(f"{file}: the nominal quotas on pool `{name}` add up to {nominal} GPUs, more than its {pool_gpus(pool)}; lower them")
        if len(settings.node_selector) > MAX_NODE_LABELS:
            said.append(f"pool `{name}`: `node_selector` has {len(settings.node_selector)} labels; its ResourceFlavor holds at most {MAX_NODE_LABELS}")
        if kueue_topology(pool) and not settings.node_selector:
            said.append(f"pool `{name}`: a ResourceFlavor with a Topology needs at least one node label; give the pool a `node_selector`")
    spare = {pool: gpus for pool, gpus in _unassigned(quotas, kube).items() if gpus}
    if spare and len(quotas.cohorts) > 1:
        said.append(
            f"{file}: {', '.join(f'{g} GPUs of pool `{p}`' for p, g in spare.items())} are given to no team, and the file has "
            f"{len(quotas.cohorts)} cohorts ({', '.join(quotas.cohorts)}): Kueue lends a queue's GPUs inside one cohort only; "
            "give them to a team (a team of the cohort that should borrow them)"
        )
    if len(quotas.cohorts) == 1 and spare and (holder := unassigned_queue(next(iter(quotas.cohorts)))) in quotas.teams:
        said.append(f"{file}: team `{holder}` has the name of the ClusterQueue that holds the pools' unassigned GPUs; rename the team")
    said += _ambiguous_flavors(kube)
    return [s for s in said if s]


def _ambiguous_flavors(kube: Mapping[str, tuple[Pool, KubernetesSettings]]) -> list[str]:
    """Kueue counts a pod against any flavor of its resource group whose `nodeLabels` hold all of the
    pod's node selector: a pool whose selector is part of another's would count against either."""
    said = []
    for a, (_, sa) in kube.items():
        for b, (_, sb) in kube.items():
            if a != b and sa.gpu_resource == sb.gpu_resource and sa.node_selector.items() <= sb.node_selector.items():
                said.append(
                    f"pools `{a}` and `{b}`: every label of `{a}`'s `node_selector` ({sa.node_selector or 'none'}) is also `{b}`'s, so "
                    f"Kueue may count `{a}`'s pods against `{b}`'s quota; give `{a}` a label `{b}` sets differently (e.g. its instance type)"
                )
    return said


# The labels of a step's pod or JobSet -------------------------------------------------------------
def workload_labels(pool: Pool, spec: StepSpec, quotas: Quotas | None = None) -> dict[str, str]:
    """The Kueue labels of `spec`'s pod or JobSet on `pool`: its team's LocalQueue and its priority
    class, when the pool's Kueue enforces the quotas (`backend_settings.kueue`); else none."""
    settings: KubernetesSettings = settings_for(pool)
    if not settings.kueue:
        return {}
    quotas = quotas or load_quotas()
    try:
        team, name = team_and_class(spec, quotas)  # a class the catalog lacks: said here, not as a workload Kueue never admits
    except NoTeam as exc:
        raise NoTeamOnKueuePool(
            f"pool {pool.name} enforces team quotas with Kueue (`backend_settings.kueue: true`), and {exc}, so {spec.name} has no "
            f"LocalQueue there. Add `{spec.tenant}` or its lane to a team's `members`, or run it on a pool without `kueue`."
        ) from None
    return {QUEUE_LABEL: team, PRIORITY_LABEL: name}

