"""The omics dataset at scale: sparse X stays sparse on disk, in the hash and in training batches."""

import json
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import zarr
from zarr.abc.store import ByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore, WrapperStore

import cell_lane.omics.version as version_module
from cell_lane.omics import (
    XLayout,
    dense_rows,
    join_labels,
    matrix_digest,
    publish_dataset,
    read_dataset,
    write_dataset,
)


def _expression(
    cells: int = 300, genes: int = 120, density: float = 0.1, seed: int = 0
) -> ad.AnnData:
    matrix = sp.random(
        cells, genes, density=density, format="csr", dtype=np.float32, random_state=seed
    )
    return ad.AnnData(
        X=matrix,
        obs=pd.DataFrame(
            {"donor": [f"d{i % 3}" for i in range(cells)]},
            index=[f"cell-{i}" for i in range(cells)],
        ),
        var=pd.DataFrame(index=[f"gene-{j}" for j in range(genes)]),
    )


def _digest(matrix, names_from: ad.AnnData) -> str:
    return matrix_digest(matrix, names_from.obs_names, names_from.var_names).hexdigest()


# On disk ----------------------------------------------------------------------------------


def test_sparse_x_is_written_sparse_with_the_row_block_layout(tmp_path):
    adata = _expression()
    uri = str(tmp_path / "dataset.zarr")
    write_dataset(adata, uri)

    group = zarr.open_group(uri, mode="r")
    assert group.metadata.zarr_format == 3
    assert group["X"].attrs["encoding-type"] == "csr_matrix" and set(
        group["X"].array_keys()
    ) == {"data", "indices", "indptr"}
    layout = XLayout()
    for name in ("data", "indices", "indptr"):
        array = group["X"][name]
        assert array.chunks == (layout.chunk_values,) and array.shards == (
            layout.chunk_values * layout.shard_chunks,
        )
    assert (
        group["X"]["indices"].dtype == np.uint8
    )  # 120 genes: the smallest dtype that holds them

    back = read_dataset(uri)
    assert (
        sp.issparse(back.X)
        and back.X.format == "csr"
        and back.X.indices.dtype == np.int32
    )
    assert (back.X != adata.X).nnz == 0 and list(back.obs["donor"]) == list(
        adata.obs["donor"]
    )


def test_dense_x_stays_dense_in_whole_row_chunks(tmp_path):
    dense = np.random.default_rng(1).random((50, 30), dtype=np.float32)
    write_dataset(
        ad.AnnData(X=dense),
        str(tmp_path / "d.zarr"),
        layout=XLayout(chunk_values=300, shard_chunks=2),
    )
    array = zarr.open_array(str(tmp_path / "d.zarr"), path="X", mode="r")
    assert array.chunks == (10, 30) and array.shards == (20, 30)
    assert np.array_equal(read_dataset(str(tmp_path / "d.zarr")).X, dense)


def test_writing_leaves_the_callers_object_as_it_was(tmp_path):
    adata = _expression()
    write_dataset(adata, str(tmp_path / "dataset.zarr"))
    assert (
        adata.obs["donor"].dtype == object
    )  # anndata's write_zarr would make it categorical in place


def test_the_reference_set_stores_no_derivable_copy_of_x(reference_expression):
    assert (
        sp.issparse(reference_expression.X) and reference_expression.X.format == "csr"
    )
    assert reference_expression.X.has_canonical_format
    assert (
        len(reference_expression.layers) == 0
    )  # the dense 'scaled' copy is not stored


def test_a_published_version_says_how_x_is_stored(tmp_path):
    dataset = join_labels(_expression(), pd.DataFrame())
    uri, written = publish_dataset(dataset, str(tmp_path))
    manifest = json.loads((Path(uri).parent / "manifest.json").read_text())
    assert (
        written
        and manifest["x_encoding"] == "csr"
        and manifest["x_stored_values"] == dataset.adata.X.nnz
    )
    assert publish_dataset(dataset, str(tmp_path)) == (uri, False)


@pytest.mark.parametrize(
    "field, value", [("chunk_values", 0), ("shard_chunks", -2), ("chunk_values", 2.5)]
)
def test_a_bad_layout_is_refused_by_name(field, value):
    with pytest.raises(
        ValueError,
        match=f"XLayout.{field} must be a whole number of at least 1; got {value}",
    ):
        XLayout(**{field: value})


# Versions ----------------------------------------------------------------------------------


