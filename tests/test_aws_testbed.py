"""The tenancy test engine (testbed/aws_server.py): moto's server with IAM enforced and KMS
honouring key state.

Every refusal checked here comes from the server: the clients are plain boto3 / s3fs signed
with the tenant's own access key. The "moto gaps" tests at the end pin what moto does NOT
enforce (see the module docstring of testbed/aws_server.py); one failing means moto has
changed and that docstring must be brought up to date.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import botocore.exceptions
import pytest

from testbed.aws_server import AwsServer, Principal, aws_server

pytestmark = pytest.mark.engines

SHARED = "tenants-shared"  # one bucket, a prefix per tenant
BUCKET_A, BUCKET_B = "tenants-a", "tenants-b"  # a bucket per tenant


@pytest.fixture(scope="module")
def aws() -> Iterator[AwsServer]:
    with aws_server() as server:
        s3 = server.client("s3", server.admin)
        for bucket in (SHARED, BUCKET_A, BUCKET_B):
            s3.create_bucket(Bucket=bucket)
        yield server


@pytest.fixture(scope="module")
def by_bucket(aws: AwsServer) -> tuple[Principal, Principal]:
    return aws.tenant_principal("bucket-tenant-a", BUCKET_A), aws.tenant_principal("bucket-tenant-b", BUCKET_B)


@pytest.fixture(scope="module")
def by_prefix(aws: AwsServer) -> tuple[Principal, Principal]:
    return aws.tenant_principal("prefix-tenant-a", SHARED, "a"), aws.tenant_principal("prefix-tenant-b", SHARED, "b")


def error_code(call) -> str:
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        call()
    return refused.value.response["Error"]["Code"]


def keys(listing: dict) -> list[str]:
    return [item["Key"] for item in listing.get("Contents", [])]


# --- S3: a bucket per tenant -----------------------------------------------------------------


def test_bucket_tenant_uses_its_own_bucket(aws: AwsServer, by_bucket: tuple[Principal, Principal]) -> None:
    s3 = aws.client("s3", by_bucket[0])
    s3.put_object(Bucket=BUCKET_A, Key="own/one.txt", Body=b"a1")
    assert s3.get_object(Bucket=BUCKET_A, Key="own/one.txt")["Body"].read() == b"a1"
    assert "own/one.txt" in keys(s3.list_objects_v2(Bucket=BUCKET_A))
    s3.head_bucket(Bucket=BUCKET_A)
    s3.delete_object(Bucket=BUCKET_A, Key="own/one.txt")


def test_bucket_tenant_is_refused_the_other_bucket(aws: AwsServer, by_bucket: tuple[Principal, Principal]) -> None:
    aws.client("s3", by_bucket[0]).put_object(Bucket=BUCKET_A, Key="secret.txt", Body=b"a")
    other = aws.client("s3", by_bucket[1])
    assert error_code(lambda: other.get_object(Bucket=BUCKET_A, Key="secret.txt")) == "AccessDenied"
    assert error_code(lambda: other.put_object(Bucket=BUCKET_A, Key="secret.txt", Body=b"b")) == "AccessDenied"
    assert error_code(lambda: other.list_objects_v2(Bucket=BUCKET_A)) == "AccessDenied"
    assert error_code(lambda: other.delete_object(Bucket=BUCKET_A, Key="secret.txt")) == "AccessDenied"
    assert aws.client("s3", aws.admin).get_object(Bucket=BUCKET_A, Key="secret.txt")["Body"].read() == b"a"


# --- S3: one bucket, a prefix per tenant -----------------------------------------------------


def test_prefix_tenant_uses_its_own_prefix(aws: AwsServer, by_prefix: tuple[Principal, Principal]) -> None:
    s3 = aws.client("s3", by_prefix[0])
    s3.put_object(Bucket=SHARED, Key="a/one.txt", Body=b"a1")
    assert s3.get_object(Bucket=SHARED, Key="a/one.txt")["Body"].read() == b"a1"
    assert "a/one.txt" in keys(s3.list_objects_v2(Bucket=SHARED, Prefix="a/"))


def test_prefix_tenant_is_refused_the_other_prefix(aws: AwsServer, by_prefix: tuple[Principal, Principal]) -> None:
    aws.client("s3", by_prefix[0]).put_object(Bucket=SHARED, Key="a/secret.txt", Body=b"a")
    other = aws.client("s3", by_prefix[1])
    assert error_code(lambda: other.get_object(Bucket=SHARED, Key="a/secret.txt")) == "AccessDenied"
    assert error_code(lambda: other.head_object(Bucket=SHARED, Key="a/secret.txt")) == "403"
    assert error_code(lambda: other.put_object(Bucket=SHARED, Key="a/secret.txt", Body=b"b")) == "AccessDenied"
    assert error_code(lambda: other.delete_object(Bucket=SHARED, Key="a/secret.txt")) == "AccessDenied"
    deleted = other.delete_objects(Bucket=SHARED, Delete={"Objects": [{"Key": "a/secret.txt"}]})
    assert [e["Code"] for e in deleted.get("Errors", [])] == ["AccessDenied"]
    assert error_code(lambda: other.put_object(Bucket=SHARED, Key="outside.txt", Body=b"b")) == "AccessDenied"
    assert aws.client("s3", aws.admin).get_object(Bucket=SHARED, Key="a/secret.txt")["Body"].read() == b"a"


# --- authentication --------------------------------------------------------------------------


def test_unknown_or_forged_credentials_are_refused(aws: AwsServer, by_bucket: tuple[Principal, Principal]) -> None:
    unknown = aws.client("s3", Principal("nobody", "AKIA" + uuid.uuid4().hex[:16].upper(), "not-a-secret"))
    assert error_code(lambda: unknown.list_objects_v2(Bucket=BUCKET_A)) == "InvalidAccessKeyId"
    forged = aws.client("s3", Principal("forged", by_bucket[0].access_key_id, "wrong-secret"))
    assert error_code(lambda: forged.get_object(Bucket=BUCKET_A, Key="secret.txt")) == "SignatureDoesNotMatch"


def test_a_tenant_cannot_make_itself_users(aws: AwsServer, by_bucket: tuple[Principal, Principal]) -> None:
    iam = aws.client("iam", by_bucket[1])
    assert error_code(lambda: iam.create_user(UserName="escalated")) == "AccessDenied"


# --- s3fs and subprocesses -------------------------------------------------------------------


def test_s3fs_with_a_tenant_key(aws: AwsServer, by_prefix: tuple[Principal, Principal]) -> None:
    import s3fs

    def fs_of(principal: Principal) -> s3fs.S3FileSystem:
        return s3fs.S3FileSystem(
            key=principal.access_key_id,
            secret=principal.secret_access_key,
            client_kwargs={"endpoint_url": aws.endpoint, "region_name": "us-east-1"},
            skip_instance_cache=True,
        )

    mine, theirs = fs_of(by_prefix[0]), fs_of(by_prefix[1])
    with mine.open(f"{SHARED}/a/s3fs/data.bin", "wb") as f:
        f.write(b"payload")
    assert mine.cat(f"{SHARED}/a/s3fs/data.bin") == b"payload"
    assert mine.ls(f"{SHARED}/a/s3fs/") == [f"{SHARED}/a/s3fs/data.bin"]
    with pytest.raises(PermissionError):
        theirs.cat(f"{SHARED}/a/s3fs/data.bin")
    with pytest.raises(PermissionError):
        theirs.pipe(f"{SHARED}/a/s3fs/data.bin", b"overwritten")
    # s3fs deletes through DeleteObjects and does not raise on its per-key errors (a TODO in
    # s3fs's _bulk_delete): the server refuses the key, s3fs stays silent, the object survives.
    theirs.rm(f"{SHARED}/a/s3fs/data.bin")
    assert mine.cat(f"{SHARED}/a/s3fs/data.bin") == b"payload"


def test_env_lets_a_subprocess_act_as_the_tenant(aws: AwsServer, by_bucket: tuple[Principal, Principal]) -> None:
    script = (
        "import boto3, botocore.exceptions as e\n"
        "s3 = boto3.client('s3')\n"
        "s3.put_object(Bucket='tenants-a', Key='sub/x', Body=b'1')\n"
        "try:\n"
        "    s3.list_objects_v2(Bucket='tenants-b')\n"
        "    print('listed')\n"
        "except e.ClientError as err:\n"
        "    print(err.response['Error']['Code'])\n"
    )
    env = {"PATH": "/usr/bin:/bin", **aws.env(by_bucket[0])}
    done = subprocess.run([sys.executable, "-c", script], check=False, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "AccessDenied"
    assert aws.client("s3", aws.admin).get_object(Bucket=BUCKET_A, Key="sub/x")["Body"].read() == b"1"


# --- KMS ---------------------------------------------------------------------------------------


def test_kms_refuses_a_disabled_key(aws: AwsServer, by_bucket: tuple[Principal, Principal]) -> None:
    owner = by_bucket[0]
    kms = aws.client("kms", owner)
    key, other_key = aws.kms_key(owner, "tenant a data"), aws.kms_key(owner, "tenant a other")
    data_key = kms.generate_data_key(KeyId=key, KeySpec="AES_256")
    other_data_key = kms.generate_data_key(KeyId=other_key, KeySpec="AES_256")
    assert kms.decrypt(CiphertextBlob=data_key["CiphertextBlob"])["Plaintext"] == data_key["Plaintext"]

    aws.set_key_enabled(key, False)
    try:
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            kms.decrypt(CiphertextBlob=data_key["CiphertextBlob"])
        assert refused.value.response["Error"]["Code"] == "DisabledException"
        assert refused.value.response["Error"]["Message"].endswith(f"key/{key} is disabled.")
        assert error_code(lambda: kms.generate_data_key(KeyId=key, KeySpec="AES_256")) == "DisabledException"
        assert error_code(lambda: kms.encrypt(KeyId=key, Plaintext=b"x")) == "DisabledException"
        blob = data_key["CiphertextBlob"]
        assert error_code(lambda: kms.re_encrypt(CiphertextBlob=blob, DestinationKeyId=other_key)) == "DisabledException"
        # The other key is untouched.
        assert kms.decrypt(CiphertextBlob=other_data_key["CiphertextBlob"])["Plaintext"] == other_data_key["Plaintext"]
        assert kms.generate_data_key(KeyId=other_key, KeySpec="AES_256")["Plaintext"]
    finally:
        aws.set_key_enabled(key, True)
    assert kms.decrypt(CiphertextBlob=data_key["CiphertextBlob"])["Plaintext"] == data_key["Plaintext"]


def test_kms_refuses_a_principal_without_kms_rights(aws: AwsServer, by_bucket: tuple[Principal, Principal]) -> None:
    key = aws.kms_key(by_bucket[0], "tenant a")
    no_kms = aws.tenant_principal("no-kms", BUCKET_A, kms=False)
    kms = aws.client("kms", no_kms)
    # moto answers a JSON service's refusal with an XML body: botocore sees only the 403.
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        kms.generate_data_key(KeyId=key, KeySpec="AES_256")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


# --- moto gaps: what the server does NOT enforce (see testbed/aws_server.py) -------------------


def test_gap_listbucket_prefix_condition_is_ignored(aws: AwsServer, by_prefix: tuple[Principal, Principal]) -> None:
    aws.client("s3", by_prefix[0]).put_object(Bucket=SHARED, Key="a/listed.txt", Body=b"a")
    # On AWS the s3:prefix condition refuses this listing; moto lets tenant B see A's key names.
    assert "a/listed.txt" in keys(aws.client("s3", by_prefix[1]).list_objects_v2(Bucket=SHARED, Prefix="a/"))


def test_gap_copy_source_is_not_checked(aws: AwsServer, by_prefix: tuple[Principal, Principal]) -> None:
    aws.client("s3", by_prefix[0]).put_object(Bucket=SHARED, Key="a/copied.txt", Body=b"a")
    other = aws.client("s3", by_prefix[1])
    other.copy_object(Bucket=SHARED, Key="b/copy.txt", CopySource={"Bucket": SHARED, "Key": "a/copied.txt"})
    assert other.get_object(Bucket=SHARED, Key="b/copy.txt")["Body"].read() == b"a"


def test_gap_kms_keys_are_not_isolated_between_principals(aws: AwsServer, by_bucket: tuple[Principal, Principal]) -> None:
    key = aws.kms_key(by_bucket[0], "tenant a")
    data_key = aws.client("kms", by_bucket[0]).generate_data_key(KeyId=key, KeySpec="AES_256")
    # Tenant B holds kms:Decrypt on "*" (moto cannot confine it to a key) and so decrypts A's.
    assert aws.client("kms", by_bucket[1]).decrypt(CiphertextBlob=data_key["CiphertextBlob"])["Plaintext"] == data_key["Plaintext"]
