"""Dense training batches cut from the expression matrix, one batch at a time.

Training keeps `X` sparse (in memory as CSR, or in the store) and densifies only the rows of the
batch it is about to use: a 100,000 × 20,000 matrix at 5 % non-zero is 1.2 GB as CSR and 8 GB
dense, and a batch of 64 cells is 5 MB dense.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp


def dense_rows(matrix: Any, rows: np.ndarray) -> np.ndarray:
    """The given rows of `matrix` (dense, scipy sparse, or anndata's backed sparse) as dense float32.

    Rows may repeat and come in any order; the result has one row per entry of `rows`, in order.
    """
    rows = np.asarray(rows, dtype=np.int64)
    if rows.ndim != 1:
        raise ValueError(
            f"rows must be a 1-D array of row numbers; got shape {rows.shape}"
        )
    if isinstance(matrix, np.ndarray):
        return np.asarray(matrix[rows], dtype=np.float32)
    if sp.issparse(matrix):
        return np.asarray(sp.csr_matrix(matrix)[rows].toarray(), dtype=np.float32)
    # A backed matrix: read each distinct row once, in storage order, then put them in batch order.
    unique, order = np.unique(rows, return_inverse=True)
    block = matrix[unique]
    dense = block.toarray() if sp.issparse(block) else np.asarray(block)
    return np.asarray(dense[order], dtype=np.float32)
