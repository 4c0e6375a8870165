"""Kueue's `kueue.x-k8s.io/v1beta1` API for the kinds Sinewgrid renders, as strict JSON Schemas,
and a check of objects against Kueue's own CRDs when a Kueue checkout is at hand.

`KUEUE_V1BETA1` is written here from Kueue's API reference (v0.9 to v0.13: the fields of
ResourceFlavor, ClusterQueue, LocalQueue and WorkloadPriorityClass, their types and enums; and
Topology, which those releases serve as `kueue.x-k8s.io/v1alpha1`: apis/kueue/v1alpha1/topology_types.go
and config/components/crd/bases/kueue.x-k8s.io_topologies.yaml; v0.14 moved it to v1beta1). Unlike
the CRDs (the API server prunes unknown fields without a word), it refuses a field Kueue does not
have. `check_against_crds` validates objects against a release's CRDs
(`config/components/crd/bases/kueue.x-k8s.io_<kinds>.yaml` of a Kueue checkout, named by the
`KUEUE_CRDS` environment variable) and checks that every field of `KUEUE_V1BETA1` is in them, of
the same type: run with it to tie this table to a release.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")  # at most 63 characters too
PLURALS = {
    "ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues",
    "WorkloadPriorityClass": "workloadpriorityclasses", "Topology": "topologies",
}  # fmt: skip
VERSIONS = {"Topology": "v1alpha1"}  # the CRD version each kind is checked at; v1beta1 if not named
# A Topology level's node label (the CRD's pattern for `levels[].nodeLabel`, at most 316 characters).
NODE_LABEL_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
HOSTNAME = "kubernetes.io/hostname"
QUANTITY_PATTERN = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"


def _obj(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


def _arr(items: dict[str, Any], **limits: int) -> dict[str, Any]:
    return {"type": "array", "items": items, **limits}


def _str(*enum: str, pattern: str | None = None) -> dict[str, Any]:
    return {"type": "string", **({"enum": list(enum)} if enum else {}), **({"pattern": pattern} if pattern else {})}


_INT = {"type": "integer"}
_QUANTITY = {"anyOf": [_INT, _str(pattern=QUANTITY_PATTERN)]}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = _obj({"name": _str(), "namespace": _str(), "labels": _STRING_MAP, "annotations": _STRING_MAP}, ("name",))
_SELECTOR = _obj({"matchLabels": _STRING_MAP, "matchExpressions": _arr(_obj({"key": _str(), "operator": _str(), "values": _arr(_str())}, ("key", "operator")))})
_TOLERATION = _obj({"key": _str(), "operator": _str(), "value": _str(), "effect": _str(), "tolerationSeconds": _INT})
_STOP = _str("None", "Hold", "HoldAndDrain")
_RESOURCE = _obj({"name": _str(), "nominalQuota": _QUANTITY, "borrowingLimit": _QUANTITY, "lendingLimit": _QUANTITY}, ("name", "nominalQuota"))
_FLAVOR_QUOTAS = _obj({"name": _str(), "resources": _arr(_RESOURCE, minItems=1, maxItems=16)}, ("name", "resources"))
_RESOURCE_GROUP = _obj({"coveredResources": _arr(_str(), minItems=1, maxItems=16), "flavors": _arr(_FLAVOR_QUOTAS, minItems=1, maxItems=16)}, ("coveredResources", "flavors"))
_PREEMPTION = _obj({
    "reclaimWithinCohort": _str("Never", "LowerPriority", "Any"),
    "withinClusterQueue": _str("Never", "LowerPriority", "LowerOrNewerEqualPriority"),
    "borrowWithinCohort": _obj({"policy": _str("Never", "LowerPriority"), "maxPriorityThreshold": _INT}),
})  # fmt: skip


def _kind(kind: str, required: tuple[str, ...] = (), **fields: dict[str, Any]) -> dict[str, Any]:
    version = f"kueue.x-k8s.io/{VERSIONS.get(kind, 'v1beta1')}"
    return _obj({"apiVersion": {"const": version}, "kind": {"const": kind}, "metadata": _METADATA, **fields}, ("apiVersion", "kind", "metadata", *required))


KUEUE_V1BETA1: dict[str, dict[str, Any]] = {
    "ResourceFlavor": _kind("ResourceFlavor", spec=_obj({
        "nodeLabels": {**_STRING_MAP, "maxProperties": 8},
        "nodeTaints": _arr(_obj({"key": _str(), "value": _str(), "effect": _str(), "timeAdded": _str()}, ("key", "effect"))),
        "tolerations": _arr(_TOLERATION),
        "topologyName": _str(),
    })),
    "ClusterQueue": _kind("ClusterQueue", spec=_obj({
        "cohort": _str(),
        "namespaceSelector": _SELECTOR,
        "queueingStrategy": _str("StrictFIFO", "BestEffortFIFO"),
        "resourceGroups": _arr(_RESOURCE_GROUP, maxItems=16),
        "fairSharing": _obj({"weight": _QUANTITY}),
        "preemption": _PREEMPTION,
        "flavorFungibility": _obj({"whenCanBorrow": _str("Borrow", "TryNextFlavor"), "whenCanPreempt": _str("Preempt", "TryNextFlavor")}),
        "stopPolicy": _STOP,
    })),
    "LocalQueue": _kind("LocalQueue", spec=_obj({"clusterQueue": _str(), "stopPolicy": _STOP})),  # (v0.12 added `fairSharing`)
    "WorkloadPriorityClass": _kind("WorkloadPriorityClass", ("value",), value=_INT, description=_str()),
    # v0.9 to v0.12 allow 8 levels, v0.13 16: the table holds the fewer.
    "Topology": _kind("Topology", ("spec",), spec=_obj({
        "levels": _arr(_obj({"nodeLabel": {**_str(pattern=NODE_LABEL_PATTERN), "minLength": 1, "maxLength": 316}}, ("nodeLabel",)), minItems=1, maxItems=8),
    }, ("levels",))),
}  # fmt: skip


def fits_the_api(obj: dict[str, Any]) -> None:
    """Raise (jsonschema.ValidationError) when `obj` is not a valid object of its Kueue kind, with names Kubernetes takes."""
    jsonschema.validate(obj, KUEUE_V1BETA1[obj["kind"]])
    name, namespace = obj["metadata"]["name"], obj["metadata"].get("namespace", "default")
    assert DNS_LABEL.match(name) and len(name) <= 63 and DNS_LABEL.match(namespace), f"{obj['kind']} {namespace}/{name}: not a DNS-1123 label"
    assert not (obj["kind"] == "LocalQueue") ^ ("namespace" in obj["metadata"]), f"{obj['kind']} {name}: only LocalQueues are namespaced"
    assert cel_rules_broken(obj) == [], f"{obj['kind']} {name}: {cel_rules_broken(obj)}"


# Kueue's own CRDs -----------------------------------------------------------------------------------
def crd_schemas(folder: Path) -> dict[str, dict[str, Any]]:
    """The openAPIV3Schema of each kind at its version (`VERSIONS`, else `v1beta1`), from a Kueue release's CRD files."""
    found = {}
    for kind, plural in PLURALS.items():
        crd = yaml.safe_load((folder / f"kueue.x-k8s.io_{plural}.yaml").read_text())
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == VERSIONS.get(kind, "v1beta1")]
        found[kind] = version["schema"]["openAPIV3Schema"]
    return found


