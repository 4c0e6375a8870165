"""The omics training set: single-cell expression (AnnData on zarr v3) joined with assay results.

- `reference` — the real PBMC matrix the pipeline starts from (`load_reference_expression`);
- `labels` — per-gene assay labels and the join that gives a dataset its version;
- `version` — the content hash of an expression matrix, sparse or dense, never densified;
- `store` — write, read and publish a version (sparse X kept sparse, chunked for row blocks);
- `sealing` — a tenant's dataset sealed object by object with its key (a zarr store wrapper);
- `batches` — dense training batches cut from a sparse matrix, one batch at a time.
"""

from cell_lane.omics.batches import dense_rows
from cell_lane.omics.labels import (
    LABEL_COLUMNS,
    JoinedDataset,
    gene_labels,
    join_labels,
)
from cell_lane.omics.reference import load_reference_expression
from cell_lane.omics.store import (
    ZARR_FORMAT,
    XLayout,
    dataset_store,
    is_sealed_dataset,
    publish_dataset,
    read_dataset,
    write_dataset,
)
from cell_lane.omics.version import matrix_digest

__all__ = [
    "LABEL_COLUMNS",
    "ZARR_FORMAT",
    "JoinedDataset",
    "XLayout",
    "dataset_store",
    "dense_rows",
    "gene_labels",
    "is_sealed_dataset",
    "join_labels",
    "load_reference_expression",
    "matrix_digest",
    "publish_dataset",
    "read_dataset",
    "write_dataset",
]
