"""What one tenant's work may touch: its storage root, its storage credentials, its key.

The control plane builds a `TenantAccess` from the tenants catalog (`tenancy/control.py`) and hands it to
each attempt of a tenant's step in the workload inputs: the typed seam, never an environment
the workload inherits. The workload applies it (`apply`) before it touches storage: its
S3 credentials replace whatever the process inherited, and its keyring is registered for its
storage root, so `storage.write_bytes_atomic` seals what it writes there and `read_bytes` opens
it. Reads there fail closed: outside the root's plain areas (landing/, outbox/) an object that is
plain or sealed for another tenant is refused (`check_seal`), never read as the tenant's data.
A process holds only the keyrings registered in it: a workload only its own tenant's; the
control plane every tenant's (in production it runs in the customer's account).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workload_runtime.envelope import Opener, is_sealed, read_header
from workload_runtime.keys import Keyring, KeyUnavailable, KmsKeyring, LocalKeyring

AWS_CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")


class KeySpec(BaseModel):
    """The tenant's key: the key that wraps every data key of its weights and data.

    `local`: a key file outside the storage root (default `<keys dir>/<tenant>.key`; the keys
    folder is `SINEWGRID_KEYS_DIR`, else `~/.config/sinewgrid/keys`). `aws-kms`: a key in the
    customer's own KMS (`key_id`: its id, ARN or alias; `endpoint`: only for a KMS API that is
    not AWS's, as in the tests).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["local", "aws-kms"] = "local"
    file: str = Field("", description="local: the key file (default: <keys dir>/<tenant>.key).")
    key_id: str = Field("", description="aws-kms: the key's id, ARN or alias.")
    region: str = Field("", description="aws-kms: the KMS region (default: AWS_DEFAULT_REGION).")
    endpoint: str = Field("", description="aws-kms: a KMS endpoint other than AWS's (tests).")

    @model_validator(mode="after")
    def _names_its_key(self) -> KeySpec:
        if self.kind == "aws-kms" and not self.key_id:
            raise ValueError("an aws-kms key needs `key_id`: the key's id, ARN or alias in the tenant's KMS")
        return self


class StorageCredentials(BaseModel):
    """An access key whose policy allows only the tenant's prefix or bucket."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    access_key_id: str
    secret_access_key: str = Field(repr=False)
    session_token: str = Field("", repr=False)

    def boto(self) -> dict[str, str]:
        return {"aws_access_key_id": self.access_key_id, "aws_secret_access_key": self.secret_access_key, "aws_session_token": self.session_token}


class TenantAccess(BaseModel):
    """One tenant's access, as handed to its workloads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: str
    storage_root: str
    key: KeySpec | None = None
    key_file: str = Field("", description="local keys: the key file on the node.")
    credentials: StorageCredentials | None = None

    def keyring(self, create: bool = False) -> Keyring | None:
        if self.key is None:
            return None
        if self.key.kind == "local":
            return LocalKeyring(self.tenant, Path(self.key_file), create=create)
        return KmsKeyring(self.tenant, self.key.key_id, self.key.region, self.key.endpoint, self.credentials.boto() if self.credentials else {})

    def apply(self) -> None:
        """In the workload: use the tenant's credentials (and nothing inherited) and register its key."""
        if self.credentials is not None:
            # Written, not read: boto and s3fs find credentials only in the environment, and every
            # storage call after this one must be the tenant's, never the platform's it inherited.
            for name in AWS_CREDENTIAL_VARS:
                os.environ.pop(name, None)
            os.environ["AWS_ACCESS_KEY_ID"] = self.credentials.access_key_id
            os.environ["AWS_SECRET_ACCESS_KEY"] = self.credentials.secret_access_key
            if self.credentials.session_token:
                os.environ["AWS_SESSION_TOKEN"] = self.credentials.session_token
            _forget_cached_filesystems()
        register(self.storage_root, self.keyring())


def _forget_cached_filesystems() -> None:
    """fsspec keeps one filesystem per set of options: one made before now holds other credentials."""
    import fsspec

    fsspec.AbstractFileSystem.clear_instance_cache()
    try:
        from s3fs import S3FileSystem

        S3FileSystem.clear_instance_cache()
    except ImportError:
        pass


