"""Reads under a tenant's root fail closed (issue 31, class 2): what is not sealed for that tenant is refused.

An attacker who can put objects in a tenant's root (a copied file, a stolen object from another
tenant's root) must not get them read as the tenant's data: a plain object, or one sealed for
another tenant, is refused by every reader (`read_bytes`, checkpoints, gang checkpoints, omics
datasets), naming the object, the root and the seal found. Landing and outbox stay plain: the lab
writes and reads them.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from control_plane.tenancy.control import tenant_storage
from workload_runtime import tenant_access as access
from workload_runtime.checkpoints import CheckpointStore
from workload_runtime.envelope import PREFIX, is_sealed
from workload_runtime.keys import KeyUnavailable, set_local_key_enabled
from workload_runtime.sharded import load_sharded, save_sharded
from tests.conftest import ROOT_KINDS
from workload_runtime.storage import fs_for, read_bytes, read_json, read_objects, read_stored_bytes, write_bytes_atomic, write_json_atomic
from workload_runtime.tenant_access import NotSealedForTenant


@pytest.fixture
def labs(root: str):
    """Two labs' roots with their keys held in this process, as the control plane holds them."""
    access.forget_all()
    roots = {name: tenant_storage(root, name) for name in ("lab-a", "lab-b")}
    yield roots
    access.forget_all()


def _put(uri: str, data: bytes) -> None:
    """Bytes put under a root by someone, not through the platform (a local folder or a bucket)."""
    fs, path = fs_for(uri)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)  # a folder on disk; nothing to make in a bucket
    fs.pipe_file(path, data)


@pytest.mark.parametrize("root", ROOT_KINDS, indirect=True)
def test_a_plain_or_foreign_sealed_object_in_a_tenants_root_is_refused_naming_it(labs):
    a, b = labs["lab-a"], labs["lab-b"]
    effects = a.curated("assays", "x", "effects.parquet")
    write_bytes_atomic(effects, b"lab-a's effects")
    assert is_sealed(read_stored_bytes(effects)) and read_bytes(effects) == b"lab-a's effects"

    # A plain object put beside it: refused, naming the object, the root, the tenant and what was found.
    planted = a.curated("assays", "y", "effects.parquet")
    _put(planted, b"perturbation,effect\nTP53,9.9\n")
    with pytest.raises(NotSealedForTenant) as refused:
        read_bytes(planted)
    message = str(refused.value)
    assert planted in message and a.root in message and "tenant `lab-a`" in message and "plain bytes (no seal)" in message
    listing = fs_for(a.root)[0]
    found = read_objects(listing, [fs_for(effects)[1], fs_for(planted)[1]])  # a batched read (registry, retention)
    assert sorted(type(v).__name__ for v in found.values()) == ["NotSealedForTenant", "bytes"]

    # lab-a's sealed object copied into lab-b's root opens nowhere as lab-b's data, even here, where both keys are held.
    stolen = b.curated("assays", "x", "effects.parquet")
    _put(stolen, read_stored_bytes(effects))
    with pytest.raises(NotSealedForTenant, match="sealed for tenant `lab-a`"):
        read_bytes(stolen)
    with pytest.raises(NotSealedForTenant):
        read_json(stolen)

    # The plain areas stay plain both ways: what the lab drops, what the platform hands back.
    for uri in (a.uri("landing", "assays", "x", "manifest.json"), a.outbox("plates", "p1", "worklist.json")):
        write_json_atomic(uri, {"drop_id": "x"})
        assert not is_sealed(read_stored_bytes(uri)) and read_json(uri) == {"drop_id": "x"}
    # Everything else the platform writes under the root is sealed, metadata too.
    manifest = a.uri("raw", "assays", "x", "manifest.json")
    write_json_atomic(manifest, {"files": ["plate.csv"]})
    assert read_stored_bytes(manifest).startswith(PREFIX) and read_json(manifest) == {"files": ["plate.csv"]}


def test_a_checkpoint_with_a_planted_file_is_refused_not_loaded(labs, tmp_path):
    store = CheckpointStore(labs["lab-a"].checkpoints("model/run-1"))
    store.save(1, {"model": {"w": torch.ones(4)}})
    assert store.latest_valid().tensors["model"]["w"].sum() == 4
    weights = Path(store.step_uri(1), "model.safetensors")
    plain = CheckpointStore(str(tmp_path / "elsewhere"))  # under no tenant's root: written plain
    # The same file, written plain by someone, with a manifest that matches it: still refused.
    forged = Path(plain.save(1, {"model": {"w": torch.full((4,), 7.0)}}), "model.safetensors").read_bytes()
    weights.write_bytes(forged)
    manifest = read_json(str(Path(store.step_uri(1), "manifest.json")))
    manifest["files"]["model.safetensors"] = {"sha256": hashlib.sha256(forged).hexdigest(), "bytes": len(forged)}
    write_json_atomic(str(Path(store.step_uri(1), "manifest.json")), manifest)
    with pytest.raises(NotSealedForTenant, match="model.safetensors lies in tenant `lab-a`"):
        store.latest_valid()


@pytest.mark.parametrize("root", ROOT_KINDS, indirect=True)
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP on one process, as a gang's rank 0 alone
def test_a_gangs_sharded_checkpoint_is_sealed_and_loads_back(labs):
    store = CheckpointStore(labs["lab-a"].checkpoints("model/run-1"))
    secret = torch.arange(4096, dtype=torch.float32) * 0.123456
    save_sharded(store, 5, {"model": {"w": secret.clone()}})
    fs, shards = fs_for(posixpath.join(store.step_uri(5), "dcp"))
    stored = [fs.cat_file(p) for p in fs.find(shards)]
    assert len(stored) >= 2 and all(blob.startswith(PREFIX) for blob in stored)  # .metadata and rank 0's file
    assert all(secret.numpy().tobytes()[:64] not in blob for blob in stored)

    checkpoint = store.latest_valid()
    assert checkpoint is not None and checkpoint.step == 5
    state = {"model": {"w": torch.zeros(4096)}}
    load_sharded(checkpoint, state)
    assert torch.equal(state["model"]["w"], secret)

    # In a process without lab-a's key (another tenant's workload) nothing of it opens.
    access.forget_all()
    with pytest.raises(CheckpointException, match="holds no key of that tenant"):  # DCP's wrapping of KeyUnavailable
        load_sharded(checkpoint, {"model": {"w": torch.zeros(4096)}})


def test_without_the_tenants_key_a_checkpoint_listing_stops_and_retention_removes_nothing(labs):
    from data_layer.checkpoint_registry import CheckpointRegistry
    from data_layer.checkpoint_retention import plan_retention

    root = labs["lab-a"].root
    store = CheckpointStore(labs["lab-a"].checkpoints("model/run-1"))
    for step in (1, 2, 3):
        store.save(step, {"model": {"w": torch.full((4,), float(step))}}, meta={"loss": 1.0 / step})
    assert [e.step for e in CheckpointRegistry(root).refresh().entries()] == [1, 2, 3]
    key = Path(os.environ["SINEWGRID_KEYS_DIR"]) / "lab-a.key"
    set_local_key_enabled(key, False)
    try:
        # Manifests that cannot be opened are not "torn" steps to prune: the listing stops, naming the key.
        with pytest.raises(KeyUnavailable, match="disabled"):
            plan_retention(CheckpointRegistry(root).refresh(), include_torn=True)
    finally:
        set_local_key_enabled(key, True)
    assert store.steps() == [1, 2, 3]
