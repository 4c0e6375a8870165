"""A tenant's omics datasets sealed with its key: written sealed object by object, read back by
every reader, unreadable without the key, plain where no key is held, and got back plain from
the data registry by whoever holds the key (`sinewgrid data get --tenant`, `sinewgrid data decrypt`)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import zarr
from typer.testing import CliRunner

from cell_lane.omics import (
    dataset_store,
    dense_rows,
    is_sealed_dataset,
    join_labels,
    matrix_digest,
    publish_dataset,
    read_dataset,
    write_dataset,
)
from cell_lane.omics.sealing import SealedStore
from data_layer.registry.registry import DataRegistry
from workload_runtime import tenant_access as access
from control_plane.tenancy.control import tenant_storage
from workload_runtime.envelope import PREFIX, open_bytes
from workload_runtime.keys import KeyUnavailable, key_uses, set_local_key_enabled
from sinewgrid.cli import app
from workload_runtime.tenant_access import NotSealedForTenant

TENANT = "lab-a"  # in the packaged tenants catalog, with a local key


@pytest.fixture
def platform(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A platform root with the packaged tenants catalog; tenants' keys in a folder of this test."""
    monkeypatch.setenv("SINEWGRID_KEYS_DIR", str(tmp_path / "keys"))
    monkeypatch.delenv("SINEWGRID_TENANTS", raising=False)
    monkeypatch.delenv("SINEWGRID_REGISTRY_GIT", raising=False)
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    access.forget_all()
    yield str(home)
    access.forget_all()


def _expression(cells: int = 400, genes: int = 150, seed: int = 3) -> ad.AnnData:
    matrix = sp.random(cells, genes, density=0.1, format="csr", dtype=np.float32, random_state=seed)
    return ad.AnnData(
        X=matrix,
        obs=pd.DataFrame({"donor": [f"donor-{i % 3}-secret" for i in range(cells)]}, index=[f"cell-{i:04d}-barcode" for i in range(cells)]),
        var=pd.DataFrame(index=[f"GENESYM{j:04d}" for j in range(genes)]),
    )


