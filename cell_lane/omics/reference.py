"""The real expression matrix the cell lane starts from: scanpy's bundled PBMC cells."""

from __future__ import annotations

import warnings

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp


def load_reference_expression() -> ad.AnnData:
    """scanpy's bundled PBMC matrix (700 cells × 765 genes), cleaned with scanpy QC.

    The bundled `.raw` holds library-size-normalised, log1p expression; we keep it as `X`, sparse
    (CSR, float32, indices sorted), recompute QC metrics, and drop cells and genes that carry no
    signal. Nothing derivable is stored beside it: a scaled copy of `X`, for example, is one
    `scanpy.pp.scale(adata.X.toarray())` away and would be as large as the dense matrix.
    """
    import scanpy as sc

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bundled = sc.datasets.pbmc68k_reduced()
    matrix = sp.csr_matrix(bundled.raw.X, dtype=np.float32, copy=True)
    matrix.sum_duplicates()  # sorted indices, each entry once: the canonical form readers expect
    matrix.eliminate_zeros()
    adata = ad.AnnData(
        X=matrix,
        obs=bundled.obs[["bulk_labels", "louvain", "phase"]].copy(),
        var=pd.DataFrame(index=bundled.raw.var_names.copy()),
    )
    adata.var_names_make_unique()
    sc.pp.calculate_qc_metrics(adata, percent_top=None, log1p=False, inplace=True)
    sc.pp.filter_cells(adata, min_genes=50)
    sc.pp.filter_genes(adata, min_cells=10)
    adata.obs = adata.obs.astype(
        {"bulk_labels": "category", "louvain": "category", "phase": "category"}
    )
    return adata
