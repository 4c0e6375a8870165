"""What the lanes' assets call to make a result traceable: one function per kind of record.

- `publish_version`: a curated dataset becomes a DVC version in the data registry and a
  lineage record pointing at what it was made from, with its tenant and that tenant's data
  agreement (docs/tenancy.md); returns the asset metadata.
- `record_drop`: a raw drop or session, exactly as it was handed in (the root of every chain).
- `record_result`: a training run, an evaluation or a proposal, pointing at its inputs; a
  model's record names the agreements of the data it rests on.
- `agreements_of`: the tenants and agreements of registered dataset versions (for the
  shared-training check and placement limits, `control_plane/tenancy/agreements.py`).
- `track_run` / `track_evaluation`: a run's curves and figures in the experiment record
  (`checkpoints/<run>/run.json` + `metrics.parquet`), with its loss curve beside the previous run's.

Each returns metadata for the Dagster UI: the version, where to get it, and the lineage tree.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import dagster as dg

from data_layer.registry.dataset_version import DatasetVersion
from data_layer.registry.names import parse_ref
from data_layer.registry.registry import DataRegistry
from data_layer.experiments import RunNotFound, list_runs, numeric_figures, record_evaluation, record_run
from data_layer.run_comparison import compare, curve_png, image_markdown
from data_layer.lineage import LineageNotFound, LineageStore, Node
from control_plane.settings import code_version
from control_plane.catalog.step_spec import DatasetRef
from control_plane.catalog.tenants import Agreement, load_tenants
from control_plane.tenancy.agreements import RESTS_ON_SEPARATOR, AgreedData, agreed_data, describe, rests_on, version_meta
from workload_runtime.storage import Storage, exists, read_json
from workload_runtime.tenant_access import keyring_for


def drop_id(kind: str, drop: str) -> str:
    """The lineage id of a raw drop: `drop/<kind>/<drop id>`."""
    return f"drop/{kind}/{drop}"


def lineage_metadata(store: Storage, node_id: str) -> dict[str, Any]:
    """The lineage tree and the code version, as asset metadata."""
    return {
        "lineage_id": node_id,
        "lineage": dg.MetadataValue.md(LineageStore(store.root).markdown(node_id)),
        "code_version": code_version(),
    }


def record_drop(
    store: Storage, kind: str, drop: str, raw_uri: str, fields: dict[str, Any], files: int, *, identifiers: Iterable[str] = ()
) -> Node:
    """The raw drop (lab plate export, teleop session, robot-cell results) as it was handed in.

    A drop whose manifest says `in_reply_to: <lineage id>` (the lab answering a proposed plate,
    an operator answering a relabelling request) points back at it: the loop closes in the graph.
    The manifest's fields become the node's facts; of a tenant's sealed drop only `identifiers`
    do (the lineage is shown in Dagster's metadata; free text stays in the sealed raw manifest).
    """
    sealed = keyring_for(store.root) is not None
    shown = {
        k: v for k, v in fields.items()
        if isinstance(v, str | int | float) and k != "in_reply_to" and (not sealed or k in identifiers)
    }
    answers = fields.get("in_reply_to")
    return LineageStore(store.root).record(
        drop_id(kind, drop), "drop", f"raw {kind} drop, byte for byte as handed in",
        inputs=[answers] if isinstance(answers, str) and answers else [], uri=raw_uri, facts={**shown, "files": files, **sealed_with(store)},
    )


def sealed_with(store: Storage) -> dict[str, str]:
    """The key that seals this root's data (its id, never the key), for the lineage; {} for plain data."""
    keyring = keyring_for(store.root)
    return {"sealed_with_key": keyring.key_id} if keyring is not None else {}


def publish_version(
    store: Storage,
    dataset: str,
    version: str,
    uri: str,
    *,
    title: str,
    inputs: list[str],
    facts: dict[str, Any] | None = None,
    tenant: str | None = None,
    agreement: Agreement | None = None,
) -> tuple[DatasetVersion, dict[str, Any]]:
    """Register `uri` as `dataset@version` in the data registry and record its lineage.

    A tenant's data carries its tenant and agreement into the registry meta and the lineage
    record (`agreement`: default, the tenant's in the tenants catalog now). The platform's own
    data (`tenant=None`) carries none.
    """
    if tenant and agreement is None:
        agreement = load_tenants().get_tenant(tenant).agreement
    carried = version_meta(tenant, agreement)
    registered = DataRegistry.for_root(store.root).register(dataset, version, uri, meta={"inputs": inputs, **(facts or {}), **carried})
    said = {"tenant": tenant, "agreement": describe(agreement)} if tenant and agreement is not None else {}
    LineageStore(store.root).record(
        registered.ref,
        "dataset",
        title,
        inputs=inputs,
        uri=uri,
        facts={**(facts or {}), **said, **sealed_with(store), "dvc_md5": registered.md5, "registry_rev": registered.rev[:12], "region": _where(registered)},
    )
    metadata = {"dataset_ref": registered.ref, **registered.metadata(), **lineage_metadata(store, registered.ref)}
    if said:
        metadata.update(said)
    return registered, metadata


def _where(registered: DatasetVersion) -> str:
    """`local`, or the provider and region, e.g. `aws us-east-1`."""
    return registered.region if registered.provider == registered.region else f"{registered.provider} {registered.region}"


def dataset_ref(registered: DatasetVersion) -> DatasetRef:
    """An input for a step spec: placement weighs moving it (data gravity)."""
    return DatasetRef(name=registered.ref, size_gb=registered.bytes / 1e9, provider=registered.provider, region=registered.region)


def find_version(store: Storage, ref: str) -> DatasetVersion:
    """A registered version by its ref (`cell/omics@<version>`)."""
    return DataRegistry.for_root(store.root).find(*parse_ref(ref))


def agreements_of(store: Storage, dataset_refs: list[str]) -> list[AgreedData]:
    """The tenant and agreement each registered dataset version carries (from the registry)."""
    return agreed_data(find_version(store, ref) for ref in dict.fromkeys(dataset_refs))


def record_result(
    store: Storage,
    node_id: str,
    kind: str,
    title: str,
    *,
    inputs: list[str],
    uri: str = "",
    facts: dict[str, Any] | None = None,
    agreements: list[AgreedData] | None = None,
) -> dict[str, Any]:
    """A training run, evaluation or proposal and what it was made from; returns its metadata.

    A model's record says which agreements it rests on (`rests_on`): those given, else those its
    input datasets recorded in their lineage (and those its input models rest on).
    """
    facts = dict(facts or {})
    if kind == "model":
        parts = [d.describe() for d in agreements if d.tenant] if agreements is not None else _agreements_in_lineage(store, inputs)
        if said := rests_on(parts):
            facts["rests_on"] = said
    LineageStore(store.root).record(node_id, kind, title, inputs=inputs, uri=uri, facts=facts)
    return lineage_metadata(store, node_id)


def _agreements_in_lineage(store: Storage, inputs: list[str]) -> list[str]:
    """What the inputs' lineage records say: each tenant dataset's agreement, and what each input model rests on."""
    lineage, found = LineageStore(store.root), []
    for node_id in inputs:
        try:
            node = lineage.get(node_id)
        except (LineageNotFound, ValueError):
            continue
        if node.kind == "dataset" and node.facts.get("tenant"):
            found.append(f"{node.facts['tenant']} ({node.facts.get('agreement') or 'no agreement recorded'})")
        elif node.kind == "model" and node.facts.get("rests_on"):
            found += str(node.facts["rests_on"]).split(RESTS_ON_SEPARATOR)
    return found


def trained_on(checkpoint_uri: str) -> list[str]:
    """The dataset refs the run that wrote this checkpoint was given (from its manifest's lineage).

    A run that reuses a finished checkpoint keeps the datasets it was really trained on.
    """
    manifest = f"{checkpoint_uri.rstrip('/')}/manifest.json"
    return list(read_json(manifest).get("lineage", {}).get("datasets", [])) if exists(manifest) else []


def _numbers(values: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of asset metadata (Dagster metadata values unwrapped)."""
    return numeric_figures({k: getattr(v, "value", v) for k, v in values.items()})


def track_run(store: Storage, run: str, final_checkpoint: str, result: dict[str, Any], *, config: dict[str, Any], pool: str, cost_usd: float, dagster_run_id: str) -> dict[str, Any]:
    """Record a finished training run (its loss curve from the final checkpoint, its result figures)
    and return metadata: the curve plotted beside the model's previous run, and how they differ."""
    manifest_uri = f"{final_checkpoint.rstrip('/')}/manifest.json"
    manifest = read_json(manifest_uri) if exists(manifest_uri) else {}
    losses = manifest.get("meta", {}).get("losses") or []
    model = run.rsplit("/", 1)[0]
    earlier = [r for r in list_runs(store.root, model=model) if r.lineage != run]
    recorded = record_run(
        store.root, run,
        curves={"loss": [float(v) for v in losses]} if losses else {},
        summary={k: v for k, v in _numbers(result).items() if k not in ("final_step",)},
        config=config,
        datasets=trained_on(final_checkpoint),
        code_version=manifest.get("lineage", {}).get("code_version") or code_version(),
        extra={"pool": pool, "cost_usd": cost_usd, "dagster_run_id": dagster_run_id, "checkpoint_uri": final_checkpoint},
    )
    metadata: dict[str, Any] = {"run_record": dg.MetadataValue.path(recorded.run_json_uri)}
    previous = max(earlier, key=lambda r: r.recorded_at, default=None)
    if losses:
        shown = [recorded, previous] if previous is not None and not previous.curve("loss").empty else [recorded]
        title = "loss by step" + (f" (beside the previous run {previous.lineage})" if len(shown) == 2 else "")
        metadata["loss_curve"] = dg.MetadataValue.md(image_markdown(curve_png(shown, "loss"), title))
    if previous is not None:
        metadata["compared_with_previous"] = dg.MetadataValue.md(compare(previous, recorded).markdown())
    return metadata


def track_evaluation(store: Storage, run: str, name: str, figures: dict[str, Any]) -> None:
    """Add an evaluation's figures (e.g. the sim success rate) to the run it evaluated, if recorded."""
    try:
        record_evaluation(store.root, run, name, _numbers(figures))
    except RunNotFound:
        pass  # a policy trained before runs were recorded: nothing to attach to
