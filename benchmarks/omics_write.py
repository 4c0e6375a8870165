"""Figure 2: omics dataset write throughput (MB/s of the expression matrix).

The project's writer, ``cell_lane.omics.write_dataset`` (AnnData on zarr
format 3), is timed against a plain ``zarr.create_array(..., zarr_format=3)``
of the same dense ``adata.X`` matrix, with zarr's default chunking and
compression (the same defaults the writer gets for ``X``; the benchmark checks
this and records both in the JSON). Each repetition writes into a fresh
temporary folder that is made and removed outside the timed region.

Throughput is ``adata.X.nbytes / seconds`` for both, in MB (10**6 bytes) per
second. The writer also writes everything else in the dataset (the ``scaled``
layer, which is as big as ``X``, obs, var, uns and consolidated metadata);
that is part of what it costs to publish a dataset, so it is in its time, but
only ``X`` counts as the bytes moved. The JSON also records all array bytes.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import anndata as ad
import numpy as np
import pandas as pd
import zarr

from benchmarks import REPEATS, Timing, time_pair
from cell_lane.omics import ZARR_FORMAT, join_labels, load_reference_expression, write_dataset

TILE = 8
MB = 1_000_000


@dataclass
class OmicsCase:
    name: str
    adata: ad.AnnData

    @property
    def matrix(self) -> np.ndarray:
        return np.asarray(self.adata.X)

    @property
    def matrix_bytes(self) -> int:
        return int(self.matrix.nbytes)

    @property
    def array_bytes(self) -> int:
        """X plus every layer: the dense arrays the writer stores."""
        return self.matrix_bytes + sum(int(np.asarray(v).nbytes) for v in self.adata.layers.values())


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

    def to_dict(self) -> dict[str, Any]:
        adata = self.case.adata
        return {
            "case": self.case.name,
            "shape": list(adata.shape),
            "dtype": str(self.case.matrix.dtype),
            "matrix_bytes": self.case.matrix_bytes,
            "writer_array_bytes": self.case.array_bytes,
            "layers": list(adata.layers.keys()),
            "zarr_format": ZARR_FORMAT,
            "layout": self.layout,
            "writer": {
                "function": "cell_lane.omics.write_dataset(adata, path)",
                "mb_per_s": self.writer_mb_per_s,
                **self.writer.to_dict(),
            },
            "baseline": {
                "function": f"zarr.create_array(store=path, data=adata.X, zarr_format={ZARR_FORMAT})",
                "mb_per_s": self.zarr_mb_per_s,
                **self.zarr_write.to_dict(),
            },
            "ratio_writer_over_baseline": self.cost_multiple,
        }


def _tiled(adata: ad.AnnData, times: int) -> ad.AnnData:
    """The same dataset with every cell repeated ``times`` times (unique cell names), same var."""
    obs = pd.concat([adata.obs] * times)
    obs.index = [f"{name}-{k}" for k in range(times) for name in adata.obs_names]
    return ad.AnnData(
        X=np.tile(np.asarray(adata.X), (times, 1)),
        obs=obs,
        var=adata.var.copy(),
        layers={key: np.tile(np.asarray(value), (times, 1)) for key, value in adata.layers.items()},
        uns=dict(adata.uns),
    )


def build_cases() -> tuple[list[OmicsCase], float]:
    """The reference dataset (as the pipeline writes it) and an 8× taller copy; plus the load time."""
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expression = load_reference_expression()
    load_s = time.perf_counter() - start
    dataset = join_labels(expression, pd.DataFrame())
    reference = dataset.adata
    big = _tiled(reference, TILE)
    return [
        OmicsCase("reference PBMC", reference),
        OmicsCase(f"reference × {TILE} cells", big),
    ], load_s


def _array_layout(array: zarr.Array) -> dict[str, Any]:
    return {
        "shape": list(array.shape),
        "chunks": list(array.chunks),
        "shards": None if array.shards is None else list(array.shards),
        "compressors": [repr(c) for c in array.compressors],
        "zarr_format": array.metadata.zarr_format,
    }


def _check_same_matrix_layout(case: OmicsCase, folder: Path) -> dict[str, Any]:
    """Write both once and check that X got the same chunks/compression as the plain array."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_dataset(case.adata, str(folder / "dataset.zarr"))
        zarr.create_array(store=str(folder / "plain.zarr"), data=case.matrix, zarr_format=ZARR_FORMAT)
        written = zarr.open_array(str(folder / "dataset.zarr"), path="X", mode="r")
        plain = zarr.open_array(str(folder / "plain.zarr"), mode="r")
        if not np.array_equal(written[...], case.matrix) or not np.array_equal(plain[...], case.matrix):
            raise RuntimeError(f"'{case.name}': a written matrix does not read back equal to adata.X")
    writer_layout, plain_layout = _array_layout(written), _array_layout(plain)
    return {
        "writer_X": writer_layout,
        "baseline": plain_layout,
        "same_chunks_and_codecs": writer_layout == plain_layout,
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
            layout = _check_same_matrix_layout(case, check_folder)
            shutil.rmtree(check_folder, ignore_errors=True)

            adata, matrix = case.adata, case.matrix
            folder = _FreshFolder(root)
            writer, plain = time_pair(
                _quiet(lambda: write_dataset(adata, folder.path("dataset.zarr"))),
                _quiet(
                    lambda: zarr.create_array(
                        store=folder.path("plain.zarr"), data=matrix, zarr_format=ZARR_FORMAT
                    )
                ),
                repeats=repeats,
                before_each=folder.make,
                after_each=folder.remove,
            )
            results.append(OmicsResult(case, writer, plain, layout))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results, load_s
