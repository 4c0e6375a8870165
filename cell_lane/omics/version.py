"""The content hash of an expression matrix: the same values give the same version, whatever the storage.

The matrix is hashed in its canonical sparse form, row block by row block, so a 100,000 × 20,000
sparse matrix is never densified and a dense matrix hashes to the same digest as its CSR twin
(explicit zeros count as zeros; duplicate entries are summed, as every reader does). Three byte
streams are hashed separately — non-zeros per row (int64), column indices (uint32) and values (the
matrix's own dtype), all little-endian — so the digest does not depend on the block size.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import scipy.sparse as sp

SCHEME = b"sinewgrid expression hash v2: canonical CSR\n"
BLOCK_VALUES = (
    1 << 22
)  # about this many matrix cells per block: bounded memory, whatever the size


def _canonical_block(block: Any, dtype: np.dtype) -> sp.csr_matrix:
    """A row block as canonical CSR in `dtype`, never modifying what it was cut from."""
    if sp.issparse(block):
        csr = sp.csr_matrix(block, dtype=dtype, copy=True)
    else:
        csr = sp.csr_matrix(np.asarray(block, dtype=dtype))
    csr.sum_duplicates()
    csr.eliminate_zeros()
    return csr


def _stored_values(matrix: Any) -> int:
    """How many values the matrix stores: non-zeros when sparse (in memory or backed), all when dense."""
    if sp.issparse(matrix):
        return int(matrix.nnz)
    group = getattr(matrix, "group", None)  # anndata's backed sparse dataset
    if group is not None and "data" in group:
        return int(group["data"].shape[0])
    return int(np.prod(matrix.shape))


def matrix_digest(matrix: Any, obs_names: Any, var_names: Any) -> hashlib._Hash:
    """A sha256 object over the matrix's values and its cell and gene names (copy it to add more).

    `matrix` may be dense (numpy), any scipy sparse matrix or array, or anndata's backed sparse
    dataset; it is read in row blocks of about `BLOCK_VALUES` stored values (non-zeros when sparse).
    """
    n_obs, n_vars = matrix.shape
    if n_vars >= 2**32:
        raise ValueError(
            f"the expression matrix has {n_vars} genes; the content hash supports fewer than 2**32"
        )
    dtype = np.dtype(matrix.dtype)
    counts, indices, values = hashlib.sha256(), hashlib.sha256(), hashlib.sha256()
    rows_per_block = max(
        1, BLOCK_VALUES // max(1, _stored_values(matrix) // max(1, n_obs))
    )
    for start in range(0, n_obs, rows_per_block):
        block = _canonical_block(matrix[start : start + rows_per_block], dtype)
        counts.update(np.ascontiguousarray(np.diff(block.indptr), dtype="<i8"))
        indices.update(np.ascontiguousarray(block.indices, dtype="<u4"))
        values.update(np.ascontiguousarray(block.data, dtype=dtype.newbyteorder("<")))
    digest = hashlib.sha256(SCHEME)
    digest.update(f"{n_obs}x{n_vars} {dtype.name}\n".encode())
    for stream in (counts, indices, values):
        digest.update(stream.digest())
    digest.update("\n".join(map(str, obs_names)).encode())
    digest.update(b"\0")
    digest.update("\n".join(map(str, var_names)).encode())
    return digest
