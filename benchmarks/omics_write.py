"""Figure 2: omics dataset write throughput (MB/s of the sparse expression matrix).

The project's writer, ``cell_lane.omics.write_dataset`` (AnnData on zarr format 3, X as anndata's
CSR group, chunked and sharded by ``cell_lane.omics.XLayout``), is timed against a plain zarr write
of the same three CSR arrays: ``zarr.create_array(store=path, name=..., data=X.data | X.indices |
X.indptr, zarr_format=3)`` with zarr's default chunking and compression. Each repetition writes
into a fresh temporary folder that is made and removed outside the timed region.

Cases: the reference PBMC set as the pipeline publishes it, and a generated 100,000 × 20,000
matrix at 5 % non-zero (seeded; see ``sparse_expression``) with 100,000 cell names and 20,000 gene
names. Throughput is the bytes of X's three arrays ÷ seconds, in MB (10**6 bytes) per second, for
both. The writer also writes obs, var, uns and consolidated metadata: that is part of what it costs
to publish a dataset, so it is in its time, but only X counts as bytes moved.

Before timing, each case is written once both ways and read back: the writer's X must read back
equal to the matrix (through ``read_dataset``), the plain arrays equal to the CSR arrays. The
stored layouts, bytes on disk and file counts of both go to the JSON.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp
import zarr

from benchmarks import REPEATS, Timing, time_pair
from cell_lane.omics import (
    ZARR_FORMAT,
    XLayout,
    join_labels,
    load_reference_expression,
    read_dataset,
    write_dataset,
)

MB = 1_000_000
LARGE_CELLS, LARGE_GENES, LARGE_DENSITY, SEED = 100_000, 20_000, 0.05, 20261202
CSR_ARRAYS = ("data", "indices", "indptr")


def sparse_expression(
    n_cells: int, n_genes: int, density: float, seed: int
) -> sp.csr_matrix:
    """A CSR float32 matrix whose every cell is non-zero with probability `density`, values U[0, 1).

    The same kind of matrix as ``scipy.sparse.random`` (uniform positions, uniform values), made
    faster: the flat positions of the non-zeros are a running sum of geometric gaps (Bernoulli
    trials), drawn for blocks of rows at a time so no array is larger than the result.
    """
    rng = np.random.default_rng(seed)
    rows_per_block = max(1, (1 << 30) // n_genes)  # flat positions in a block fit int32
    values, indices, counts = [], [], []
    for first in range(0, n_cells, rows_per_block):
        rows = min(rows_per_block, n_cells - first)
        cells = rows * n_genes
        expected = cells * density
        draws = int(expected + 8 * np.sqrt(expected) + 100)
        ends = np.cumsum(rng.geometric(density, size=draws), dtype=np.int64)
        if ends[-1] <= cells:
            raise RuntimeError(
                "sparse_expression drew too few gaps for a block; raise the margin"
            )
        position = (ends[: np.searchsorted(ends, cells, side="right")] - 1).astype(
            np.int32
        )
        row = position // np.int32(n_genes)
        position -= row * np.int32(n_genes)
        indices.append(position)
        counts.append(np.bincount(row, minlength=rows))
        values.append(rng.random(len(position), dtype=np.float32))
    indptr = np.zeros(n_cells + 1, dtype=np.int64)
    np.cumsum(np.concatenate(counts), out=indptr[1:])
    return sp.csr_matrix(
        (np.concatenate(values), np.concatenate(indices), indptr),
        shape=(n_cells, n_genes),
    )


@dataclass
class OmicsCase:
    name: str
    adata: ad.AnnData

    @property
    def matrix(self) -> sp.csr_matrix:
        return self.adata.X

    @property
    def matrix_bytes(self) -> int:
        return int(sum(getattr(self.matrix, name).nbytes for name in CSR_ARRAYS))


@dataclass
class OmicsResult:
    case: OmicsCase
    writer: Timing
    zarr_write: Timing
    layout: dict[str, Any]

    @property
    def writer_mb_per_s(self) -> float:
        return self.case.matrix_bytes / MB / self.writer.median

    @property
    def zarr_mb_per_s(self) -> float:
        return self.case.matrix_bytes / MB / self.zarr_write.median

    @property
    def cost_multiple(self) -> float:
        """Writer time as a multiple of the plain zarr write time (1.0 = no extra cost)."""
        return self.writer.median / self.zarr_write.median

    @property
    def speed_ratio(self) -> float:
        """Writer throughput as a fraction of plain zarr's (the issue's target: at least 0.7)."""
        return self.zarr_write.median / self.writer.median

    def to_dict(self) -> dict[str, Any]:
        matrix = self.case.matrix
        return {
            "case": self.case.name,
            "shape": list(matrix.shape),
            "nnz": int(matrix.nnz),
            "density": matrix.nnz / (matrix.shape[0] * matrix.shape[1]),
            "dtypes": {name: str(getattr(matrix, name).dtype) for name in CSR_ARRAYS},
            "matrix_bytes": self.case.matrix_bytes,
            "zarr_format": ZARR_FORMAT,
            "layout": self.layout,
            "writer": {
                "function": "cell_lane.omics.write_dataset(adata, path)",
                "mb_per_s": self.writer_mb_per_s,
                **self.writer.to_dict(),
            },
            "baseline": {
                "function": f"zarr.create_array(store=path, name=a, data=X.a, zarr_format={ZARR_FORMAT}) "
                "for a in data, indices, indptr",
                "mb_per_s": self.zarr_mb_per_s,
                **self.zarr_write.to_dict(),
            },
            "ratio_writer_over_baseline": self.cost_multiple,
            "throughput_ratio_writer_over_baseline": self.speed_ratio,
        }


def build_cases() -> tuple[list[OmicsCase], float]:
    """The reference dataset as the pipeline writes it and the generated large one; plus the load time."""
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = join_labels(load_reference_expression(), pd.DataFrame()).adata
    load_s = time.perf_counter() - start
    matrix = sparse_expression(LARGE_CELLS, LARGE_GENES, LARGE_DENSITY, SEED)
    large = ad.AnnData(
        X=matrix,
        obs=pd.DataFrame(index=pd.Index([f"cell-{i}" for i in range(LARGE_CELLS)])),
        var=pd.DataFrame(index=pd.Index([f"gene-{j}" for j in range(LARGE_GENES)])),
    )
    return [
        OmicsCase("reference PBMC", reference),
        OmicsCase(
            f"generated {LARGE_CELLS:,} × {LARGE_GENES:,} at {LARGE_DENSITY:.0%}", large
        ),
    ], load_s


def plain_zarr_write(matrix: sp.csr_matrix, path: str) -> None:
    """The baseline: the CSR's three arrays as plain zarr arrays, zarr's defaults for everything else."""
    for name in CSR_ARRAYS:
        zarr.create_array(
            store=path, name=name, data=getattr(matrix, name), zarr_format=ZARR_FORMAT
        )


def _array_layout(array: zarr.Array) -> dict[str, Any]:
    return {
        "shape": list(array.shape),
        "dtype": str(array.dtype),
        "chunks": list(array.chunks),
        "shards": None if array.shards is None else list(array.shards),
        "compressors": [repr(c) for c in array.compressors],
    }


def _stored(folder: Path) -> dict[str, int]:
    files = [p for p in folder.rglob("*") if p.is_file()]
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def _check_and_describe(case: OmicsCase, folder: Path) -> dict[str, Any]:
    """Write both once, check that each reads back equal to the matrix, describe what was stored."""
    writer_path, plain_path = folder / "dataset.zarr", folder / "plain.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_dataset(case.adata, str(writer_path))
        plain_zarr_write(case.matrix, str(plain_path))
        back = read_dataset(str(writer_path)).X
        if not sp.issparse(back) or back.format != "csr" or (back != case.matrix).nnz:
            raise RuntimeError(
                f"'{case.name}': the writer's X does not read back equal to adata.X (as CSR)"
            )
        for name in CSR_ARRAYS:
            if not np.array_equal(
                zarr.open_array(str(plain_path), path=name, mode="r")[...],
                getattr(case.matrix, name),
            ):
                raise RuntimeError(
                    f"'{case.name}': the plain zarr array '{name}' does not read back equal"
                )
        return {
            "writer_X": {
                name: _array_layout(
                    zarr.open_array(str(writer_path), path=f"X/{name}", mode="r")
                )
                for name in CSR_ARRAYS
            },
            "baseline": {
                name: _array_layout(
                    zarr.open_array(str(plain_path), path=name, mode="r")
                )
                for name in CSR_ARRAYS
            },
            "writer_layout": {
                "chunk_values": XLayout().chunk_values,
                "shard_chunks": XLayout().shard_chunks,
            },
            "writer_stored": _stored(writer_path),
            "writer_X_stored": _stored(writer_path / "X"),
            "baseline_stored": _stored(plain_path),
        }


class _FreshFolder:
    """Hands out a new empty folder per repetition (outside the timed region) and removes it after."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.current: Path | None = None

    def make(self) -> None:
        self.current = Path(tempfile.mkdtemp(dir=self.root))

    def remove(self) -> None:
        if self.current is not None:
            shutil.rmtree(self.current, ignore_errors=True)
            self.current = None

    def path(self, name: str) -> str:
        assert self.current is not None
        return str(self.current / name)


def _quiet(fn: Callable[[], Any]) -> Callable[[], Any]:
    def call() -> Any:
        with warnings.catch_warnings():
            # zarr warns that consolidated metadata is not in the v3 spec; noise here.
            warnings.simplefilter("ignore")
            return fn()

    return call


def run(repeats: int = REPEATS) -> tuple[list[OmicsResult], float]:
    cases, load_s = build_cases()
    results = []
    root = Path(tempfile.mkdtemp(prefix="sinewgrid-bench-omics-"))
    try:
        for case in cases:
            check_folder = Path(tempfile.mkdtemp(dir=root))
            layout = _check_and_describe(case, check_folder)
            shutil.rmtree(check_folder, ignore_errors=True)

            adata, matrix = case.adata, case.matrix
            folder = _FreshFolder(root)
            writer, plain = time_pair(
                _quiet(
                    lambda a=adata, f=folder: write_dataset(a, f.path("dataset.zarr"))
                ),
                _quiet(
                    lambda m=matrix, f=folder: plain_zarr_write(m, f.path("plain.zarr"))
                ),
                repeats=repeats,
                before_each=folder.make,
                after_each=folder.remove,
            )
            results.append(OmicsResult(case, writer, plain, layout))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results, load_s