def test_same_values_give_the_same_version_whatever_the_storage():
    adata = _expression()
    csr = adata.X
    reference = _digest(csr, adata)
    assert _digest(csr.toarray(), adata) == reference  # dense twin
    assert _digest(csr.tocsc(), adata) == reference
    assert _digest(sp.csr_array(csr), adata) == reference

    # Unsorted indices, an explicit zero, a duplicate pair that sums to the stored value.
    messy = csr.tocoo()
    row, col, val = messy.row, messy.col, messy.data
    extra_row, extra_col = (
        np.array([0]),
        np.array([np.setdiff1d(np.arange(csr.shape[1]), col[row == 0])[0]]),
    )
    halves = np.array([val[0] / 2, val[0] / 2], dtype=np.float32)
    messy = sp.csr_matrix(
        (
            np.concatenate([val[1:][::-1], [0.0], halves]).astype(np.float32),
            (
                np.concatenate([row[1:][::-1], extra_row, [row[0]] * 2]),
                np.concatenate([col[1:][::-1], extra_col, [col[0]] * 2]),
            ),
        ),
        shape=csr.shape,
    )
    before = (messy.data.copy(), messy.indices.copy())
    assert _digest(messy, adata) == reference
    assert np.array_equal(messy.data, before[0]) and np.array_equal(
        messy.indices, before[1]
    )  # untouched


def test_the_version_does_not_depend_on_the_block_size(monkeypatch):
    adata = _expression(cells=257)
    reference = _digest(adata.X, adata)
    monkeypatch.setattr(version_module, "BLOCK_VALUES", 7)
    assert _digest(adata.X, adata) == reference
    assert _digest(adata.X.toarray(), adata) == reference


def test_any_changed_value_or_name_gives_a_new_version():
    adata = _expression()
    reference = _digest(adata.X, adata)
    changed = adata.X.copy()
    changed.data[5] += 1.0
    assert _digest(changed, adata) != reference
    assert (
        _digest(adata.X.astype(np.float64), adata) != reference
    )  # another dtype is other bytes on disk
    renamed = adata.copy()
    renamed.obs_names = [f"c{i}" for i in range(adata.n_obs)]
    assert _digest(adata.X, renamed) != reference


def test_hashing_never_densifies():
    # One million cells × one million genes: 4 TB dense, 2,000 non-zeros.
    rng = np.random.default_rng(3)
    rows, cols = rng.integers(0, 1_000_000, 2_000), rng.integers(0, 1_000_000, 2_000)
    values = rng.random(2_000, dtype=np.float32) + 1
    huge = sp.csr_matrix((values, (rows, cols)), shape=(1_000_000, 1_000_000))
    obs, var = (
        pd.RangeIndex(huge.shape[0]).astype(str),
        pd.RangeIndex(huge.shape[1]).astype(str),
    )
    assert (
        matrix_digest(huge, obs, var).hexdigest()
        != matrix_digest(huge * 2, obs, var).hexdigest()
    )


def test_a_read_back_dataset_keeps_its_version(tmp_path):
    dataset = join_labels(_expression(), pd.DataFrame())
    uri, _ = publish_dataset(dataset, str(tmp_path))
    assert join_labels(read_dataset(uri), pd.DataFrame()).version == dataset.version
    assert (
        join_labels(read_dataset(uri, lazy_x=True), pd.DataFrame()).matrix_version
        == dataset.matrix_version
    )


# Reading for training ---------------------------------------------------------------------


class _CountingStore(WrapperStore):
    """A real local store that adds up the bytes each read returns."""

    bytes_read = 0

    async def get(
        self,
        key: str,
        prototype: BufferPrototype,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        buffer = await self._store.get(key, prototype, byte_range)
        if buffer is not None and key.startswith("X/"):
            type(self).bytes_read += len(buffer)
        return buffer


def test_a_lazy_row_block_reads_only_the_chunks_it_spans(tmp_path):
    adata = _expression(cells=2_000, genes=200, density=0.05)
    path = tmp_path / "dataset.zarr"
    write_dataset(adata, str(path), layout=XLayout(chunk_values=256, shard_chunks=8))
    stored = sum(p.stat().st_size for p in (path / "X").rglob("*") if p.is_file())

    lazy = read_dataset(str(path), lazy_x=True)
    assert (
        not sp.issparse(lazy.X)
        and lazy.n_obs == 2_000
        and lazy.var_names[3] == "gene-3"
    )
    assert (lazy.X[100:164] != adata.X[100:164]).nnz == 0

    _CountingStore.bytes_read = 0
    backed = ad.io.sparse_dataset(
        zarr.open_group(
            _CountingStore(LocalStore(str(path), read_only=True)), mode="r"
        )["X"]
    )
    block = backed[1_000:1_064]
    assert (block != adata.X[1_000:1_064]).nnz == 0
    assert 0 < _CountingStore.bytes_read < stored / 5, (
        _CountingStore.bytes_read,
        stored,
    )


def test_dense_rows_cuts_one_batch_from_any_matrix(tmp_path):
    adata = _expression()
    rows = np.array([7, 3, 7, 299, 0])
    expected = adata.X.toarray()[rows]
    write_dataset(adata, str(tmp_path / "dataset.zarr"))
    for matrix in (
        adata.X,
        adata.X.toarray(),
        read_dataset(str(tmp_path / "dataset.zarr"), lazy_x=True).X,
    ):
        batch = dense_rows(matrix, rows)
        assert batch.dtype == np.float32 and np.array_equal(batch, expected)
    with pytest.raises(ValueError, match="rows must be a 1-D array"):
        dense_rows(adata.X, np.array([[1, 2]]))
