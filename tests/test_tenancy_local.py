"""Tenancy on the embedded default: the tenants catalog, local keys, sealing, and the key-revoked drill."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from control_plane.catalog.tenants import TenantCatalogError, UnknownTenant, load_tenants
from workload_runtime import tenant_access as access
from workload_runtime.envelope import Opener, SealedDataError, Sealer, is_sealed, open_bytes, seal_bytes
from workload_runtime.keys import KeyUnavailable, LocalKeyring, key_uses, set_local_key_enabled


@pytest.fixture
def keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "keys"
    monkeypatch.setenv("SINEWGRID_KEYS_DIR", str(folder))
    access.forget_all()
    yield folder
    access.forget_all()


def test_sealed_bytes_open_only_with_their_tenants_key_and_only_whole(keys: Path):
    a, b = LocalKeyring("lab-a", keys / "lab-a.key", create=True), LocalKeyring("lab-b", keys / "lab-b.key", create=True)
    plain = b"well A01 effect 0.8731" * 100
    sealed = seal_bytes(plain, a)
    assert is_sealed(sealed) and plain not in sealed and b"0.8731" not in sealed
    assert open_bytes(sealed, a) == plain
    with pytest.raises(KeyUnavailable, match="sealed for tenant `lab-a`"):
        open_bytes(sealed, b)
    replaced = LocalKeyring("lab-a", keys / "replaced.key", create=True)  # lab-a's key file swapped for another
    with pytest.raises(KeyUnavailable, match="wrapped by key local:lab-a:"):
        open_bytes(sealed, replaced)
    tampered = bytearray(sealed)
    tampered[-5] ^= 1
    with pytest.raises(SealedDataError, match="integrity"):
        open_bytes(bytes(tampered), a)
    # One data key for many objects: the tenant's key is asked once to make it and once to open them all.
    since = len(key_uses())
    sealer = Sealer(a)
    objects = [sealer.seal(f"chunk {i}".encode()) for i in range(20)]
    opener = Opener(lambda tenant, key_id: a)
    assert [opener.open(o) for o in objects] == [f"chunk {i}".encode() for i in range(20)]
    assert [u.op for u in key_uses(since)] == ["generate", "unwrap"]
    assert all(u.key_id.startswith("local:lab-a:") for u in key_uses(since))


def test_a_sealed_object_opens_with_the_encryption_sdk_alone(keys: Path):
    """What an auditor does with the tenant's key file and the AWS Encryption SDK (docs/tenancy.md)."""
    import base64
    import json

    import aws_encryption_sdk
    from aws_encryption_sdk.identifiers import Algorithm, CommitmentPolicy, EncryptionKeyType, WrappingAlgorithm
    from aws_encryption_sdk.internal.crypto.wrapping_keys import WrappingKey
    from aws_encryption_sdk.key_providers.raw import RawMasterKey

    a = LocalKeyring("lab-a", keys / "lab-a.key", create=True)
    sealed = seal_bytes(b"plate 7, well B02: 0.8731", a)
    key_file = json.loads((keys / "lab-a.key").read_text())
    key = RawMasterKey(
        provider_id="sinewgrid-local", key_id=key_file["key_id"].encode(),
        wrapping_key=WrappingKey(wrapping_algorithm=WrappingAlgorithm.AES_256_GCM_IV12_TAG16_NO_PADDING,
                                 wrapping_key=base64.b64decode(key_file["material"]), wrapping_key_type=EncryptionKeyType.SYMMETRIC),
    )  # fmt: skip
    client = aws_encryption_sdk.EncryptionSDKClient(commitment_policy=CommitmentPolicy.REQUIRE_ENCRYPT_REQUIRE_DECRYPT)
    plain, header = client.decrypt(source=sealed, key_provider=key)
    assert plain == b"plate 7, well B02: 0.8731"
    assert header.algorithm == Algorithm.AES_256_GCM_HKDF_SHA512_COMMIT_KEY and header.encryption_context == {"tenant": "lab-a"}


