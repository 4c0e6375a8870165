"""The versioned omics training set of one lab: PBMC expression joined with its validated assay rounds."""


import io
import posixpath

import dagster as dg
import pandas as pd

from cell_lane.defs.assets.ingest import KIND, VALIDATED_ASSAY
from cell_lane.defs.partitions import cell_tenants
from cell_lane.omics import gene_labels, join_labels, load_reference_expression, publish_dataset
from control_plane.tenancy.shown import sealed_tenant, table_or_count
from data_layer.provenance import publish_version
from shared_resources.resources import StorageResource
from workload_runtime.storage import glob_uris, read_bytes, read_json, write_json_atomic

OMICS_DATASET = dg.AssetKey(["cell", "omics_dataset"])


def latest_dataset(storage_root_uri: str) -> dict:
    """The pointer the omics_dataset asset publishes: {version, matrix_version, uri}."""
    return read_json(posixpath.join(storage_root_uri, "latest.json"))


def load_validated_effects(curated_assays_uri: str) -> pd.DataFrame:
    """Every validated drop's effects under a lab's curated zone (sealed tables opened with its key)."""
    frames = [pd.read_parquet(io.BytesIO(read_bytes(uri))) for uri in glob_uris(posixpath.join(curated_assays_uri, "*", "effects.parquet"))]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["perturbation", "effect", "drop_id"])


@dg.asset(
    key=OMICS_DATASET,
    # A lab's training set reads every validated drop under the lab's own curated zone. Dagster has
    # no mapping from a lab's drops (`<lab>/<drop_id>`) to the lab's partition, and the built-in
    # ones would either cross labs (All) or name a partition no drop has (Identity), so the
    # partitions are not linked: the graph keeps the edge, and each version's `lineage` names the
    # drops it was made from.
    deps=[dg.AssetDep(VALIDATED_ASSAY, partition_mapping=dg.SpecificPartitionsPartitionMapping([]))],
    partitions_def=cell_tenants,
    group_name="cell_dataset",
    kinds={"anndata", "zarr"},
)
def omics_dataset(context: dg.AssetExecutionContext, storage: StorageResource) -> dg.MaterializeResult:
    """A lab's training set: real PBMC single-cell expression (700 cells) with each gene's measured
    knock-down effect from every validated plate the lab has sent so far (one partition per lab;
    no lab's plates ever join another's set).

    Stored as AnnData on zarr; open it with `anndata.read_zarr(<path>)`. Each version is named by
    a hash of its content, so the same plates always give the same version, and is registered in
    the data registry: `sinewgrid data get cell/omics <version> DEST` (or plain `dvc get`, see
    `get_command`) gives it back anywhere. `lineage` shows the drops it was made from.
    """
    store = storage.for_tenant(context.partition_key)
    effects = load_validated_effects(store.curated(KIND))
    labels = gene_labels(effects)
    dataset = join_labels(load_reference_expression(), labels)
    zarr_uri, written = publish_dataset(dataset, store.curated("omics"))
    drops = sorted(set(effects["drop_id"])) if len(effects) else []
    registered, version_metadata = publish_version(
        store, "cell/omics", dataset.version, posixpath.dirname(zarr_uri),
        title="PBMC expression joined with assay labels (AnnData on zarr)",
        inputs=[f"cell/assays@{d}" for d in drops],
        facts={"cells": int(dataset.adata.n_obs), "genes": int(dataset.adata.n_vars), "matrix_version": dataset.matrix_version},
        tenant=context.partition_key,
    )
    write_json_atomic(
        posixpath.join(store.curated("omics"), "latest.json"),
        {"version": dataset.version, "matrix_version": dataset.matrix_version, "uri": zarr_uri, "ref": registered.ref},
    )
    if dataset.unmatched_genes:
        named = "" if sealed_tenant(store.root) else ": " + ", ".join(dataset.unmatched_genes[:20])  # which genes a lab assayed is its data
        context.log.warning(f"{len(dataset.unmatched_genes)} assayed genes are not in the expression matrix and carry no label{named}")
    var = dataset.adata.var
    labelled = var[var["assay_n"] > 0].sort_values("assay_effect", ascending=False)
    return dg.MaterializeResult(
        metadata={
            "version": dataset.version,
            "tenant": context.partition_key,
            "path": dg.MetadataValue.path(zarr_uri),
            "newly_written": written,
            "cells": dataset.adata.n_obs,
            "genes": dataset.adata.n_vars,
            "labelled_genes": len(labelled),
            "drops": len(drops),
            "unmatched_genes": len(dataset.unmatched_genes),
            "strongest_effects": table_or_count(
                store.root, labelled[["assay_effect", "assay_sd", "assay_n"]].head(10).round(3).rename_axis("gene").reset_index(),
                "strongest per-gene effects", zarr_uri,
            ),
            **version_metadata,
        },
        data_version=dg.DataVersion(dataset.version),
    )