def _publish(base: str) -> tuple[str, ad.AnnData, str]:
    """A small dataset version published under `base`: (zarr uri, the AnnData, its version)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = join_labels(_expression(), pd.DataFrame())
        zarr_uri, written = publish_dataset(dataset, base)
    assert written
    return zarr_uri, dataset.adata, dataset.version


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _same_annotations(got: ad.AnnData, want: ad.AnnData) -> None:
    pd.testing.assert_frame_equal(got.obs, want.obs, check_dtype=False, check_categorical=False)
    pd.testing.assert_frame_equal(got.var, want.var, check_dtype=False, check_categorical=False)


# Written sealed, read back by every reader ---------------------------------------------------------
def test_sealed_dataset_round_trips_through_every_reader_and_holds_no_plain_bytes(platform, tmp_path):
    storage = tenant_storage(platform, TENANT)
    mark = len(key_uses())
    zarr_uri, adata, version = _publish(storage.curated("omics"))
    # One data key for every object of the dataset, one for the version's manifest beside it.
    assert [u.op for u in key_uses(mark) if u.tenant == TENANT] == ["generate", "generate"]

    stored = _files(Path(zarr_uri))
    assert stored and all(blob.startswith(PREFIX) for blob in stored.values()), [k for k, b in stored.items() if not b.startswith(PREFIX)]
    assert is_sealed_dataset(zarr_uri)
    # The same layout as a plain dataset: X in shards, whose chunks are read by range (frames).
    array_meta = json.loads(access.opener().open(stored["X/data/zarr.json"]))
    assert [c["name"] for c in array_meta["codecs"]] == ["sharding_indexed"]

    # No gene or cell name, no annotation and no compressed chunk of the plain dataset in the stored bytes.
    plain_uri = str(tmp_path / "plain" / "dataset.zarr")
    write_dataset(adata, plain_uri)
    everything = b"".join(stored.values())
    for name in [*adata.var_names[:20], *adata.obs_names[:20], "donor-1-secret", "GENESYM"]:
        assert name.encode() not in everything
    for rel, blob in _files(Path(plain_uri)).items():
        if "/c/" in rel and len(blob) > 64:
            assert blob[len(blob) // 2 : len(blob) // 2 + 32] not in everything

    mark = len(key_uses())
    back = read_dataset(zarr_uri)
    assert [u.op for u in key_uses(mark)] == ["unwrap"]  # the data key unwrapped once for the whole read
    assert (back.X != adata.X).nnz == 0 and back.X.shape == adata.X.shape
    _same_annotations(back, adata)
    assert matrix_digest(back.X, back.obs_names, back.var_names).hexdigest()[:16] == matrix_digest(adata.X, adata.obs_names, adata.var_names).hexdigest()[:16]

    lazy = read_dataset(zarr_uri, lazy_x=True)
    _same_annotations(lazy, adata)
    np.testing.assert_array_equal(lazy.X[100:260].toarray(), adata.X[100:260].toarray())
    rows = np.array([5, 399, 5, 17])
    np.testing.assert_array_equal(dense_rows(lazy.X, rows), adata.X[rows].toarray())

    store = dataset_store(zarr_uri)
    assert isinstance(store, SealedStore)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        by_anndata = ad.read_zarr(store)
    np.testing.assert_array_equal(by_anndata.X.toarray(), adata.X.toarray())
    _same_annotations(by_anndata, adata)

    # Publishing again finds the version (the content hash is of the data, not of the stored bytes).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = join_labels(_expression(), pd.DataFrame())
    assert again.version == version and publish_dataset(again, storage.curated("omics")) == (zarr_uri, False)


def test_without_the_key_a_sealed_dataset_is_unreadable_and_says_why(platform):
    storage = tenant_storage(platform, TENANT)
    zarr_uri, adata, _ = _publish(storage.curated("omics"))

    access.forget_all()
    for read in (lambda: read_dataset(zarr_uri), lambda: read_dataset(zarr_uri, lazy_x=True)):
        with pytest.raises(KeyUnavailable) as err:
            read()
        assert err.value.tenant == TENANT and f"tenant `{TENANT}`" in str(err.value)

    tenant_storage(platform, TENANT)  # the key is held again
    key_file = Path(platform).parent / "keys" / f"{TENANT}.key"
    key_id = json.loads(key_file.read_text())["key_id"]
    set_local_key_enabled(key_file, False)
    try:
        with pytest.raises(KeyUnavailable) as err:
            read_dataset(zarr_uri)
        message = str(err.value)
        assert key_id in message and f"tenant `{TENANT}`" in message and "disabled" in message
        assert f"sinewgrid tenants key enable {TENANT}" in message
        with pytest.raises(KeyUnavailable):  # nor can anything new be sealed with it
            write_dataset(adata, storage.curated("omics", "other", "dataset.zarr"))
    finally:
        set_local_key_enabled(key_file, True)
    assert (read_dataset(zarr_uri).X != adata.X).nnz == 0


def test_a_plain_object_slipped_into_a_sealed_dataset_is_refused(platform):
    storage = tenant_storage(platform, TENANT)
    zarr_uri, _, _ = _publish(storage.curated("omics"))
    chunk = next(p for p in sorted(Path(zarr_uri, "X", "data").rglob("*")) if p.is_file() and p.name != "zarr.json")
    chunk.write_bytes(b"\x00" * 64)
    with pytest.raises(NotSealedForTenant, match=f"X/data/c/0 lies in tenant `{TENANT}`'s storage root .* holds plain bytes"):
        read_dataset(zarr_uri)


def test_an_unregistered_root_writes_todays_plain_zarr(platform, tmp_path):
    tenant_storage(platform, TENANT)  # a tenant's key is held, for another root
    zarr_uri, adata, _ = _publish(str(tmp_path / "platform-data" / "omics"))
    assert access.keyring_for(zarr_uri) is None
    stored = _files(Path(zarr_uri))
    assert not any(blob.startswith(PREFIX) for blob in stored.values())
    assert json.loads(stored["zarr.json"])["zarr_format"] == 3 and not is_sealed_dataset(zarr_uri)
    assert dataset_store(zarr_uri) == zarr_uri  # zarr's own store: no wrapper
    x_data = zarr.open_array(zarr_uri, path="X/data", mode="r")
    assert x_data.shards is not None  # the plain layout keeps its shards
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np.testing.assert_array_equal(ad.read_zarr(zarr_uri).X.toarray(), adata.X.toarray())


# Got back plain from the data registry ----------------------------------------------------------------
def _registered(platform: str) -> tuple[DataRegistry, str, str, dict[str, bytes]]:
    """A sealed version registered in the tenant's registry: (registry, version, folder, its plain files)."""
    storage = tenant_storage(platform, TENANT)
    zarr_uri, _, version = _publish(storage.curated("omics"))
    folder = str(Path(zarr_uri).parent)
    registry = DataRegistry.for_root(storage.root)
    registry.register("cell/omics", version, folder)
    opener = access.opener()
    plain = {rel: opener.open(blob) if blob.startswith(PREFIX) else blob for rel, blob in _files(Path(folder)).items()}
    # The DVC remote holds ciphertext only, the manifest beside the zarr store too (DVC's own .dir listing aside).
    remote = Path(storage.root) / "registry" / "dvc-store" / "files"
    objects = [p.read_bytes() for p in remote.rglob("*") if p.is_file() and not p.name.endswith(".dir")]
    assert objects and all(blob.startswith(PREFIX) for blob in objects)
    return registry, version, folder, plain


