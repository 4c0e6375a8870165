"""What each pool's queue holds now: the GPU jobs in flight (`state/inflight/`, which every backend
writes when it submits and clears when it collects), by team, as `PoolQueue`s admission decides on.

A record names its step's tenant; the quotas catalog says whose team that is. A job of no team
(a tenant no team names) still takes GPUs: it counts under `UNASSIGNED`, which has no quota.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from control_plane.catalog.pools import Pool
from control_plane.catalog.quotas import Quotas
from control_plane.queues.admission import PoolQueue, Request
from control_plane.queues.requests import UNASSIGNED, team_of


def queues_now(records: Iterable[Mapping[str, Any]], pools: Mapping[str, Pool], quotas: Quotas) -> dict[str, PoolQueue]:
    """One queue per pool of the catalog, holding the in-flight jobs of `records` that run there."""
    queues = {name: PoolQueue(name, pool.gpus_per_node * pool.nodes, quotas) for name, pool in pools.items()}
    teams: dict[str, str] = {}  # tenant -> team: the tenants catalog is read once per tenant, not per job
    for record in records:
        handle, owner = record["handle"], record.get("owner", {})
        queue = queues.get(handle["pool"])
        if queue is None:  # a pool that left the catalog: nothing to admit against
            continue
        tenant = owner.get("tenant") or ""
        if tenant not in teams:
            teams[tenant] = team_of(tenant, quotas) if tenant else UNASSIGNED
        team = teams[tenant]
        gpus = int(owner.get("gpus", 1))
        if owner.get("gang"):  # whole nodes, as placement counts them
            gpus = max(gpus, int(owner.get("nodes", 1)) * pools[handle["pool"]].gpus_per_node)
        queue.add(Request(
            id=f"{handle['backend']}:{handle['job_id']}", team=team, gpus=gpus,
            priority=_priority(quotas, owner.get("priority_class")), arrived=float(handle.get("submitted_at", 0.0)),
        ))  # fmt: skip
    return queues


def _priority(quotas: Quotas, name: str | None) -> int:
    """A running job's priority: its class's value, the default's for a class the catalog no longer has."""
    return quotas.priority_classes.get(name or quotas.default_priority, quotas.priority(None))
