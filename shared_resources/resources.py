"""Typed Dagster resources shared by both lanes: `storage`, `compute` and `models` (the model gateway)."""

from __future__ import annotations

import dagster as dg

from shared_resources.compute import ComputeResource
from workload_runtime.storage import Storage
from control_plane.tenancy.control import tenant_storage
from control_plane.settings import settings


class StorageResource(dg.ConfigurableResource):
    """The storage root every asset reads and writes under (a folder or an `s3://` URI)."""

    root: str

    def get(self) -> Storage:
        return Storage.at(self.root)

    def for_tenant(self, tenant: str) -> Storage:
        """A tenant's own storage root (tenants catalog), its key registered in this process so
        that its weights and data are sealed on write and opened on read."""
        return tenant_storage(self.root, tenant)


class ModelGatewayResource(dg.ConfigurableResource):
    """The model gateway: tasks for frontier models (labelling, research assistance) routed to the
    cheapest model that meets each task's quality bar, within the data's agreements and the
    budgets, booked in the same ledger as GPU work (docs/model-gateway.md).

    `models_file` picks the model catalog (default: `SINEWGRID_MODELS`, else the packaged one,
    whose providers are stand-ins started on loopback)."""

    storage_root: str
    models_file: str = ""

    def run_task(
        self,
        context: dg.AssetExecutionContext,
        task_folder: str,
        items: list[tuple[str, dict]],
        *,
        inputs: list[str],
        lane: str,
        tenant: str = "",
        project: str = "",
        storage_root: str | None = None,
        deadline_minutes: float | None = None,
    ):
        """Answer `items` (id, payload) with the task in `task_folder`; `inputs` are the lineage ids
        of the data they come from, under `storage_root` (a tenant's root; default the platform's):
        the gateway reads their agreements. Returns the `TaskRun`."""
        from control_plane.catalog.models import load_models
        from model_gateway.gateway import Gateway
        from model_gateway.tasks import Task
        from model_gateway.usage import Who

        who = Who(
            run_id=context.run.run_id,
            asset=context.asset_key.to_user_string(),
            partition=context.partition_key if context.has_partition_key else None,
            lane=lane,
            project=project or lane,
            tenant=tenant,
        )
        from control_plane.accounting.budgets import BudgetExceeded
        from control_plane.catalog.models import ModelCatalogError
        from model_gateway.policy import DataPolicyRefused
        from model_gateway.routing import NoModelMeetsBar
        from model_gateway.tasks import TaskError

        try:
            catalog = load_models(self.models_file or None)
            gateway = Gateway(Storage.at(self.storage_root), catalog)  # the platform's ledger, evaluations and logs
            data = Storage.at(storage_root) if storage_root else None  # where the inputs' lineage is (a tenant's root)
            return gateway.run(Task(task_folder), items, inputs=inputs, who=who, data=data, deadline_minutes=deadline_minutes)
        except (BudgetExceeded, DataPolicyRefused, NoModelMeetsBar, TaskError, ModelCatalogError) as exc:
            # Refused on purpose, with the reason and the way on: retrying would be refused the same way.
            raise dg.Failure(description=str(exc), metadata={"refused_by": type(exc).__name__}, allow_retries=False) from None


def platform_resources(root: str | None = None, pools_file: str | None = None) -> dict[str, dg.ConfigurableResource]:
    """The `storage`, `compute` and `models` resources for this environment.

    `SINEWGRID_HOME` picks the storage root (default `.sinewgrid/` in the checkout) and
    `SINEWGRID_POOLS` the pool catalog (default: the packaged one, all pools local).
    """
    env = settings()
    root = root or env.storage_root
    pools_file = pools_file if pools_file is not None else env.pools
    return {
        "storage": StorageResource(root=root),
        "compute": ComputeResource(storage_root=root, pools_file=pools_file),
        "models": ModelGatewayResource(storage_root=root, models_file=env.models),
    }