def test_a_disabled_local_key_refuses_naming_itself_and_its_tenant(keys: Path):
    a = LocalKeyring("lab-a", keys / "lab-a.key", create=True)
    sealed = seal_bytes(b"weights", a)
    set_local_key_enabled(keys / "lab-a.key", False)
    with pytest.raises(KeyUnavailable) as refused:
        open_bytes(sealed, a)
    assert "lab-a" in str(refused.value) and a.key_id in str(refused.value) and "sinewgrid tenants key enable lab-a" in str(refused.value)
    set_local_key_enabled(keys / "lab-a.key", True)
    assert open_bytes(sealed, a) == b"weights"
    # A workload never makes a key: a missing key file is an error, not a new key.
    with pytest.raises(KeyUnavailable, match="no key file"):
        Sealer(LocalKeyring("lab-b", keys / "lab-b.key"))


def test_the_tenants_catalog_refuses_what_would_mix_tenants(tmp_path: Path):
    bad = tmp_path / "tenants.yaml"
    bad.write_text("tenants:\n  lab-a: {lane: cell, storage: data/a}\n  lab-b: {lane: cell, storage: data/a/b}\n  Lab_C: {lane: cell}\n  lab-d: {lane: cell, key: {kind: vault}}\n  lab-e: {lane: cell, key: {kind: aws-kms}}\n")
    with pytest.raises(TenantCatalogError) as refused:
        load_tenants(bad)
    said = str(refused.value)
    assert "`lab-a` and `lab-b` have nesting storage" in said
    assert "tenant name `Lab_C`" in said
    assert "tenant `lab-d`, field `key.kind`" in said
    assert "tenant `lab-e`, field `key`" in said and "needs `key_id`" in said
    with pytest.raises(UnknownTenant, match="lab-z` is not in the tenants catalog"):
        load_tenants().get_tenant("lab-z")


@pytest.mark.parametrize("storage", ["tenants/lab-a/../lab-b", "tenants//lab-a", ".", "../outside", "/data/lab-a", "file:///", "s3://bucket//lab-a"])
def test_a_storage_value_that_could_name_another_place_is_refused_as_written(tmp_path: Path, storage: str):
    catalog = tmp_path / "tenants.yaml"
    catalog.write_text(f"tenants:\n  lab-a: {{lane: cell}}\n  lab-b: {{lane: cell, storage: '{storage}'}}\n")
    with pytest.raises(TenantCatalogError) as refused:
        load_tenants(catalog)
    assert "tenant `lab-b`, field `storage`" in str(refused.value) and storage in str(refused.value)


