"""The omics training set: real PBMC single-cell expression joined with assay results per gene.

Written as AnnData on zarr (format pinned), versioned by a hash of its content, so the
same inputs always give the same version and a new assay round gives a new one.
"""

from __future__ import annotations

import hashlib
import posixpath
import tempfile
import warnings
from dataclasses import dataclass

import anndata as ad
import numpy as np
import pandas as pd

from shared_resources.runtime.storage import fs_for, write_json_atomic

ZARR_FORMAT = 3  # explicit, so stored data never changes format with an anndata upgrade
LABEL_COLUMNS = ("assay_effect", "assay_sd", "assay_n", "assay_drops")


def load_reference_expression() -> ad.AnnData:
    """scanpy's bundled PBMC matrix (700 cells × 765 genes), cleaned with scanpy QC.

    The bundled `.raw` holds library-size-normalised, log1p expression; we keep it as
    `X`, recompute QC metrics, and drop cells and genes that carry no signal.
    """
    import scanpy as sc

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bundled = sc.datasets.pbmc68k_reduced()
    adata = ad.AnnData(
        X=np.asarray(bundled.raw.X.todense(), dtype=np.float32),
        obs=bundled.obs[["bulk_labels", "louvain", "phase"]].copy(),
        var=pd.DataFrame(index=bundled.raw.var_names.copy()),
    )
    adata.var_names_make_unique()
    sc.pp.calculate_qc_metrics(adata, percent_top=None, log1p=False, inplace=True)
    sc.pp.filter_cells(adata, min_genes=50)
    sc.pp.filter_genes(adata, min_cells=10)
    adata.layers["scaled"] = sc.pp.scale(adata.X.copy(), max_value=10)
    adata.obs = adata.obs.astype({"bulk_labels": "category", "louvain": "category", "phase": "category"})
    return adata


def gene_labels(effects: pd.DataFrame) -> pd.DataFrame:
    """Per-gene assay labels from normalised well effects (0 = negative control, 1 = positive)."""
    if effects.empty:
        return pd.DataFrame(columns=list(LABEL_COLUMNS)).rename_axis("gene")
    grouped = effects.groupby("perturbation")
    labels = pd.DataFrame(
        {
            "assay_effect": grouped["effect"].mean(),
            "assay_sd": grouped["effect"].std(ddof=1).fillna(0.0),
            "assay_n": grouped["effect"].size(),
            "assay_drops": grouped["drop_id"].agg(lambda s: ",".join(sorted(set(s)))),
        }
    )
    return labels.rename_axis("gene")


@dataclass(frozen=True)
class JoinedDataset:
    adata: ad.AnnData
    version: str
    matrix_version: str  # hash of the expression alone: pretraining depends on nothing else
    unmatched_genes: list[str]


def join_labels(expression: ad.AnnData, labels: pd.DataFrame) -> JoinedDataset:
    """Attach assay labels to the genes of the matrix and give the result a content version."""
    adata = expression.copy()
    joined = labels.reindex(columns=list(LABEL_COLUMNS)).reindex(adata.var_names)
    adata.var["assay_effect"] = pd.to_numeric(joined["assay_effect"]).astype("float64").to_numpy()
    adata.var["assay_sd"] = pd.to_numeric(joined["assay_sd"]).astype("float64").to_numpy()
    adata.var["assay_n"] = pd.to_numeric(joined["assay_n"]).fillna(0).astype("int64").to_numpy()
    adata.var["assay_drops"] = joined["assay_drops"].fillna("").astype(str).to_numpy()
    unmatched = sorted(set(labels.index) - set(adata.var_names))
    matrix_hash = hashlib.sha256()
    matrix_hash.update(np.ascontiguousarray(adata.X).tobytes())
    matrix_hash.update("\n".join(adata.obs_names).encode())
    matrix_hash.update("\n".join(adata.var_names).encode())
    full_hash = matrix_hash.copy()
    full_hash.update(adata.var[list(LABEL_COLUMNS)].to_csv().encode())
    version = full_hash.hexdigest()[:16]
    matrix_version = matrix_hash.hexdigest()[:16]
    adata.uns["sinewgrid"] = {"version": version, "matrix_version": matrix_version, "source": "scanpy pbmc68k_reduced (.raw)"}
    return JoinedDataset(adata, version, matrix_version, unmatched)


def _zarr_store(uri: str):
    if "://" not in uri:
        return uri
    import zarr

    return zarr.storage.FsspecStore.from_url(uri)


def write_dataset(adata: ad.AnnData, uri: str) -> None:
    """Write AnnData to zarr at `uri` (zarr format 3).

    To an object store it is written to a local temporary folder first and uploaded in one
    batched `put`: anndata writes element by element, one request after another, which is
    several times slower over the network.
    """
    with ad.settings.override(zarr_write_format=ZARR_FORMAT, auto_shard_zarr_v3=False):
        if "://" not in uri:
            adata.write_zarr(uri)
            return
        fs, path = fs_for(uri)
        with tempfile.TemporaryDirectory(prefix="sinewgrid-zarr-") as tmp:
            adata.write_zarr(posixpath.join(tmp, "dataset.zarr"))
            fs.put(posixpath.join(tmp, "dataset.zarr"), path, recursive=True)


def read_dataset(uri: str) -> ad.AnnData:
    return ad.read_zarr(_zarr_store(uri))


def publish_dataset(dataset: JoinedDataset, base_uri: str) -> tuple[str, bool]:
    """Write a dataset version under `base_uri/<version>/`, manifest last. Returns (zarr uri, newly written)."""
    folder = posixpath.join(base_uri, dataset.version)
    zarr_uri = posixpath.join(folder, "dataset.zarr")
    manifest_uri = posixpath.join(folder, "manifest.json")
    fs, manifest_path = fs_for(manifest_uri)
    if fs.exists(manifest_path):
        return zarr_uri, False
    zfs, zpath = fs_for(zarr_uri)
    if zfs.exists(zpath):  # a writer died before publishing: start that version again
        zfs.rm(zpath, recursive=True)
    write_dataset(dataset.adata, zarr_uri)
    write_json_atomic(
        manifest_uri,
        {
            "version": dataset.version,
            "matrix_version": dataset.matrix_version,
            "format": f"anndata-zarr (zarr v{ZARR_FORMAT})",
            "n_cells": int(dataset.adata.n_obs),
            "n_genes": int(dataset.adata.n_vars),
            "n_labelled_genes": int((dataset.adata.var["assay_n"] > 0).sum()),
            "zarr": "dataset.zarr",
        },
    )
    return zarr_uri, True
