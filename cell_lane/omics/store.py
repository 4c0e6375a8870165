"""Write, read and publish omics datasets: AnnData on zarr format 3, sparse X kept sparse.

Layout of the expression matrix (`X`, and any layer), chosen for the reads training does. Training
reads cells in row blocks; in CSR the cells [a, b) are one contiguous run of `X/data` and
`X/indices` (from `indptr[a]` to `indptr[b]`), so a block read touches only the chunks that run
spans:

- **chunks of 2**18 values** (1 MiB of float32 values or int32 indices): at ~1,000 non-zeros per
  cell (5 % of 20,000 genes) a chunk holds ~260 cells, so a batch of 64–256 cells decompresses one
  or two chunks, and a block never reads more than one chunk's worth of other cells at each end;
- **shards of 64 chunks** (64 MiB of values per file or object): a 100,000 × 20,000 set at 5 %
  is ~14 files for X instead of ~760 chunk files, object stores prefer objects of tens of MB, and a
  reader still fetches single chunks by byte range through the shard index. A writer holds one
  shard in memory while it encodes it.

A dense `X` is stored dense (what was handed in is what is written), as row blocks of the same
size: chunks of ⌊2**18 / genes⌋ whole rows, 64 chunks to a shard.

**A tenant's dataset is sealed** (issue 17): when this process holds a keyring for the storage
root the dataset is written under (`runtime.tenant_access.keyring_for(uri)`), every object of it —
chunks and metadata alike — is sealed with one data key for the version (`sealing.SealedStore`),
in the same layout: a sealed shard is opened by frames, so a reader that fetches one chunk out of
a shard by byte range reads and opens only the frames that hold it (`sealing.py` says more). Readers
(`read_dataset`, and `anndata.read_zarr(dataset_store(uri))`) see whether a dataset is sealed from
its root `zarr.json` (one read of its first 8 bytes) and open it with the tenant's key this process
holds; a dataset is sealed or plain as a whole. Without a keyring nothing changes: zarr's own
store, shards, no wrapper. The version (a hash of the data, `version.py`) is the same either way.
"""

from __future__ import annotations

import posixpath
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np
import scipy.sparse as sp
import zarr

from cell_lane.omics.labels import JoinedDataset
from cell_lane.omics.sealing import ROOT_METADATA, SealedStore, sealing_store
from workload_runtime.storage import exists, fs_for, write_json_atomic
from workload_runtime.tenant_access import check_seal, keyring_for, opener
from workload_runtime.envelope import is_sealed
from workload_runtime.keys import Keyring

ZARR_FORMAT = 3  # explicit, so stored data never changes format with an anndata upgrade