def test_data_get_with_tenant_gives_the_plain_files(platform, tmp_path):
    registry, version, folder, plain = _registered(platform)
    dest = tmp_path / "got"
    result = CliRunner().invoke(app, ["data", "get", "cell/omics", version, str(dest), "--root", platform, "--tenant", TENANT])
    assert result.exit_code == 0, result.output
    assert _files(dest) == plain
    assert not is_sealed_dataset(str(dest / "dataset.zarr"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert ad.read_zarr(dest / "dataset.zarr").n_obs == 400  # the field's own tools open it

    # With the key disabled: the key's own message, and no destination.
    key_file = tmp_path / "keys" / f"{TENANT}.key"
    set_local_key_enabled(key_file, False)
    try:
        refused = CliRunner().invoke(app, ["data", "get", "cell/omics", version, str(tmp_path / "refused"), "--root", platform, "--tenant", TENANT])
    finally:
        set_local_key_enabled(key_file, True)
    assert refused.exit_code == 1
    assert f"tenant `{TENANT}`" in refused.output and "disabled" in refused.output
    assert not (tmp_path / "refused").exists()


def test_data_decrypt_opens_a_plainly_fetched_folder_in_place(platform, tmp_path):
    registry, version, folder, plain = _registered(platform)
    fetched = tmp_path / "fetched"
    registry.get("cell/omics", version, str(fetched))  # what plain `dvc get` gives: the sealed files
    sealed = _files(fetched)
    assert sealed == _files(Path(folder)) and sealed != plain

    key_file = tmp_path / "keys" / f"{TENANT}.key"
    set_local_key_enabled(key_file, False)
    try:
        refused = CliRunner().invoke(app, ["data", "decrypt", str(fetched), "--tenant", TENANT, "--root", platform])
    finally:
        set_local_key_enabled(key_file, True)
    assert refused.exit_code == 1 and "disabled" in refused.output and "Nothing under" in refused.output
    assert _files(fetched) == sealed  # every sealed original kept, no temporary file left

    result = CliRunner().invoke(app, ["data", "decrypt", str(fetched), "--tenant", TENANT, "--root", platform])
    assert result.exit_code == 0, result.output
    assert _files(fetched) == plain
    again = CliRunner().invoke(app, ["data", "decrypt", str(fetched), "--tenant", TENANT, "--root", platform])
    assert again.exit_code == 0 and _files(fetched) == plain  # plain files are left alone


def test_data_decrypt_never_writes_plain_files_under_a_storage_root(platform, tmp_path):
    """Run on the live registry folder it used to turn every sealed object into plain text (and
    every later `data get` then failed): now it refuses there, also through a symlink, and writes a
    plain copy only `--to` a destination outside every root."""
    registry, version, folder, plain = _registered(platform)
    live = Path(folder)
    sealed = _files(live)
    link = tmp_path / "looks-harmless"
    link.symlink_to(live)
    for target in (live, link, Path(platform)):
        refused = CliRunner().invoke(app, ["data", "decrypt", str(target), "--tenant", TENANT, "--root", platform])
        said = " ".join(refused.output.split())  # rich wraps long lines
        assert refused.exit_code == 1, said
        assert "under the storage root of tenant `lab-a`" in said or "under the storage root of the platform" in said, said
        assert "--to" in said and "Nothing was changed" in said
    into_root = CliRunner().invoke(app, ["data", "decrypt", str(live), "--tenant", TENANT, "--root", platform, "--to", str(Path(platform) / "plain")])
    assert into_root.exit_code == 1 and "under the storage root of" in " ".join(into_root.output.split())
    assert not (Path(platform) / "plain").exists()
    assert _files(live) == sealed  # the live objects are untouched by every refusal

    copy = tmp_path / "plain-copy"
    result = CliRunner().invoke(app, ["data", "decrypt", str(live), "--tenant", TENANT, "--root", platform, "--to", str(copy)])
    assert result.exit_code == 0, result.output
    assert _files(copy) == plain and _files(live) == sealed
    again = CliRunner().invoke(app, ["data", "get", "cell/omics", version, str(tmp_path / "got"), "--root", platform, "--tenant", TENANT])
    assert again.exit_code == 0 and _files(tmp_path / "got") == plain  # the registry still serves its version


def test_open_bytes_matches_the_documented_header(platform):
    """The header a field tool needs is in the object itself (tenant, key id, wrapped data key)."""
    storage = tenant_storage(platform, TENANT)
    zarr_uri, _, _ = _publish(storage.curated("omics"))
    blob = Path(zarr_uri, "zarr.json").read_bytes()
    keyring = access.keyring_for(zarr_uri)
    assert json.loads(open_bytes(blob, keyring))["zarr_format"] == 3


def test_sealed_dataset_on_an_object_store_root(platform, s3_root):
    """On S3 the sealed objects are uploaded as written, and read back through zarr's fsspec store."""
    import s3fs

    storage = tenant_storage(s3_root, TENANT)
    zarr_uri, adata, _ = _publish(storage.curated("omics"))
    fs = s3fs.S3FileSystem()
    stored = [fs.cat_file(p) for p in fs.find(zarr_uri.removeprefix("s3://"))]
    assert stored and all(blob.startswith(PREFIX) for blob in stored)
    assert is_sealed_dataset(zarr_uri) and isinstance(dataset_store(zarr_uri), SealedStore)
    assert (read_dataset(zarr_uri).X != adata.X).nnz == 0
    np.testing.assert_array_equal(read_dataset(zarr_uri, lazy_x=True).X[50:120].toarray(), adata.X[50:120].toarray())
