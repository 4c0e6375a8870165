"""`sinewgrid tenants key rotate` and `sinewgrid tenants reseal` (issue 31): a tenant's data moved to a
new key and to the standard format, checked object by object, resumable, nothing lost.

A lab's root is filled by the platform's own writers (objects, a two-step checkpoint, a registered
dataset version) plus one object in the retired SGSEAL1 format and the lab's plain areas. After a
rotation and a reseal, the old key is deleted: everything must still read back exactly, sealed
under the new key in the ESDK's format, and the DVC remote must hold no copy under the old key.
"""

from __future__ import annotations

import base64
import json
import os
import posixpath
import struct
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from typer.testing import CliRunner

from data_layer import reseal as reseal_module
from control_plane.tenancy.control import tenant_access, tenant_storage
from data_layer.reseal import reseal_tenant
from data_layer.registry.registry import DataRegistry
from sinewgrid.cli import app
from tests.conftest import ROOT_KINDS
from workload_runtime import tenant_access as access
from workload_runtime.checkpoints import CheckpointStore
from workload_runtime.envelope import FORMAT, is_sealed, read_header, seal_bytes
from workload_runtime.keys import LocalKeyring
from workload_runtime.legacy_seal import MAGIC
from workload_runtime.storage import fs_for, read_bytes, write_bytes_atomic
from workload_runtime.tenant_access import NotSealedForTenant, opener

LAB = "lab-a"


def legacy_seal(data: bytes, keyring: LocalKeyring) -> bytes:
    """An object as Sinewgrid sealed it before the ESDK's format (SGSEAL1), made the way it was made."""
    data_key, nonce = os.urandom(32), os.urandom(12)
    wrapped = nonce + AESGCM(keyring.material()).encrypt(nonce, data_key, keyring.tenant.encode())
    header = json.dumps({"alg": "AES-256-GCM", "key_id": keyring.key_id, "tenant": keyring.tenant, "wrapped_key": base64.b64encode(wrapped).decode()},
                        sort_keys=True, separators=(",", ":")).encode()  # fmt: skip
    prefix, body_nonce = MAGIC + struct.pack(">I", len(header)) + header, os.urandom(12)
    return prefix + body_nonce + AESGCM(data_key).encrypt(body_nonce, data, prefix)


def _put(uri: str, data: bytes) -> None:
    fs, path = fs_for(uri)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    fs.pipe_file(path, data)


def _stored(root: str) -> dict[str, bytes]:
    fs, base = fs_for(root)
    return {posixpath.relpath(p, base.rstrip("/")): fs.cat_file(p) for p in fs.find(base)}


@pytest.fixture
def lab(root: str):
    """Lab A's root, filled by the platform's writers; its key held here. Yields (root, what it holds)."""
    access.forget_all()
    storage = tenant_storage(root, LAB)
    keyring = tenant_access(root, LAB).keyring()
    held = {
        storage.curated("assays", "drop-1", "effects.parquet"): b"perturbation,effect\nTP53,0.8731\n",
        storage.uri("lineage", "cell", "model.json"): b'{"rests_on": "lab-a"}',
    }
    for uri, data in held.items():
        write_bytes_atomic(uri, data)
    old_format = storage.curated("assays", "drop-0", "effects.parquet")
    _put(old_format, legacy_seal(b"perturbation,effect\nMYC,0.1200\n", keyring))
    held[old_format] = b"perturbation,effect\nMYC,0.1200\n"
    _put(storage.landing("assays", "drop-2") + "/plate.csv", b"lab's own upload")
    _put(storage.outbox("plates", "next.csv"), b"lab's worklist")
    store = CheckpointStore(storage.checkpoints("cell/model/run-1"), framework="numpy")
    for step in (1, 2):
        store.save(step, {"model": {"w": np.full(1000, float(step), dtype=np.float32)}})
    version_folder = storage.curated("omics", "v1")
    for name in ("zarr.json", "X/c/0/0"):
        write_bytes_atomic(f"{version_folder}/{name}", f"{name} of lab-a".encode())
    DataRegistry.for_root(storage.root).register("cell/omics", "v1", version_folder)
    yield storage.root, held, store
    access.forget_all()


def _rotate(root: str) -> tuple[str, str, Path]:
    key_file = Path(tenant_access(root, LAB).key_file)
    old_id = json.loads(key_file.read_text())["key_id"]
    result = CliRunner().invoke(app, ["tenants", "key", "rotate", LAB])
    assert result.exit_code == 0, result.output
    new_id = json.loads(key_file.read_text())["key_id"]
    access.forget_all()
    access.register(root, LocalKeyring(LAB, key_file))
    return old_id, new_id, next(key_file.parent.glob(f"retired/{LAB}/*.key"))


