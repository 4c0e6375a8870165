"""A real AWS API server on loopback with IAM enforced, for the tenancy tests: moto's server.

What is real: moto's own S3, IAM and KMS HTTP APIs, served by one `moto.server` process on
127.0.0.1, and moto's IAM enforcement. Once `aws_server()` has switched it on, every request
must be SigV4-signed by an access key of a user that exists in the server's IAM, and the
server evaluates that user's policies itself: a refusal (`AccessDenied`, `InvalidAccessKeyId`,
`SignatureDoesNotMatch`) comes from the server, never from our code.

What is added: one check AWS KMS makes and moto 5.2.5 does not. Real KMS refuses
Encrypt, Decrypt, ReEncrypt and GenerateDataKey with a key that is not enabled
(`DisabledException`, "<key arn> is disabled."; `KMSInvalidStateException` for a key pending
deletion); moto ignores the key's state. `python -m testbed.aws_server --serve` patches that
check into moto's KMS backend and then runs moto's server main; `aws_server()` starts the
server that way. Nothing else in moto is changed.

What moto enforces and what it does not (moto 5.2.5, measured; tests/test_aws_testbed.py pins it):
- Authentication: an unknown access key is refused (`InvalidAccessKeyId`), a wrong secret too
  (`SignatureDoesNotMatch`); IAM calls need IAM permissions like any other.
- S3: the action (`s3:GetObject`, `s3:PutObject`, `s3:ListBucket`, ...) and the resource
  (`arn:aws:s3:::bucket` for bucket operations, `arn:aws:s3:::bucket/key` for object
  operations, each key of a DeleteObjects on its own) are matched against the user's
  Allow/Deny statements. A tenant is refused Get/Put/Delete outside its bucket or prefix,
  and ListBucket of a bucket it is not granted.
- S3 policy conditions are IGNORED: moto gives the evaluation no request values (no
  `s3:prefix`) and a condition with no values passes. A ListBucket statement limited by an
  `s3:prefix` condition therefore grants listing of the WHOLE bucket: tenants sharing one
  bucket under prefixes see each other's key names (not their contents). Only tenants
  isolated by bucket (`tenant_principal(name, bucket, prefix="")`) are refused each other's
  listings by the server.
- CopyObject checks only `s3:PutObject` on the destination, NOT `s3:GetObject` on the
  source: a tenant can copy another tenant's object into its own space and read it there.
- HeadBucket is checked as the action `s3:HeadBucket` (AWS checks `s3:ListBucket`); the
  tenant policies grant it beside ListBucket so a tenant can HEAD its own bucket.
- KMS: the IAM action (`kms:Decrypt`, ...) is checked, but always against the resource "*":
  a statement naming a key ARN never matches (so it refuses everything), and a user allowed
  `kms:Decrypt` on "*" can use ANY key of the account, another tenant's included. Key
  policies are consulted only for DescribeKey, and only their Deny statements. Per-key
  isolation between tenants is NOT enforced by this server. A KMS refusal comes back as
  HTTP 403 with an XML body that botocore cannot parse for a JSON service: the ClientError's
  code is "403", not "AccessDeniedException".
- The `/moto-api/` endpoints (reset, reset-auth) take no credentials at all.

Run by hand: `python -m testbed.aws_server` starts one, prints its endpoint and admin keys,
and stops it on Enter.
"""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from control_plane.settings import child_env
from testbed import leftovers
from testbed.s3_server import FOLDER_ENV, START_TIMEOUT_S, _wait_until_it_answers

PREFIX = "sinewgrid-aws-"
REGION = "us-east-1"
ADMIN_NAME = "sinewgrid-admin"
REPO_ROOT = Path(__file__).resolve().parent.parent
# Actions a tenant needs on its own KMS keys. moto checks them against the resource "*" only.
TENANT_KMS_ACTIONS = ["kms:CreateKey", "kms:DescribeKey", "kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*"]


@dataclass(frozen=True)
class Principal:
    """An IAM user of the server and its access key."""

    name: str
    access_key_id: str
    secret_access_key: str