def test_tenants_that_alias_each_other_once_resolved_or_share_a_key_are_refused(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from control_plane.tenancy.control import tenant_access

    keys = tmp_path / "keys"
    monkeypatch.setenv("SINEWGRID_KEYS_DIR", str(keys))
    catalog = tmp_path / "tenants.yaml"
    monkeypatch.setenv("SINEWGRID_TENANTS", str(catalog))

    # One key file for two tenants: each one's workloads would hold the other's key.
    catalog.write_text(f"tenants:\n  lab-a: {{lane: cell, key: {{file: {keys}/shared.key}}}}\n  lab-b: {{lane: cell, key: {{file: {keys}/../keys/shared.key}}}}\n")
    with pytest.raises(TenantCatalogError, match="tenants `lab-a`, `lab-b` share the file"):
        load_tenants(catalog)

    # lab-b's own URI is lab-a's default prefix, written as a file:// path; then through a symlink.
    link = tmp_path / "innocent-looking"
    link.symlink_to(home / "tenants" / "lab-a", target_is_directory=True)
    (home / "tenants" / "lab-a").mkdir(parents=True)
    for alias in (f"file://{home}/tenants/lab-a", f"file://{link}", f"file://{home}"):
        catalog.write_text(f"tenants:\n  lab-a: {{lane: cell}}\n  lab-b: {{lane: cell, storage: '{alias}'}}\n")
        with pytest.raises(TenantCatalogError) as refused:
            tenant_access(str(home), "lab-a")  # refused before any tenant's access is handed out
        said = str(refused.value)
        assert "nesting storage" in said or "holds the platform's root" in said, said
        assert "`lab-b`" in said

    # The keys folder under a storage root: copying the root would copy the keys.
    catalog.write_text("tenants:\n  lab-a: {lane: cell}\n")
    monkeypatch.setenv("SINEWGRID_KEYS_DIR", str(home / "tenants" / "lab-a" / "keys"))
    with pytest.raises(TenantCatalogError, match="the keys folder .* is under tenant `lab-a`'s storage root"):
        tenant_access(str(home), "lab-a")
    monkeypatch.setenv("SINEWGRID_KEYS_DIR", str(keys))
    assert tenant_access(str(home), "lab-a").storage_root == f"{home}/tenants/lab-a"  # a sound catalog is used as before


def test_sinewgrid_tenants_key_commands(keys: Path, home: Path):
    from sinewgrid.cli import app

    runner = CliRunner()
    assert runner.invoke(app, ["tenants", "key", "disable", "lab-a"]).exit_code == 2  # no key yet
    created = runner.invoke(app, ["tenants", "key", "create", "lab-a"])
    assert created.exit_code == 0 and (keys / "lab-a.key").exists()
    assert oct((keys / "lab-a.key").stat().st_mode & 0o777) == "0o600"
    assert runner.invoke(app, ["tenants", "key", "create", "lab-a"]).exit_code == 2  # never replaced
    assert runner.invoke(app, ["tenants", "key", "disable", "lab-a"]).exit_code == 0
    assert json.loads((keys / "lab-a.key").read_text())["enabled"] is False
    listed = runner.invoke(app, ["tenants", "list"], env={"COLUMNS": "250"})
    assert listed.exit_code == 0 and "disabled" in listed.output and "lab-b" in listed.output
    assert runner.invoke(app, ["tenants", "key", "enable", "lab-a"]).exit_code == 0


@pytest.mark.e2e
def test_the_key_revoked_drill_refuses_the_tenant_at_once_and_leaves_the_other_running(home: Path, instance, tmp_path: Path):
    from drills.key_revoked import run_key_revoked

    said: list[str] = []
    report = run_key_revoked(instance, str(home), tmp_path / "report", say=said.append)
    assert report["passed"], report
    refused = [p for p in report["phases"] if p["phase"] == "key disabled" and p["tenant"] == "drill-a"][0]
    assert not refused["succeeded"] and refused["attempts"] == 1 and "disabled" in refused["said"]
    assert (tmp_path / "report" / "key-revoked.md").read_text().count("| key disabled |") == 2
    # The drill's tenants' data sit under the storage root, sealed; their keys did not.
    sealed = list((home / "drills" / "key-revoked").rglob("*.safetensors"))
    assert sealed and all(is_sealed(p.read_bytes()) for p in sealed)
    assert not list(home.rglob("*.key"))


def test_a_chunked_write_abandoned_mid_way_publishes_nothing(tmp_path: Path):
    from workload_runtime.storage import write_chunks_atomic

    def chunks():
        yield b"first chunk"
        raise ValueError("the producer failed")  # e.g. the tenant's key refused mid-way

    with pytest.raises(ValueError, match="producer failed"):
        write_chunks_atomic(str(tmp_path / "model.safetensors"), chunks())
    assert list(tmp_path.iterdir()) == []  # neither the object nor a temporary file
    sha, size, kept = write_chunks_atomic(str(tmp_path / "model.safetensors"), [b"ab", b"cd"], keep=True)
    assert (size, kept) == (4, b"abcd") and (tmp_path / "model.safetensors").read_bytes() == b"abcd"