# The keyrings this process holds, by the storage root they seal ------------------------------
_KEYRINGS: dict[str, Keyring] = {}


def register(root: str, keyring: Keyring | None) -> None:
    """Seal what is written under `root` with `keyring` (None: `root` holds plain data)."""
    root = root.rstrip("/") + "/"
    if keyring is None:
        _KEYRINGS.pop(root, None)
    else:
        _KEYRINGS[root] = keyring


def forget_all() -> None:
    """Hold no keyring any more (tests; a process that changes tenants)."""
    _KEYRINGS.clear()


PLAIN_AREAS = ("landing", "outbox")
"""Under a tenant's root, the areas its lab hands data in and takes plate lists from: plain by design."""


class NotSealedForTenant(PermissionError):
    """An object under a tenant's root that is not sealed for that tenant: never read as its data."""

    def __init__(self, uri: str, root: str, tenant: str, found: str) -> None:
        self.uri, self.root, self.tenant, self.found = uri, root, tenant, found
        super().__init__(
            f"{uri} lies in tenant `{tenant}`'s storage root {root.rstrip('/')}, where every object outside "
            f"{' and '.join(a + '/' for a in PLAIN_AREAS)} is sealed with `{tenant}`'s key, but it holds {found}. "
            "It is not read: it was not written by the platform for this tenant (copied in, replaced, or moved from "
            "another root). Remove it, or write it again through the platform."
        )


def _held_root(uri: str) -> tuple[str, Keyring] | None:
    """(root, keyring) of the longest registered root that holds `uri`."""
    best = ""
    for root in _KEYRINGS:
        if (uri + "/").startswith(root) and len(root) > len(best):
            best = root
    return (best, _KEYRINGS[best]) if best else None


def keyring_for(uri: str) -> Keyring | None:
    """The keyring that seals `uri`: the one registered for the longest root that holds it, unless
    `uri` lies in one of that root's plain areas (`PLAIN_AREAS`), where nothing is sealed."""
    held = _held_root(uri)
    if held is None or uri[len(held[0]):].split("/", 1)[0] in PLAIN_AREAS:
        return None
    return held[1]


def check_seal(uri: str, stored: bytes | memoryview) -> None:
    """Refuse (`NotSealedForTenant`) an object under a tenant's root that is plain or sealed for
    another tenant; anything under no tenant's root, or in its plain areas, passes as it is."""
    keyring = keyring_for(uri)
    if keyring is None:
        return
    if not is_sealed(stored):
        found = "plain bytes (no seal)"
    elif (sealed_for := read_header(stored).tenant) != keyring.tenant:
        found = f"an object sealed for tenant `{sealed_for}`"
    else:
        return
    root, _ = _held_root(uri)  # type: ignore[misc]
    raise NotSealedForTenant(uri, root, keyring.tenant, found)


def open_stored(uri: str, stored: bytes | memoryview, unsealer: Opener | None = None) -> bytes:
    """The bytes of the object stored at `uri`: checked (`check_seal`) and opened when sealed."""
    check_seal(uri, stored)
    return (unsealer or opener()).open(stored) if is_sealed(stored) else bytes(stored)


def resolve(tenant: str, key_id: str) -> Keyring:
    """The keyring of `tenant` held by this process that holds key `key_id` (for opening what it
    sealed), or the retired local key of that id; else another of the tenant's keyrings, which
    refuses the object naming both keys."""
    held = [k for k in _KEYRINGS.values() if k.tenant == tenant]
    for keyring in held:
        if keyring.names(key_id):
            return keyring
    for keyring in held:  # a local key rotated since: its retired key opens what it sealed
        if isinstance(keyring, LocalKeyring) and (retired := keyring.retired(key_id)) is not None:
            return retired
    if held:
        return held[0]
    raise KeyUnavailable(
        tenant, key_id, "this process holds no key of that tenant",
        "A workload holds only its own tenant's key: data of another tenant is not readable here, by design.",
    )


def opener() -> Opener:
    """An Opener that uses the keyrings this process holds."""
    return Opener(resolve)
