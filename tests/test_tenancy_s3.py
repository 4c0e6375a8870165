"""Tenants isolated by the storage server and by their own keys, with real parts on loopback.

One moto server (testbed/aws_server.py) serves S3, IAM and KMS with IAM enforcement on: every
request is signed, and S3 refuses what the signer's policy does not allow. Each tenant has its
own bucket and its own KMS key; the platform (the control plane, this test process) has an
admin key. Workloads run through the compute resource on a local pool and receive only their
tenant's access in their inputs (tests/workloads/tenant_probe.py reports what they could do).
Every refusal asserted here comes from the server (S3 AccessDenied, KMS DisabledException or a
key mismatch), not from a check of ours.
"""

import json
import os
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from control_plane.accounting.ledger import read_ledger
from control_plane.catalog.step_spec import StepSpec
from shared_resources.compute import ComputeResource
from shared_resources.resources import platform_resources
from workload_runtime.storage import Storage
from workload_runtime import tenant_access as access
from workload_runtime.keys import KeyUnavailable, KmsKeyring

pytestmark = [pytest.mark.engines, pytest.mark.e2e]

POOLS = """
pools:
  local-any:
    provider: local
    region: local
    backend: local
    purchasing: on_demand
    capacity: steady
    accelerator: local
    gpus_per_node: 1
    price_per_gpu_hour: 2.0
    max_concurrent_steps: 2
"""
# Weights no other object would hold by chance: their float32 bytes must never be stored in the clear.
WEIGHTS = {"lab-a": [3.1415927, 2.7182817, 1.4142135, 1.7320508], "lab-b": [0.5772157, 1.6180340, 2.5029078, 4.6692016]}


@pytest.fixture(scope="module")
def aws():
    from testbed.aws_server import aws_server

    with aws_server() as server:
        s3 = server.client("s3", server.admin)
        for bucket in ("platform", "lab-a-data", "lab-b-data"):
            s3.create_bucket(Bucket=bucket)
        principals = {t: server.tenant_principal(t, f"{t}-data") for t in ("lab-a", "lab-b")}
        keys = {t: server.kms_key(principals[t], f"{t}'s key") for t in principals}
        yield server, principals, keys


