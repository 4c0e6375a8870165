"""Typed Dagster resources shared by both lanes: `storage` and `compute`."""

from __future__ import annotations

import dagster as dg

from shared_resources.compute.resource import ComputeResource
from shared_resources.runtime.storage import Storage
from shared_resources.tenancy.control import tenant_storage
from shared_resources.settings import settings


class StorageResource(dg.ConfigurableResource):
    """The storage root every asset reads and writes under (a folder or an `s3://` URI)."""

    root: str

    def get(self) -> Storage:
        return Storage.at(self.root)

    def for_tenant(self, tenant: str) -> Storage:
        """A tenant's own storage root (tenants catalog), its key registered in this process so
        that its weights and data are sealed on write and opened on read."""
        return tenant_storage(self.root, tenant)


def platform_resources(root: str | None = None, pools_file: str | None = None) -> dict[str, dg.ConfigurableResource]:
    """The `storage` and `compute` resources for this environment.

    `SINEWGRID_HOME` picks the storage root (default `.sinewgrid/` in the checkout) and
    `SINEWGRID_POOLS` the pool catalog (default: the packaged one, all pools local).
    """
    env = settings()
    root = root or env.storage_root
    pools_file = pools_file if pools_file is not None else env.pools
    return {
        "storage": StorageResource(root=root),
        "compute": ComputeResource(storage_root=root, pools_file=pools_file),
    }