def unknown_fields(value: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    """Fields of `value` the CRD schema does not have (the API server would drop them silently)."""
    if isinstance(value, dict) and "properties" in schema:
        said = [f"{where}.{k}" for k in value if k not in schema["properties"]]
        return said + [s for k, v in value.items() if k in schema["properties"] for s in unknown_fields(v, schema["properties"][k], f"{where}.{k}")]
    if isinstance(value, list) and "items" in schema:
        return [s for i, v in enumerate(value) for s in unknown_fields(v, schema["items"], f"{where}[{i}]")]
    return []


def cel_rules_broken(obj: dict[str, Any]) -> list[str]:
    """The CRDs' CEL rules (`x-kubernetes-validations`) that jsonschema cannot read, for the fields rendered."""
    spec, said = obj.get("spec") or {}, []
    for group in spec.get("resourceGroups", []):
        said += [f"flavor {f['name']}: as many resources as coveredResources" for f in group["flavors"] if len(f["resources"]) != len(group["coveredResources"])]
        limits = [r for f in group["flavors"] for r in f["resources"] if "borrowingLimit" in r or "lendingLimit" in r]
        if limits and "cohort" not in spec:
            said.append("borrowingLimit and lendingLimit must be nil when cohort is empty")
    if obj["kind"] == "ResourceFlavor" and "topologyName" in spec and not spec.get("nodeLabels"):
        said.append("at least one nodeLabel is required when topology is set")
    labels = [level["nodeLabel"] for level in spec.get("levels", [])]
    if len(set(labels)) != len(labels):
        said.append("levels must be unique")
    if HOSTNAME in labels[:-1]:
        said.append("the kubernetes.io/hostname label can only be used at the lowest level of topology")
    preemption = spec.get("preemption") or {}
    if preemption.get("reclaimWithinCohort") == "Never" and (preemption.get("borrowWithinCohort") or {}).get("policy", "Never") != "Never":
        said.append("reclaimWithinCohort=Never and borrowWithinCohort.Policy!=Never")
    return said


def check_against_crds(obj: dict[str, Any], schemas: dict[str, dict[str, Any]]) -> None:
    schema = schemas[obj["kind"]]
    jsonschema.validate(obj, schema)
    assert unknown_fields(obj, schema) == [], f"{obj['kind']} {obj['metadata']['name']}: fields Kueue does not have"
    assert cel_rules_broken(obj) == [], obj


def table_disagreements(table: dict[str, Any], crd: dict[str, Any], where: str = "") -> list[str]:
    """Where `KUEUE_V1BETA1` says a field, type, enum or requirement the CRD does not."""
    said = []
    if "enum" in table and set(table["enum"]) != set(crd.get("enum", [])):
        said.append(f"{where}: enum {table['enum']} vs {crd.get('enum')}")
    if "type" in table and table["type"] != crd.get("type") and not crd.get("x-kubernetes-int-or-string"):
        said.append(f"{where}: type {table['type']} vs {crd.get('type')}")
    for name, sub in (table.get("properties") or {}).items():
        if name in ("apiVersion", "kind", "metadata"):
            continue
        if name not in (crd.get("properties") or {}):
            said.append(f"{where}.{name}: not in the CRD")
            continue
        said += table_disagreements(sub, crd["properties"][name], f"{where}.{name}")
    # The table may require more than a release's CRD (Topology's `spec`, required from v0.12), never less.
    if "properties" in table and not set(crd.get("required", [])) <= set(table.get("required", [])) - {"apiVersion", "kind", "metadata"}:
        said.append(f"{where}: required {table.get('required')} vs {crd.get('required')}")
    if "items" in table:
        said += table_disagreements(table["items"], crd.get("items") or {}, f"{where}[]")
    return said
