"""What one tenant's work may touch: its storage root, its storage credentials, its key.

The control plane builds a `TenantAccess` from the tenants catalog (`access_for`) and hands it to
each attempt of a tenant's step in the workload inputs: the typed seam, never an environment
the workload inherits. The workload applies it (`apply`) before it touches storage: its
S3 credentials replace whatever the process inherited, and its keyring is registered for its
storage root, so `storage.write_bytes_atomic(..., seal=True)` seals there and `read_bytes`
opens what it sealed. A process holds only the keyrings registered in it: a workload only its
own tenant's; the control plane every tenant's (in production it runs in the customer's account).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from shared_resources.catalog.tenants import KeySpec, Tenant
from shared_resources.tenancy.envelope import Opener
from shared_resources.tenancy.keys import Keyring, KeyUnavailable, KmsKeyring, LocalKeyring

AWS_CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")


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
            for name in AWS_CREDENTIAL_VARS:
                os.environ.pop(name, None)
            os.environ["AWS_ACCESS_KEY_ID"] = self.credentials.access_key_id
            os.environ["AWS_SECRET_ACCESS_KEY"] = self.credentials.secret_access_key
            if self.credentials.session_token:
                os.environ["AWS_SESSION_TOKEN"] = self.credentials.session_token
            _forget_cached_filesystems()
        register(self.storage_root, self.keyring())


def access_for(tenant: Tenant, platform_root: str) -> TenantAccess:
    """The control plane's view of a tenant: credentials read from `<env>_AWS_*` variables."""
    credentials = None
    if tenant.credentials is not None:
        prefix = tenant.credentials.env
        key_id, secret = os.environ.get(f"{prefix}_AWS_ACCESS_KEY_ID", ""), os.environ.get(f"{prefix}_AWS_SECRET_ACCESS_KEY", "")
        if not key_id or not secret:
            raise KeyUnavailable(
                tenant.name, "(storage credentials)", f"{prefix}_AWS_ACCESS_KEY_ID and {prefix}_AWS_SECRET_ACCESS_KEY are not set in the control plane's environment",
                "Set them from the tenant's secret (deploy/tenancy/README.md), or remove `credentials:` on a local root.",
            )
        credentials = StorageCredentials(access_key_id=key_id, secret_access_key=secret, session_token=os.environ.get(f"{prefix}_AWS_SESSION_TOKEN", ""))
    key_file = str(tenant.key_file()) if tenant.key is not None and tenant.key.kind == "local" else ""
    return TenantAccess(tenant=tenant.name, storage_root=tenant.root(platform_root), key=tenant.key, key_file=key_file, credentials=credentials)


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


def keyring_for(uri: str) -> Keyring | None:
    """The keyring that seals `uri`: the one registered for the longest root that holds it."""
    best = ""
    for root in _KEYRINGS:
        if (uri + "/").startswith(root) and len(root) > len(best):
            best = root
    return _KEYRINGS.get(best) if best else None


def resolve(tenant: str, key_id: str) -> Keyring:
    """The keyring of `tenant` held by this process (for opening what it sealed)."""
    for keyring in _KEYRINGS.values():
        if keyring.tenant == tenant:
            return keyring
    raise KeyUnavailable(
        tenant, key_id, "this process holds no key of that tenant",
        "A workload holds only its own tenant's key: data of another tenant is not readable here, by design.",
    )


def opener() -> Opener:
    """An Opener that uses the keyrings this process holds."""
    return Opener(resolve)
