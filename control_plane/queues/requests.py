"""A step as admission sees it: its team, the GPUs it holds on a pool, its priority."""

from __future__ import annotations

from control_plane.catalog.pools import Pool
from control_plane.catalog.quotas import Quotas
from control_plane.catalog.step_spec import StepSpec
from control_plane.queues.admission import Request
from control_plane.tenancy.control import lane_of

UNASSIGNED = "(no team)"  # steps of a tenant no team names: they take GPUs, under no quota


def team_of(spec_tenant: str, quotas: Quotas) -> str:
    """The team a tenant's steps count against (`UNASSIGNED` when no team names it or its lane)."""
    return quotas.team_of(spec_tenant, lane_of(spec_tenant)) or UNASSIGNED


class NoTeam(ValueError):
    """A step whose tenant, and its lane, no team of the quotas file names."""


def team_and_class(spec: StepSpec, quotas: Quotas) -> tuple[str, str]:
    """The team `spec` counts against and its priority class (the default when it names none),
    for an engine that must name both (a Slurm account and QOS, a Kueue LocalQueue and class).
    Raises `NoTeam` for a tenant no team names, `QuotaCatalogError` for a class the file lacks."""
    team = team_of(spec.tenant, quotas)
    if team == UNASSIGNED:
        raise NoTeam(f"no team of {quotas.file or 'the quotas catalog'} names tenant `{spec.tenant}` or its lane `{lane_of(spec.tenant)}`")
    wanted = spec.priority_class or quotas.default_priority
    quotas.priority(wanted)  # a class the catalog lacks: named, with the classes it has
    return team, wanted


def held_gpus(spec: StepSpec, pool: Pool) -> int:
    """GPUs the step holds on `pool` while it runs, as placement counts them
    (`control_plane/placement/cost_model.py`): on a TPU pool whole slices, a gang whole nodes,
    a single process what it asks."""
    if pool.topology is not None and pool.topology.whole_domains and pool.domain_nodes:
        hosts = max(spec.nodes, -(-spec.gpus // max(pool.gpus_per_node, 1)))
        return -(-hosts // pool.domain_nodes) * (pool.domain_gpus or 0)
    return max(spec.nodes * pool.gpus_per_node, spec.gpus) if spec.gang else spec.gpus


def request_for(spec: StepSpec, pool: Pool, quotas: Quotas, *, id: str, arrived: float) -> Request:
    """The admission request of `spec` on `pool` (its priority class checked against the catalog)."""
    return Request(id=id, team=team_of(spec.tenant, quotas), gpus=held_gpus(spec, pool), priority=quotas.priority(spec.priority_class), arrived=arrived)
