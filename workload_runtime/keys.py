"""A tenant's key, as a keyring: where its key lives and how to reach it, never a copy elsewhere.

Envelope encryption (`envelope.py`, the AWS Encryption SDK's message format) seals each object
with a data key; the tenant's key wraps that data key (`master_keys.py`), and only the wrapped form
is stored. Two keyrings:

- `LocalKeyring`: the embedded default. The tenant's key is a JSON file outside the storage root
  (`<keys dir>/<tenant>.key`, mode 0600) holding 256 random bits, used as a raw AES keyring.
  Disabling the key (`sinewgrid tenants key disable`) marks the file, and every later use fails.
- `KmsKeyring`: the tenant's key in its own AWS KMS (`GenerateDataKey` / `Decrypt`, with the
  tenant's name in the encryption context). The key never leaves KMS; disabling it in KMS stops
  every later read.

Every use is appended to `key_uses()` (tenant, key id, operation; never key material), for the
lineage. Workload side as well: no Dagster.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from workload_runtime.node_env import node_env

DATA_KEY_BYTES = 32


class KeyUnavailable(RuntimeError):
    """The tenant's key refused (disabled, missing, no access): names the tenant, the key and the fix."""

    def __init__(self, tenant: str, key_id: str, reason: str, fix: str = "") -> None:
        self.tenant, self.key_id, self.reason = tenant, key_id, reason
        super().__init__(
            f"tenant `{tenant}`: its key {key_id} cannot be used ({reason}); its weights and data stay unreadable until it is. "
            + (fix or "Ask the tenant to re-enable the key (docs/tenancy.md, 'Revoking and restoring a key').")
        )


@dataclass
class KeyUse:
    tenant: str
    key_id: str
    op: str  # generate | unwrap
    at: str


_USES: list[KeyUse] = []


def key_uses(since: int = 0) -> list[KeyUse]:
    """The key uses of this process, in order (from index `since`)."""
    return _USES[since:]


def _used(tenant: str, key_id: str, op: str) -> None:
    _USES.append(KeyUse(tenant, key_id, op, dt.datetime.now(dt.UTC).isoformat(timespec="seconds")))
    del _USES[:-10_000]


@dataclass
class LocalKeyring:
    """A tenant's key in a local file (the embedded default)."""

    tenant: str
    path: Path
    create: bool = False  # make the file on first use when it does not exist (the control plane, not workloads)
    _material: bytes | None = field(default=None, repr=False)
    _key_id: str = ""

    def _load(self) -> dict[str, Any]:
        if not self.path.exists():
            if not self.create:
                raise KeyUnavailable(self.tenant, f"local:{self.tenant}", f"no key file at {self.path}", "Create it with `sinewgrid tenants key create " + self.tenant + "`, or point `key.file` at it.")
            create_local_key(self.path, self.tenant)
        try:
            doc = json.loads(self.path.read_text())
            material = base64.b64decode(doc["material"])
        except (OSError, ValueError, KeyError) as exc:
            raise KeyUnavailable(self.tenant, f"local:{self.tenant}", f"the key file {self.path} is unreadable ({exc})", "Restore it from the tenant's backup.") from None
        if len(material) != DATA_KEY_BYTES:
            raise KeyUnavailable(self.tenant, f"local:{self.tenant}", f"the key file {self.path} does not hold a 256-bit key")
        self._key_id = doc.get("key_id") or local_key_id(self.tenant, material)
        if not doc.get("enabled", True):
            raise KeyUnavailable(self.tenant, self._key_id, f"disabled on {doc.get('disabled_at', '?')}", f"Re-enable it with `sinewgrid tenants key enable {self.tenant}`.")
        return doc

    @property
    def key_id(self) -> str:
        if not self._key_id:
            try:
                self._load()
            except KeyUnavailable as exc:
                return exc.key_id
        return self._key_id

    def material(self) -> bytes:
        """The key's 256 bits, read each time: a key disabled a moment ago is disabled now."""
        return base64.b64decode(self._load()["material"])

    def unwrap(self, wrapped: bytes) -> bytes:
        """A data key of the retired SGSEAL1 format (`legacy_seal.py`), unwrapped for `reseal`."""
        aes = AESGCM(self.material())
        try:
            plain = aes.decrypt(wrapped[:12], wrapped[12:], self.tenant.encode())
        except Exception:  # cryptography's InvalidTag: another key wrapped it
            raise KeyUnavailable(self.tenant, self._key_id, "this data key was wrapped by another key", "The data belongs to another tenant, or the key file was replaced.") from None
        _used(self.tenant, self._key_id, "unwrap")
        return plain


    def names(self, key_id: str) -> bool:
        """Whether `key_id`, as a sealed object's header names its key, is this key."""
        return key_id == self.key_id

    def retired(self, key_id: str) -> LocalKeyring | None:
        """This tenant's retired key `key_id`, kept beside the key file when it was rotated
        (`retire_local_key`), so data still sealed under it opens until it is resealed."""
        fingerprint = key_id.removeprefix(f"local:{self.tenant}:")
        if not _FINGERPRINT.fullmatch(fingerprint):  # a header's key id is the writer's word: never a path
            return None
        path = retired_key_path(self.path, self.tenant, fingerprint)
        return LocalKeyring(self.tenant, path) if path.exists() else None


