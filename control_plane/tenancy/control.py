"""The control plane's side of tenancy: a tenant's storage, with its key held in this process."""

from __future__ import annotations

from pathlib import Path

from control_plane.catalog.tenants import Tenant, Tenants, check_storage, keys_dir, load_tenants
from control_plane.settings import tenant_credentials
from workload_runtime.keys import KeyUnavailable
from workload_runtime.storage import Storage
from workload_runtime.tenant_access import StorageCredentials, TenantAccess, register


def access_for(tenant: Tenant, platform_root: str) -> TenantAccess:
    """The control plane's view of a tenant: credentials read from its `<env>_AWS_*` variables."""
    credentials = None
    if tenant.credentials is not None:
        prefix = tenant.credentials.env
        found = tenant_credentials(prefix)
        if not found.get("access_key_id") or not found.get("secret_access_key"):
            raise KeyUnavailable(
                tenant.name, "(storage credentials)", f"{prefix}_AWS_ACCESS_KEY_ID and {prefix}_AWS_SECRET_ACCESS_KEY are not set in the control plane's environment",
                "Set them from the tenant's secret (deploy/tenancy/README.md), or remove `credentials:` on a local root.",
            )
        credentials = StorageCredentials(**found)
    key_file = str(tenant.key_file()) if tenant.key is not None and tenant.key.kind == "local" else ""
    return TenantAccess(tenant=tenant.name, storage_root=tenant.root(platform_root), key=tenant.key, key_file=key_file, credentials=credentials)


def checked_tenants(platform_root: str) -> Tenants:
    """The tenants catalog, its storage checked on this platform root (`tenants.storage_problems`):
    refused, with every problem named, before any tenant's data is touched through it."""
    tenants = load_tenants()
    key = (id(tenants), Storage.at(platform_root).root, str(keys_dir()))
    if _CHECKED.get(key) is not tenants:
        check_storage(tenants, Storage.at(platform_root).root)
        _CHECKED.clear()
        _CHECKED[key] = tenants
    return tenants


_CHECKED: dict[tuple, Tenants] = {}


def tenant_access(platform_root: str, tenant: str | Tenant) -> TenantAccess:
    """The access a tenant's workloads are handed (its root, credentials and key)."""
    tenants = checked_tenants(platform_root)
    entry = tenant if isinstance(tenant, Tenant) else tenants.get_tenant(tenant)
    return access_for(entry, Storage.at(platform_root).root)


def tenant_access_of(platform_root: str, tenant: str) -> TenantAccess | None:
    """The access of a step's tenant, or None when the tenant is not in the catalog (the platform's own steps)."""
    tenants = load_tenants()
    if tenant not in tenants:
        return None
    access = tenant_access(platform_root, tenants[tenant])
    register(access.storage_root, access.keyring(create=True))  # this process reads its manifests and results
    return access


def lane_of(tenant: str) -> str:
    """The lane a tenant's steps belong to (the tenant's own name when it is not in the catalog)."""
    tenants = load_tenants()
    return tenants[tenant].lane if tenant in tenants else tenant


def tenant_storage(platform_root: str, tenant: str | Tenant) -> Storage:
    """The tenant's own root, its keyring registered here (a local key is made on first use)."""
    access = tenant_access(platform_root, tenant)
    register(access.storage_root, access.keyring(create=True))
    return Storage.at(access.storage_root)


def local_storage_roots(platform_root: str) -> dict[str, Path]:
    """Every storage root on this machine's file system, resolved (symlinks followed), by whose it is:
    the platform's and each tenant's in the catalog (a root on an object store is not here)."""
    roots = {"the platform": Storage.at(platform_root).root}
    roots.update({f"tenant `{name}`": tenant.root(Storage.at(platform_root).root) for name, tenant in checked_tenants(platform_root).items()})
    return {whose: Path(root.removeprefix("file://")).expanduser().resolve() for whose, root in roots.items() if Storage.at(root).is_local}


def storage_root_holding(path: Path, platform_root: str) -> tuple[str, Path] | None:
    """(whose, root) of the storage root `path` lies in (or is), after resolving both; None if none."""
    resolved = path.expanduser().resolve()
    for whose, root in local_storage_roots(platform_root).items():
        if resolved == root or root in resolved.parents:
            return whose, root
    return None


def tenants_of_root(platform_root: str, root: str) -> list[str]:
    """The tenants whose storage root `root` is, or lies in (none for the platform's own places)."""
    platform = Storage.at(platform_root).root
    inside = root.rstrip("/") + "/"
    return [name for name, tenant in load_tenants().items() if inside.startswith(tenant.root(platform).rstrip("/") + "/")]