@dataclass(frozen=True)
class XLayout:
    """Chunk and shard sizes of the matrices of a dataset (see the module docstring for why)."""

    chunk_values: int = 1 << 18
    shard_chunks: int = 64

    def __post_init__(self) -> None:
        for name in ("chunk_values", "shard_chunks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"XLayout.{name} must be a whole number of at least 1; got {value!r}"
                )

    def dataset_kwargs(self, matrix: Any) -> dict[str, tuple[int, ...]]:
        """`chunks` and `shards` for anndata's writer: 1-D runs for sparse, whole-row blocks for dense."""
        if sp.issparse(matrix):
            return {"chunks": (self.chunk_values,), "shards": (self.chunk_values * self.shard_chunks,)}
        shape = np.shape(matrix)
        if len(shape) != 2:
            return {}
        rows = max(1, self.chunk_values // max(1, shape[1]))
        width = max(1, shape[1])
        return {"chunks": (rows, width), "shards": (rows * self.shard_chunks, width)}


def _is_matrix(elem_name: str) -> bool:
    name = elem_name.strip("/")
    return name == "X" or (name.startswith("layers/") and name.count("/") == 1)


def _write_local(adata: ad.AnnData, path: str, layout: XLayout, keyring: Keyring | None = None) -> None:
    store: Any = path
    if keyring is not None:  # every object sealed with one data key (the module docstring)
        Path(path).mkdir(parents=True, exist_ok=True)
        store = sealing_store(zarr.storage.LocalStore(path), keyring, where=path)
    group = zarr.open_group(store, mode="w", zarr_format=ZARR_FORMAT)
    group.attrs.update({"encoding-type": "anndata", "encoding-version": "0.1.0"})

    def write(
        write_func, store, elem_name: str, elem, *, dataset_kwargs, iospec
    ) -> None:
        if _is_matrix(elem_name):
            dataset_kwargs = {**layout.dataset_kwargs(elem), **dataset_kwargs}
        write_func(store, elem_name, elem, dataset_kwargs=dataset_kwargs)

    # Explicit shards for the matrices; anndata's automatic sharding off for the small rest.
    # Column indices in the smallest unsigned dtype that holds every gene (uint16 below 65,536
    # genes): half the bytes of int32 to compress, store and read; readers get the same matrix.
    with ad.settings.override(
        zarr_write_format=ZARR_FORMAT,
        auto_shard_zarr_v3=False,
        write_csr_csc_indices_with_min_possible_dtype=True,
    ):
        ad.experimental.write_dispatched(group, "/", adata, callback=write)
    zarr.consolidate_metadata(group.store)


def write_dataset(adata: ad.AnnData, uri: str, *, layout: XLayout = XLayout()) -> None:
    """Write AnnData to zarr at `uri` (zarr format 3); `adata` is not modified.

    Sparse `X` is written as anndata's CSR/CSC group (`data`, `indices`, `indptr`), chunked and
    sharded by `layout`. Strings stay strings (anndata's `write_zarr` would turn them into
    categoricals in the caller's object). To an object store it is written to a local temporary
    folder first and uploaded in one batched `put`: anndata writes element by element, one request
    after another, which is several times slower over the network.

    Under a tenant's root whose keyring this process holds, every object is sealed before it is
    written, the whole dataset with one data key (the module docstring says how and why).
    """
    keyring = keyring_for(uri)
    if "://" not in uri:
        _write_local(adata, uri, layout, keyring)
        return
    fs, path = fs_for(uri)
    with tempfile.TemporaryDirectory(prefix="sinewgrid-zarr-") as tmp:
        _write_local(adata, posixpath.join(tmp, "dataset.zarr"), layout, keyring)
        fs.put(posixpath.join(tmp, "dataset.zarr"), path, recursive=True)


def is_sealed_dataset(uri: str) -> bool:
    """Whether the dataset at `uri` is sealed: its root `zarr.json` starts with the sealed marker."""
    fs, path = fs_for(posixpath.join(uri, ROOT_METADATA))
    try:
        with fs.open(path, "rb") as fh:
            head = fh.read(16)
    except FileNotFoundError:
        return False  # not a dataset at all: zarr says so in its own words
    return is_sealed(head)


def dataset_store(uri: str) -> Any:
    """What to open the dataset at `uri` with, read-only: zarr's own store, or for a sealed dataset
    that store wrapped to open each object with the tenant's key this process holds.

    `anndata.read_zarr(dataset_store(uri))` reads a sealed dataset as it reads a plain one.
    """
    remote = "://" in uri
    if not is_sealed_dataset(uri):
        if exists(posixpath.join(uri, ROOT_METADATA)):
            check_seal(posixpath.join(uri, ROOT_METADATA), b"")  # a plain dataset under a tenant's root is refused
        return zarr.storage.FsspecStore.from_url(uri, read_only=True) if remote else uri
    inner = zarr.storage.FsspecStore.from_url(uri, read_only=True) if remote else zarr.storage.LocalStore(uri, read_only=True)
    return SealedStore(inner, opener=opener(), where=uri)  # one Opener: the data key unwrapped once


def read_dataset(uri: str, *, lazy_x: bool = False) -> ad.AnnData:
    """Open the dataset at `uri`. Every workload opens its dataset here.

    By default everything is read into memory, a sparse `X` as a scipy CSR matrix (1.2 GB for
    100,000 cells × 20,000 genes at 5 % non-zero, where the dense matrix is 8 GB). With
    `lazy_x=True` only obs, var and uns are read; `X` stays in the store as anndata's backed
    sparse dataset (or a zarr array when dense), and `adata.X[a:b]` reads only the chunks that row
    block spans. Use it when only the annotations are needed, or to stream a matrix larger than
    memory block by block.

    A sealed dataset (a tenant's) is opened with the tenant's key this process holds: a
    `KeyUnavailable` names the tenant and the key when it holds none or the key is disabled.
    """
    store = dataset_store(uri)
    if not lazy_x:
        adata = ad.read_zarr(store)
        if sp.issparse(adata.X) and adata.X.indices.dtype.kind == "u":
            # Stored as the smallest unsigned dtype; scipy's own index dtype is safer downstream.
            adata.X.indices = adata.X.indices.astype(np.int32)
        return adata
    group = zarr.open_group(store, mode="r")
    parts = {
        key: ad.io.read_elem(group[key])
        for key in ("obs", "var", "uns")
        if key in group
    }
    x_node = group.get("X")
    x: Any = ad.io.sparse_dataset(x_node) if isinstance(x_node, zarr.Group) else x_node
    return ad.AnnData(X=x, **parts)


def publish_dataset(
    dataset: JoinedDataset, base_uri: str, *, layout: XLayout = XLayout()
) -> tuple[str, bool]:
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
    write_dataset(dataset.adata, zarr_uri, layout=layout)
    x = dataset.adata.X
    write_json_atomic(
        manifest_uri,
        {
            "version": dataset.version,
            "matrix_version": dataset.matrix_version,
            "format": f"anndata-zarr (zarr v{ZARR_FORMAT})",
            "n_cells": int(dataset.adata.n_obs),
            "n_genes": int(dataset.adata.n_vars),
            "x_encoding": "csr"
            if sp.issparse(x) and x.format == "csr"
            else ("csc" if sp.issparse(x) else "dense"),
            "x_stored_values": int(x.nnz)
            if sp.issparse(x)
            else int(np.prod(np.shape(x))),
            "n_labelled_genes": int((dataset.adata.var["assay_n"] > 0).sum()),
            "zarr": "dataset.zarr",
        },
    )
    return zarr_uri, True