_FINGERPRINT = re.compile(r"[0-9a-f]{12}")


def retired_key_path(key_file: Path, tenant: str, fingerprint: str) -> Path:
    return key_file.parent / "retired" / tenant / f"{fingerprint}.key"


def rotate_local_key(path: Path, tenant: str) -> tuple[str, str, Path]:
    """A new key for `tenant` at `path`; the old one kept, unchanged, as a retired key (it still
    opens what it sealed, for `sinewgrid tenants reseal`). Returns (old key id, new key id, where
    the old key is kept). At every moment `path` holds the old key or the new one, never neither."""
    old = LocalKeyring(tenant, path)
    old.material()  # a missing or disabled key is not rotated
    old_id = old.key_id
    kept = retired_key_path(path, tenant, old_id.rsplit(":", 1)[-1])
    kept.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not kept.exists():
        os.link(path, kept)
    fresh = path.with_name(f".{path.name}.new")
    fresh.unlink(missing_ok=True)
    new_id = create_local_key(fresh, tenant)
    os.replace(fresh, path)
    return old_id, new_id, kept


def local_key_id(tenant: str, material: bytes) -> str:
    """A local key's id: the tenant and a fingerprint (never the key)."""
    return f"local:{tenant}:{hashlib.sha256(b'sinewgrid-key-id' + material).hexdigest()[:12]}"


def create_local_key(path: Path, tenant: str) -> str:
    """A new 256-bit key file (mode 0600, its folder 0700); refuses to replace an existing one."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    material = os.urandom(DATA_KEY_BYTES)
    key_id = local_key_id(tenant, material)
    doc = {"tenant": tenant, "key_id": key_id, "material": base64.b64encode(material).decode(), "enabled": True,
           "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh, indent=2)
    return key_id


def set_local_key_enabled(path: Path, enabled: bool) -> dict[str, Any]:
    """Disable or re-enable a local key (the file is kept: nothing is lost)."""
    doc = json.loads(path.read_text())
    doc["enabled"] = enabled
    if enabled:
        doc.pop("disabled_at", None)
    else:
        doc["disabled_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh, indent=2)
    os.replace(tmp, path)
    return doc


@dataclass
class KmsKeyring:
    """A tenant's key in its AWS KMS (or a KMS API at `endpoint`), used with the tenant's credentials."""

    tenant: str
    key_id: str
    region: str = ""
    endpoint: str = ""
    credentials: dict[str, str] = field(default_factory=dict, repr=False)  # aws_access_key_id, aws_secret_access_key, aws_session_token
    _client: Any = field(default=None, repr=False)
    _arn: str = field(default="", repr=False)  # what an alias `key_id` points to

    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.session.Session().client(
                "kms", region_name=self.region or node_env().aws_default_region or "us-east-1",
                endpoint_url=self.endpoint or None, **{k: v for k, v in self.credentials.items() if v},
            )
        return self._client

    def names(self, key_arn: str) -> bool:
        """Whether the key ARN a sealed object's header names is this key: by its id or ARN as the
        catalog writes it, or, for an alias, the key the alias points to now (asked of KMS once)."""
        if key_arn == self.key_id or key_arn.endswith("/" + self.key_id):
            return True
        if "alias/" not in self.key_id:
            return False
        if not self._arn:
            from botocore.exceptions import BotoCoreError, ClientError

            try:
                self._arn = self.client().describe_key(KeyId=self.key_id)["KeyMetadata"]["Arn"]
            except (ClientError, BotoCoreError) as exc:
                raise self.refused(exc) from None
        return key_arn == self._arn

    def refused(self, exc: BaseException) -> KeyUnavailable:
        """What KMS answered, as `KeyUnavailable` with the fix."""
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
        message = getattr(exc, "response", {}).get("Error", {}).get("Message", str(exc))
        fix = {
            "DisabledException": "The key is disabled in the tenant's KMS; the tenant re-enables it there (`aws kms enable-key`).",
            "AccessDeniedException": "These credentials may not use this key: check the key policy and the role (deploy/tenancy/).",
            "NotFoundException": "No such key in this KMS and region: check `key.key_id` and `key.region` in the tenants catalog.",
        }.get(code, "")
        return KeyUnavailable(self.tenant, self.key_id, f"KMS answered {code}: {message}", fix)

    def unwrap(self, wrapped: bytes) -> bytes:
        """A data key of the retired SGSEAL1 format (`legacy_seal.py`), unwrapped for `reseal`."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            answer = self.client().decrypt(CiphertextBlob=wrapped, KeyId=self.key_id, EncryptionContext={"tenant": self.tenant})
        except (ClientError, BotoCoreError) as exc:
            raise self.refused(exc) from None
        _used(self.tenant, self.key_id, "unwrap")
        return answer["Plaintext"]


Keyring = LocalKeyring | KmsKeyring