def _check_moved(root: str, held: dict[str, bytes], store: CheckpointStore, new_id: str) -> None:
    """With only the new key: every sealed object is the ESDK's format under it, and reads back exactly."""
    for rel, blob in _stored(root).items():
        top = rel.split("/", 1)[0]
        if top in ("landing", "outbox") or rel.startswith("registry/datasets") or rel.endswith(".dir"):
            continue
        assert is_sealed(blob), rel
        header = read_header(blob)
        assert (header.format, header.key_id) == (FORMAT, new_id), rel
    for uri, data in held.items():
        assert read_bytes(uri) == data, uri
    for step in (1, 2):
        checkpoint = store._load(step)
        assert checkpoint is not None and checkpoint.manifest["sealed_with"]["key_id"] == new_id
        np.testing.assert_array_equal(checkpoint.tensors["model"]["w"], np.full(1000, float(step), dtype=np.float32))


@pytest.mark.parametrize("root", ROOT_KINDS, indirect=True)
def test_a_rotated_key_and_the_old_format_are_resealed_and_the_old_key_can_go(lab, tmp_path):
    root, held, store = lab
    before = _stored(root)
    old_id, new_id, retired = _rotate(root)
    assert old_id != new_id and read_bytes(next(iter(held))) == next(iter(held.values()))  # the retired key still opens the old data

    result = CliRunner().invoke(app, ["tenants", "reseal", LAB])
    assert result.exit_code == 0, result.output
    assert "1 registered versions moved" in result.output and "old copies removed from the DVC remote" in result.output

    retired.unlink()  # the old key is gone for good
    access.forget_all()
    access.register(root, LocalKeyring(LAB, Path(tenant_access(root, LAB).key_file)))
    _check_moved(root, held, store, new_id)
    after = _stored(root)
    for lab_area in ("landing/assays/drop-2/plate.csv", "outbox/plates/next.csv"):
        assert after[lab_area] == before[lab_area]  # the lab's plain areas are the lab's: untouched
    registry = DataRegistry.for_root(root)
    got = tmp_path / "got"
    registry.get("cell/omics", "v1", str(got), opener=opener())
    assert (got / "zarr.json").read_bytes() == b"zarr.json of lab-a" and (got / "X/c/0/0").read_bytes() == b"X/c/0/0 of lab-a"
    assert registry.find("cell/omics", "v1").meta == {} and "republished" in registry._mirror.tagged_dvcfiles(["cell/omics/v1"])[0][2]

    again = CliRunner().invoke(app, ["tenants", "reseal", LAB])  # nothing left to move
    assert again.exit_code == 0 and f"tenant {LAB}: 0 objects resealed" in again.output, again.output


@pytest.mark.parametrize("stop_after", [1, 3, 5])
def test_a_reseal_stopped_part_way_finishes_when_run_again_and_loses_nothing(lab, monkeypatch, stop_after):
    root, held, store = lab
    _, new_id, _ = _rotate(root)
    keyring = LocalKeyring(LAB, Path(tenant_access(root, LAB).key_file))
    real_write, writes = reseal_module.write_chunks_atomic, []

    def dies_part_way(uri, chunks, keep=False):  # type: ignore[no-untyped-def]
        if len(writes) == stop_after:
            raise OSError("the machine went away")
        writes.append(uri)
        return real_write(uri, chunks, keep=keep)

    monkeypatch.setattr(reseal_module, "write_chunks_atomic", dies_part_way)
    with pytest.raises(OSError, match="went away"):
        reseal_tenant(root, keyring, opener())
    # Stopped: every object is old or new and whole, and all of it still reads (the old key is kept).
    for uri, data in held.items():
        assert read_bytes(uri) == data
    assert store.latest_valid() is not None
    monkeypatch.setattr(reseal_module, "write_chunks_atomic", real_write)
    report = reseal_tenant(root, keyring, opener())
    assert report.resealed > 0 and not report.plain
    _check_moved(root, held, store, new_id)


def test_reseal_refuses_an_object_sealed_for_another_tenant_and_leaves_it(lab):
    root, _, _ = lab
    stranger = LocalKeyring("lab-b", Path(tenant_access(root, LAB).key_file).parent / "lab-b.key", create=True)
    planted = f"{root}/curated/assays/drop-9/effects.parquet"
    foreign = seal_bytes(b"lab-b's effects", stranger)
    _put(planted, foreign)
    plain = f"{root}/curated/assays/drop-8/notes.txt"
    _put(plain, b"someone's notes")
    _rotate(root)
    with pytest.raises(NotSealedForTenant, match="drop-9/effects.parquet lies in tenant `lab-a`.*sealed for tenant `lab-b`"):
        reseal_tenant(root, LocalKeyring(LAB, Path(tenant_access(root, LAB).key_file)), opener())
    assert fs_for(planted)[0].cat_file(fs_for(planted)[1]) == foreign  # left exactly as found
    fs, path = fs_for(planted)
    fs.rm(path)
    report = reseal_tenant(root, LocalKeyring(LAB, Path(tenant_access(root, LAB).key_file)), opener())
    assert report.plain == [plain]  # reported, not sealed as if it were the lab's data