@pytest.fixture
def tenancy(aws, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The platform root on s3://platform, two tenants in their own buckets with their own KMS keys."""
    import s3fs

    server, principals, keys = aws
    for name, value in server.env(server.admin).items():
        monkeypatch.setenv(name, value)
    for tenant, principal in principals.items():
        prefix = tenant.upper().replace("-", "_")
        monkeypatch.setenv(f"{prefix}_AWS_ACCESS_KEY_ID", principal.access_key_id)
        monkeypatch.setenv(f"{prefix}_AWS_SECRET_ACCESS_KEY", principal.secret_access_key)
    catalog = {
        "tenants": {
            t: {
                "lane": "cell", "storage": f"s3://{t}-data/{tmp_path.name}", "credentials": {"env": t.upper().replace("-", "_")},
                "key": {"kind": "aws-kms", "key_id": keys[t], "endpoint": server.endpoint, "region": "us-east-1"},
            }
            for t in principals
        }
    }
    (tmp_path / "tenants.yaml").write_text(json.dumps(catalog))
    (tmp_path / "pools.yaml").write_text(POOLS)
    monkeypatch.setenv("SINEWGRID_TENANTS", str(tmp_path / "tenants.yaml"))
    monkeypatch.setenv("SINEWGRID_LEDGER_URL", f"sqlite:///{tmp_path / 'ledger.db'}")
    monkeypatch.setenv("SINEWGRID_NODE_CACHE_DIR", str(tmp_path / "node-cache"))
    s3fs.S3FileSystem.clear_instance_cache()
    access.forget_all()
    root = f"s3://platform/{tmp_path.name}"
    yield server, keys, root, platform_resources(root=root, pools_file=str(tmp_path / "pools.yaml")), principals
    access.forget_all()
    server.set_key_enabled(keys["lab-a"], True)


def _probe(tenant: str, resources: dict, instance, **config) -> dg.ExecuteInProcessResult:
    spec = StepSpec(name=f"probe.{tenant}", entry_point="tests.workloads.tenant_probe", tenant=tenant, gpus=1, imports=["numpy"],
                    config={"weights": WEIGHTS[tenant], **config})

    @dg.asset(name=f"probe_{tenant.replace('-', '_')}")
    def probe(context: dg.AssetExecutionContext, compute: ComputeResource) -> dg.MaterializeResult:
        step = compute.run(context, spec, lineage=f"probe/{tenant}")
        return dg.MaterializeResult(metadata={**step.metadata(), "checkpoint": step.final_checkpoint})

    return dg.materialize([probe], instance=instance, resources=resources, raise_on_error=False)


def _metadata(result: dg.ExecuteInProcessResult) -> dict:
    event = result.get_asset_materialization_events()[0]
    return {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}


def test_a_tenant_workload_cannot_reach_another_tenants_objects_or_key(tenancy, instance):
    server, keys, root, resources, principals = tenancy
    first = _probe("lab-a", resources, instance)
    assert first.success
    a_checkpoint = str(_metadata(first)["checkpoint"])
    assert a_checkpoint.startswith("s3://lab-a-data/") and "/checkpoints/probe/lab-a/" in a_checkpoint
    a_object = f"{a_checkpoint}/model.safetensors"

    second = _probe("lab-b", resources, instance, list=[a_checkpoint], read=[a_object], overwrite=[a_object], open_checkpoint=[a_checkpoint.rsplit("/", 1)[0]])
    assert second.success
    found = _metadata(second)
    probes = json.loads(found["probes"])
    assert len(probes) == 4
    for what, answer in probes.items():
        assert answer.startswith("refused: PermissionError"), f"{what}: {answer}"  # S3 AccessDenied, from the server
    assert found["aws_key_seen"] == principals["lab-b"].access_key_id  # its tenant's key, not the platform's it inherited

    # A's checkpoint is whole and still A's (the overwrite was refused), and A reads it back.
    again = _probe("lab-a", resources, instance)
    assert again.success and _metadata(again)["resumed"] is True

    # B's key cannot open A's data even given A's bytes: refused before KMS is asked, and KMS itself
    # refuses B's key on A's wrapped data key.
    import io

    from aws_encryption_sdk.internal.formatting.deserialize import deserialize_header
    from botocore.exceptions import ClientError

    from workload_runtime.envelope import open_bytes, read_header

    sealed = server.client("s3", server.admin).get_object(Bucket="lab-a-data", Key=a_object.removeprefix("s3://lab-a-data/"))["Body"].read()
    header = read_header(sealed)
    assert header.tenant == "lab-a" and header.key_id.endswith(f":key/{keys['lab-a']}")  # the KMS key's ARN
    b = principals["lab-b"]
    b_keyring = KmsKeyring("lab-b", keys["lab-b"], "us-east-1", server.endpoint, {"aws_access_key_id": b.access_key_id, "aws_secret_access_key": b.secret_access_key})
    with pytest.raises(KeyUnavailable, match="sealed for tenant `lab-a`"):
        open_bytes(sealed, b_keyring)
    (wrapped,) = deserialize_header(io.BytesIO(sealed))[0].encrypted_data_keys
    with pytest.raises(ClientError):
        b_keyring.client().decrypt(CiphertextBlob=wrapped.encrypted_data_key, KeyId=keys["lab-b"], EncryptionContext={"tenant": "lab-a"})

    ledger = read_ledger(Storage.at(root).ledger())
    assert set(ledger["tenant"]) == {"lab-a", "lab-b"} and set(ledger["lane"]) == {"cell"}


def test_nothing_stored_holds_a_tenants_weights_in_the_clear(tenancy, instance):
    server, _, _, resources, _ = tenancy
    for tenant in ("lab-a", "lab-b"):
        assert _probe(tenant, resources, instance).success
    s3 = server.client("s3", server.admin)
    needles = {t: np.asarray(w, dtype=np.float32).tobytes() for t, w in WEIGHTS.items()}
    scanned = 0
    for bucket in ("platform", "lab-a-data", "lab-b-data"):
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", []):
                body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
                scanned += 1
                for tenant, needle in needles.items():
                    assert needle not in body, f"{bucket}/{item['Key']} holds {tenant}'s weights in the clear"
    assert scanned >= 4


def test_a_revoked_key_stops_its_tenant_at_the_next_attempt_and_leaves_the_other_running(tenancy, instance):
    server, keys, _, resources, _ = tenancy
    assert _probe("lab-a", resources, instance).success
    assert _probe("lab-b", resources, instance).success
    server.set_key_enabled(keys["lab-a"], False)

    refused = _probe("lab-a", resources, instance)
    assert not refused.success
    failure = next(e for e in refused.all_events if e.event_type_value == "STEP_FAILURE")
    said = str(failure.event_specific_data.error)
    assert "lab-a" in said and keys["lab-a"] in said and "DisabledException" in said

    other = _probe("lab-b", resources, instance)
    assert other.success and _metadata(other)["resumed"] is True

    server.set_key_enabled(keys["lab-a"], True)
    restored = _probe("lab-a", resources, instance)
    assert restored.success and _metadata(restored)["resumed"] is True


def test_a_kms_tenant_moves_to_a_new_kms_key_and_its_workloads_resume_without_the_old_one(tenancy, instance, monkeypatch):
    """`sinewgrid tenants reseal lab-a --old-kms-key OLD` after the catalog names a new KMS key."""
    from typer.testing import CliRunner

    from sinewgrid.cli import app
    from workload_runtime.envelope import FORMAT, read_header

    server, keys, root, resources, principals = tenancy
    assert _probe("lab-a", resources, instance).success
    new_key = server.kms_key(principals["lab-a"], "lab-a's new key")
    alias = f"alias/lab-a-{Path(os.environ['SINEWGRID_TENANTS']).parent.name}"  # the catalog may name a key by an alias
    server.client("kms", server.admin).create_alias(AliasName=alias, TargetKeyId=new_key)
    catalog_file = Path(os.environ["SINEWGRID_TENANTS"])
    catalog = json.loads(catalog_file.read_text())
    catalog["tenants"]["lab-a"]["key"]["key_id"] = alias
    catalog_file.write_text(json.dumps(catalog))
    monkeypatch.setenv("SINEWGRID_HOME", root)

    without_old = CliRunner().invoke(app, ["tenants", "reseal", "lab-a"])  # the old key is not named: refused, nothing changed
    assert without_old.exit_code == 1 and "Nothing that did not check was changed" in without_old.output, without_old.output
    result = CliRunner().invoke(app, ["tenants", "reseal", "lab-a", "--old-kms-key", keys["lab-a"]])
    assert result.exit_code == 0 and "objects resealed" in result.output, result.output

    s3 = server.client("s3", server.admin)
    sealed, prefix = 0, catalog["tenants"]["lab-a"]["storage"].removeprefix("s3://lab-a-data/") + "/"  # this test's root in the shared bucket
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket="lab-a-data", Prefix=prefix):
        for item in page.get("Contents", []):
            body = s3.get_object(Bucket="lab-a-data", Key=item["Key"])["Body"].read()
            header = read_header(body)
            assert header.format == FORMAT and header.key_id.endswith(f":key/{new_key}"), item["Key"]
            sealed += 1
    assert sealed >= 2
    server.set_key_enabled(keys["lab-a"], False)  # the old key off for good: the workload reads under the new one
    again = _probe("lab-a", resources, instance)
    assert again.success and _metadata(again)["resumed"] is True
