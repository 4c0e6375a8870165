"""Per-gene assay labels, joined onto the expression matrix to make a versioned training set."""

from __future__ import annotations

from dataclasses import dataclass

import anndata as ad
import pandas as pd

from cell_lane.omics.version import matrix_digest

LABEL_COLUMNS = ("assay_effect", "assay_sd", "assay_n", "assay_drops")


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
    matrix_version: (
        str  # hash of the expression alone: pretraining depends on nothing else
    )
    unmatched_genes: list[str]


def join_labels(expression: ad.AnnData, labels: pd.DataFrame) -> JoinedDataset:
    """Attach assay labels to the genes of the matrix and give the result a content version.

    The expression matrix is shared with `expression`, not copied (a sparse 100k-cell matrix is
    GBs); `expression` itself is left as it was.
    """
    adata = ad.AnnData(
        X=expression.X,
        obs=expression.obs.copy(),
        var=expression.var.copy(),
        uns=dict(expression.uns),
        layers=dict(expression.layers),
        obsm=dict(expression.obsm),
        varm=dict(expression.varm),
        obsp=dict(expression.obsp),
        varp=dict(expression.varp),
    )
    joined = labels.reindex(columns=list(LABEL_COLUMNS)).reindex(adata.var_names)
    adata.var["assay_effect"] = (
        pd.to_numeric(joined["assay_effect"]).astype("float64").to_numpy()
    )
    adata.var["assay_sd"] = (
        pd.to_numeric(joined["assay_sd"]).astype("float64").to_numpy()
    )
    adata.var["assay_n"] = (
        pd.to_numeric(joined["assay_n"]).fillna(0).astype("int64").to_numpy()
    )
    adata.var["assay_drops"] = joined["assay_drops"].fillna("").astype(str).to_numpy()
    unmatched = sorted(set(labels.index) - set(adata.var_names))
    matrix_hash = matrix_digest(adata.X, adata.obs_names, adata.var_names)
    full_hash = matrix_hash.copy()
    full_hash.update(adata.var[list(LABEL_COLUMNS)].to_csv().encode())
    version = full_hash.hexdigest()[:16]
    matrix_version = matrix_hash.hexdigest()[:16]
    adata.uns["sinewgrid"] = {
        "version": version,
        "matrix_version": matrix_version,
        "source": "scanpy pbmc68k_reduced (.raw)",
    }
    return JoinedDataset(adata, version, matrix_version, unmatched)