@dataclass(frozen=True)
class AwsServer:
    """A running server: its endpoint and the admin user (allowed everything)."""

    endpoint: str
    admin: Principal

    def client(self, service: str, principal: Principal) -> Any:
        """A boto3 client for `service` at this endpoint, signed as `principal`."""
        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=principal.access_key_id,
            aws_secret_access_key=principal.secret_access_key,
            config=Config(retries={"max_attempts": 1}),
        )

    def principal(self, name: str, statements: list[dict[str, Any]]) -> Principal:
        """Create IAM user `name` with one inline policy made of `statements`; its access key."""
        return _create_principal(self.client("iam", self.admin), name, statements)

    def tenant_principal(self, name: str, bucket: str, prefix: str = "", kms: bool = True) -> Principal:
        """Create IAM user `name` confined to `bucket` (prefix "") or to `bucket/prefix/`; its access key.

        With a prefix: Get/Put/Delete/AbortMultipartUpload on `arn:aws:s3:::{bucket}/{prefix}/*`
        and ListBucket on the bucket only for keys under the prefix (an `s3:prefix` condition).
        moto ignores that condition: such a tenant may list the whole bucket (see the module
        docstring). Without a prefix: the same object
        actions on `arn:aws:s3:::{bucket}/*` and ListBucket on `arn:aws:s3:::{bucket}`, which
        moto enforces fully. `kms`: also allow the KMS actions a tenant needs for its own keys
        (on "*": moto cannot confine KMS to a key, see the module docstring)."""
        prefix = prefix.strip("/")
        object_actions = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
        # s3:HeadBucket: moto's name for HEAD on a bucket, which AWS grants with s3:ListBucket.
        list_actions = ["s3:ListBucket", "s3:HeadBucket"]
        list_statement: dict[str, Any] = {"Effect": "Allow", "Action": list_actions, "Resource": [f"arn:aws:s3:::{bucket}"]}
        if prefix:
            objects = f"arn:aws:s3:::{bucket}/{prefix}/*"
            list_statement["Condition"] = {"StringLike": {"s3:prefix": [prefix, f"{prefix}/*"]}}
        else:
            objects = f"arn:aws:s3:::{bucket}/*"
        statements = [{"Effect": "Allow", "Action": object_actions, "Resource": [objects]}, list_statement]
        if kms:
            statements.append({"Effect": "Allow", "Action": TENANT_KMS_ACTIONS, "Resource": ["*"]})
        return self.principal(name, statements)

    def kms_key(self, principal: Principal, description: str = "") -> str:
        """Create a symmetric KMS key as `principal`; its KeyId."""
        kms = self.client("kms", principal)
        return kms.create_key(Description=description, KeySpec="SYMMETRIC_DEFAULT", KeyUsage="ENCRYPT_DECRYPT")["KeyMetadata"]["KeyId"]

    def set_key_enabled(self, key_id: str, enabled: bool) -> None:
        """EnableKey / DisableKey, as admin."""
        kms = self.client("kms", self.admin)
        if enabled:
            kms.enable_key(KeyId=key_id)
        else:
            kms.disable_key(KeyId=key_id)

    def env(self, principal: Principal) -> dict[str, str]:
        """Environment variables that make a subprocess's AWS SDK talk to this server as `principal`."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": principal.access_key_id,
            "AWS_SECRET_ACCESS_KEY": principal.secret_access_key,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
        }


@contextlib.contextmanager
def aws_server(timeout_s: float = START_TIMEOUT_S) -> Iterator[AwsServer]:
    """Start one moto server (KMS key-state check added) on a port it picks itself, create
    the admin user, switch IAM enforcement on, yield the server; stop it on exit."""
    leftovers.sweep(PREFIX)  # servers a killed earlier run left behind
    with tempfile.TemporaryDirectory(prefix=PREFIX) as folder:
        leftovers.claim(Path(folder))
        log_path = Path(folder) / "moto.log"
        # Auth starts off (moto's default, made explicit) so the admin user can be created. `-m` from
        # the checkout (cwd) finds `testbed` without PYTHONPATH.
        env = child_env({FOLDER_ENV: folder, "INITIAL_NO_AUTH_ACTION_COUNT": "inf"})
        with log_path.open("wb") as log:
            server = subprocess.Popen(
                [sys.executable, "-m", "testbed.aws_server", "--serve"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=REPO_ROOT,
            )
        try:
            endpoint = _wait_until_it_answers(server, log_path, timeout_s)
            bootstrap = Principal("bootstrap", "testing", "testing")  # any key works while auth is off
            admin = _create_principal(
                AwsServer(endpoint, bootstrap).client("iam", bootstrap),
                ADMIN_NAME,
                [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
            )
            _enforce_iam(endpoint)
            yield AwsServer(endpoint, admin)
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=10)


def _create_principal(iam: Any, name: str, statements: list[dict[str, Any]]) -> Principal:
    iam.create_user(UserName=name)
    document = json.dumps({"Version": "2012-10-17", "Statement": statements})
    iam.put_user_policy(UserName=name, PolicyName=f"{name}-policy", PolicyDocument=document)
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return Principal(name, key["AccessKeyId"], key["SecretAccessKey"])


def _enforce_iam(endpoint: str) -> None:
    """From the next request on, the server authenticates and authorizes every request
    (moto's `set_initial_no_auth_action_count(0)`, over HTTP). Not a form body: werkzeug would
    parse one away and moto would read an empty count."""
    request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"})
    with urllib.request.urlopen(request, timeout=10) as response:
        answer = json.loads(response.read())
    if answer.get("status") != "ok":
        raise RuntimeError(f"moto did not switch IAM enforcement on: {answer}")


# --- inside the server process -------------------------------------------------------------


def patch_kms_key_state() -> None:
    """Make moto's KMS backend refuse cryptographic operations with a key that is not enabled,
    as AWS KMS does. ReEncrypt and GenerateDataKey also go through the patched Encrypt/Decrypt."""
    from moto.core.exceptions import JsonRESTError
    from moto.kms.models import KmsBackend

    class DisabledException(JsonRESTError):
        code = 400

        def __init__(self, arn: str) -> None:
            super().__init__("DisabledException", f"{arn} is disabled.")

    class KMSInvalidStateException(JsonRESTError):
        code = 400

        def __init__(self, arn: str, state: str) -> None:
            super().__init__("KMSInvalidStateException", f"{arn} is {'pending deletion' if state == 'PendingDeletion' else state}.")

    def require_enabled(backend: KmsBackend, key_id: str) -> None:
        key = backend.keys.get(backend.any_id_to_key_id(key_id))
        if key is None or key.key_state == "Enabled":
            return  # an unknown key: moto's own answer stands
        if key.key_state == "Disabled":
            raise DisabledException(key.arn)
        raise KMSInvalidStateException(key.arn, key.key_state)

    def before(method_name: str, key_param: str) -> None:
        original = getattr(KmsBackend, method_name)

        @functools.wraps(original)
        def checked(self: KmsBackend, *args: Any, **kwargs: Any) -> Any:
            require_enabled(self, kwargs[key_param])
            return original(self, *args, **kwargs)

        setattr(KmsBackend, method_name, checked)

    original_decrypt = KmsBackend.decrypt

    @functools.wraps(original_decrypt)
    def decrypt(self: KmsBackend, *args: Any, **kwargs: Any) -> Any:
        # The key is named inside the ciphertext: decrypt, then refuse if that key is not enabled.
        plaintext, arn = original_decrypt(self, *args, **kwargs)
        require_enabled(self, arn)
        return plaintext, arn

    KmsBackend.decrypt = decrypt  # type: ignore[method-assign]
    before("encrypt", "key_id")
    before("generate_data_key", "key_id")
    before("re_encrypt", "destination_key_id")  # the source key is checked by decrypt


def serve() -> None:
    """The server process: moto's server main on 127.0.0.1, a port of its choosing, with the
    KMS key-state check patched in."""
    patch_kms_key_state()
    from moto.server import main

    main(["-H", "127.0.0.1", "-p", "0"])


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        with aws_server() as aws:
            admin = aws.admin
            input(f"AWS APIs at {aws.endpoint}, admin key {admin.access_key_id} / {admin.secret_access_key}; Enter stops it. ")
