"""The placement cost model, evaluated for many steps × many pools at once.

Every rule is a boolean matrix (steps × pools: True where the rule refuses the pool)
and every cost term a float matrix, so one step against a catalog (`plan_placement`)
and ten thousand steps against five hundred pools (`plan_job`) run the same code.
The words a person reads for a refusal are written from the same numbers, in
`placement.py`, only for the steps someone looks at.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from control_plane.catalog.pools import Catalog, EgressTable, Pool, Purchasing, TenantLimits
from control_plane.catalog.step_spec import StepSpec
from control_plane.catalog.tenants import Tenant, load_tenants
from control_plane.placement.accelerator_fit import Splits, code_fit, split_gangs, whole_domain_gpus

# The rules, in the order their refusals are listed. Each key names a constraint a person can
# relax; `plan_job` reports an infeasible step by the constraints no pool meets.
RULES = (
    "tenant", "tenant_limits", "capacity", "accelerator", "family", "porting", "nodes", "gpus", "gpus_per_node",
    "interconnect", "runtime", "spot_checkpoint", "spot_rework", "window", "deadline", "budget",
)


def young_daly_interval_hours(checkpoint_hours: float, mtbi_hours: float) -> float:
    """Optimal time between checkpoints, first-order Young (1974) / Daly (2006): √(2·δ·M).

    δ is the time to write one checkpoint and M the mean time between interruptions.
    Daly's bound: once δ ≥ 2M the formula no longer holds and the interval is M itself.
    """
    if math.isinf(mtbi_hours):
        return math.inf
    if checkpoint_hours >= 2.0 * mtbi_hours:
        return mtbi_hours
    return math.sqrt(2.0 * checkpoint_hours * mtbi_hours)


def expected_waste(checkpoint_hours: float, mtbi_hours: float, interval_hours: float) -> float:
    """Share of the run spent writing checkpoints (δ/τ) or redoing lost work (τ/2M).

    At τ = √(2δM) both terms equal √(δ/2M), so the waste is √(2δ/M).
    """
    if math.isinf(mtbi_hours):
        return 0.0
    return checkpoint_hours / interval_hours + interval_hours / (2.0 * mtbi_hours)


@dataclass
class PlanContext:
    """What placement needs beyond steps and pools: egress prices, tenant limits, the clock,
    and how much of each commitment is left (GPU-hours; pools without one are absent).

    `tenant_limits` are the pool catalog's `tenants:` (by tenant or lane name); `tenants` is the
    tenants catalog (docs/tenancy.md): each tenant's lane, its own providers and regions, and its
    agreement's regions. All of them bind.
    """

    epoch: dt.datetime
    egress: EgressTable = field(default_factory=EgressTable)
    tenant_limits: dict[str, TenantLimits] = field(default_factory=dict)
    committed_left: dict[str, float] | None = None
    tenants: dict[str, Tenant] = field(default_factory=dict)

    def hours(self, moment: dt.datetime | None) -> float:
        return 0.0 if moment is None else (moment - self.epoch).total_seconds() / 3600.0

    def lane_of(self, tenant: str) -> str | None:
        entry = self.tenants.get(tenant)
        return entry.lane if entry is not None else None


def plan_context(epoch: dt.datetime, catalog: Catalog | None = None) -> PlanContext:
    """The context of a plan: the pool catalog's egress prices and tenant limits, and the tenants catalog."""
    if catalog is None:
        return PlanContext(epoch=epoch, tenants=dict(load_tenants()))
    return PlanContext(epoch=epoch, egress=catalog.egress, tenant_limits=catalog.tenants, tenants=dict(load_tenants()))


@dataclass(frozen=True)
class Limit:
    """One limit on where a step may run, and whose it is (for the evidence).

    `kind`: `catalog` (the pool catalog's `tenants:` entry `whose`, a tenant or its lane),
    `tenant` (the tenant's own providers and regions in the tenants catalog), `agreement`
    (its agreement's regions in the tenants catalog), `step` (the step's own: its job's
    `limits:`, or its input data's agreements, `limits.reason`).
    """

    kind: str
    whose: str
    limits: TenantLimits

    def allows(self, pool: Pool) -> bool:
        return _limits_allow(self.limits, pool)


def limits_of(context: PlanContext, step: StepSpec) -> list[Limit]:
    """Every limit that binds `step`: a pool must meet all of them."""
    found = []
    for name in dict.fromkeys(n for n in (step.tenant, context.lane_of(step.tenant)) if n):
        if (catalog_limits := context.tenant_limits.get(name)) is not None:
            found.append(Limit("catalog", name, catalog_limits))
    entry = context.tenants.get(step.tenant)
    if entry is not None:
        if entry.providers is not None or entry.regions is not None:
            found.append(Limit("tenant", entry.name, TenantLimits(providers=entry.providers, regions=entry.regions)))
        if entry.agreement.regions is not None:
            found.append(Limit("agreement", entry.name, TenantLimits(regions=entry.agreement.regions)))
    if step.limits is not None:
        found.append(Limit("step", step.tenant, step.limits))
    return found


def tenant_allowed(context: PlanContext, tenant: str, pool: Pool) -> bool:
    """A pool that lists tenants takes a step whose tenant, or whose tenant's lane, it lists."""
    return pool.tenants is None or tenant in pool.tenants or context.lane_of(tenant) in pool.tenants


@dataclass
class Assessment:
    """Every step against every pool: refusals by rule, cost terms, times (hours from `epoch`).

    The terms a plan is chosen by are dense steps × pools matrices; the ones only a person reads
    (the checkpoint interval, the commitment's share, the spares' part of the bill) are worked out
    from them when first asked for, so a plan of 10,000 steps over 500 pools stays small in memory.
    """

    steps: list[StepSpec]
    pools: list[Pool]
    context: PlanContext
    refused: dict[str, np.ndarray]  # rule -> bool[S, P]
    feasible: np.ndarray  # bool[S, P]
    rework: np.ndarray  # share of the run redone or spent checkpointing
    held_gpus: np.ndarray  # GPUs the step holds on the pool: whole nodes for a gang, else what it asks
    gpu_hours: np.ndarray  # billed GPU-hours: data transfer, rework and a gang's standby spares included
    spare_gpu_hours: np.ndarray  # of those, the pool's standby spares held while a gang runs
    cost_usd: np.ndarray  # expected cost: compute (with the whole commitment left) + egress
    egress_usd: np.ndarray
    moved_gb: np.ndarray
    transfer_hours: np.ndarray
    start_hours: np.ndarray  # [S]
    end_hours: np.ndarray  # [S, P]: start + transfer + run with rework
    deadline_hours: np.ndarray  # [S]; inf: none
    locations: list[tuple[str, str]]  # (provider, region) of the datasets
    gb_by_location: np.ndarray  # [S, L]
    egress_price: np.ndarray  # [L, P] $/GB
    committed: np.ndarray  # [P]: GPU-hours of each commitment this assessment counts as left (0: none)
    delta_hours: np.ndarray  # [S]: time to write one checkpoint
    # Hours of run per hour of the step's `expected_hours`: 1 / its throughput on the pool's accelerator,
    # times the slowdown of a gang split across fast domains (broadcast [S or 1, P or 1]).
    pace: np.ndarray = field(default_factory=lambda: np.ones((1, 1)))
    throughput: np.ndarray = field(default_factory=lambda: np.ones((1, 1)))
    splits: Splits | None = None  # the gangs split across fast domains, by (step, pool)

    @cached_property
    def mtbi_hours(self) -> np.ndarray:
        """Mean time between interruptions for the step's node count on the pool (inf: none)."""
        rate = np.array([p.interruption_rate_per_hour for p in self.pools], dtype=float)[None, :]
        nodes = np.array([s.nodes for s in self.steps], dtype=float)[:, None]
        with np.errstate(divide="ignore"):
            return np.where(rate > 0, 1.0 / (rate * nodes), math.inf) * np.ones((len(self.steps), 1))

    @cached_property
    def interval_hours(self) -> np.ndarray:
        """Young/Daly checkpoint interval; inf where nothing interrupts."""
        mtbi, delta = self.mtbi_hours, self.delta_hours[:, None]
        with np.errstate(invalid="ignore"):
            return np.where(delta >= 2 * mtbi, mtbi, np.sqrt(2.0 * delta * mtbi))

    @cached_property
    def covered_gpu_hours(self) -> np.ndarray:
        """Of the billed GPU-hours, those inside a commitment already paid for."""
        return np.minimum(self.gpu_hours, self.committed[None, :])

    @cached_property
    def compute_usd(self) -> np.ndarray:
        return self.cost_usd - self.egress_usd

    @cached_property
    def spare_usd(self) -> np.ndarray:
        """The spares' part of compute_usd."""
        return spare_share(self.compute_usd, self.spare_gpu_hours, self.gpu_hours)


def spare_share(compute_usd: np.ndarray, spare_gpu_hours: np.ndarray, gpu_hours: np.ndarray) -> np.ndarray:
    """What standby spares cost of a compute bill: their share of its GPU-hours (pro rata, as they
    share the commitment with the working nodes)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(spare_gpu_hours > 0, compute_usd * spare_gpu_hours / np.where(gpu_hours > 0, gpu_hours, 1.0), 0.0)


def _mask_by_key(keys: list, pools: list[Pool], test) -> np.ndarray:
    """bool[S, P] from a per-(key, pool) test, computed once per distinct key."""
    cache: dict = {}
    rows = []
    for key in keys:
        if key not in cache:
            cache[key] = np.array([test(key, p) for p in pools], dtype=bool)
        rows.append(cache[key])
    return np.vstack(rows) if rows else np.zeros((0, len(pools)), dtype=bool)


def _col(pools: list[Pool], attr, dtype=float) -> np.ndarray:
    return np.array([attr(p) for p in pools], dtype=dtype)[None, :]


def _row(steps: list[StepSpec], attr, dtype=float) -> np.ndarray:
    return np.array([attr(s) for s in steps], dtype=dtype)[:, None]


def _limits_allow(limit: TenantLimits | None, pool: Pool) -> bool:
    if limit is None:
        return True
    return (limit.providers is None or pool.provider in limit.providers) and (limit.regions is None or pool.region in limit.regions)


def _limits_key(s: StepSpec) -> tuple:
    lim = s.limits
    return (s.tenant, None if lim is None else (tuple(lim.providers or ()) if lim.providers is not None else None,
                                                 tuple(lim.regions or ()) if lim.regions is not None else None))


def assess(steps: list[StepSpec], pools: list[Pool], context: PlanContext) -> Assessment:
    """Evaluate every rule and cost term for every (step, pool) pair."""
    S, P = len(steps), len(pools)
    gpus = _row(steps, lambda s: max(s.gpus, 1))
    raw_gpus = _row(steps, lambda s: s.gpus)
    nodes = _row(steps, lambda s: s.nodes)
    hours = _row(steps, lambda s: s.expected_hours)
    delta_h = _row(steps, lambda s: s.checkpoint_seconds / 3600.0)
    budget = _row(steps, lambda s: s.budget_usd if s.budget_usd is not None else math.inf)
    start = np.array([context.hours(s.start or context.epoch) for s in steps], dtype=float)
    deadline = np.array(
        [context.hours(d) if (d := s.deadline_at(s.start or context.epoch)) else math.inf for s in steps], dtype=float
    )

    price = _col(pools, lambda p: p.price_per_gpu_hour)
    marginal = _col(pools, lambda p: p.marginal_price_per_gpu_hour)
    left = context.committed_left or {}
    committed = _col(pools, lambda p: left.get(p.name, p.committed_gpu_hours or 0.0) if p.committed_gpu_hours is not None else 0.0)
    rate = _col(pools, lambda p: p.interruption_rate_per_hour)
    is_spot = _col(pools, lambda p: p.purchasing is Purchasing.spot, bool)
    total_gpus = _col(pools, lambda p: p.total_gpus)
    gpn = _col(pools, lambda p: p.gpus_per_node)

    refused: dict[str, np.ndarray] = {}
    refused["tenant"] = _mask_by_key([s.tenant for s in steps], pools, lambda t, p: not tenant_allowed(context, t, p))
    # The tenant's limits (pool catalog `tenants:`, tenants catalog, its agreement) and the step's own
    # (its job's `limits:` or its data's agreements) all bind.
    refused["tenant_limits"] = _limits_mask(steps, pools, context)
    refused["capacity"] = _mask_by_key([s.capacity for s in steps], pools, lambda c, p: not p.capacity.runs(c))
    refused["accelerator"] = _mask_by_key(
        [tuple(s.accelerators or ()) for s in steps], pools, lambda a, p: bool(a) and p.accelerator not in a
    )
    # What the step's code runs on (its `runs_on`), whether it needs porting there, and how fast it runs.
    refused["family"], refused["porting"], throughput = code_fit(steps, pools)
    # A gang (docs/gangs.md) takes whole nodes: it holds, and pays for, every GPU of each node it runs on.
    gang = _row(steps, lambda s: s.gang, bool)
    gangs = np.flatnonzero(gang[:, 0])
    # Only a gang's rows differ from what the step asks: the rest stay one column broadcast.
    held = np.broadcast_to(gpus, (S, P))
    wants = np.broadcast_to(raw_gpus, (S, P))
    if gangs.size:
        held, wants = np.array(held), np.array(wants)
        whole = nodes[gangs] * gpn
        held[gangs] = np.maximum(whole, gpus[gangs])
        wants[gangs] = np.maximum(whole, raw_gpus[gangs])
    # A TPU slice is provisioned and billed whole: every step there holds whole slices.
    whole_cols, slices = whole_domain_gpus(steps, pools)
    if whole_cols.size:
        held, wants = np.array(held), np.array(wants)
        held[:, whole_cols] = slices
        wants[:, whole_cols] = slices
    # Standby spares are never offered for fitting; they wait to replace a gang's failed node.
    refused["nodes"] = np.broadcast_to(nodes > _col(pools, lambda p: p.offered_nodes), (S, P))
    refused["gpus"] = wants > total_gpus
    del wants
    refused["gpus_per_node"] = ~refused["gpus"] & (np.ceil(raw_gpus / nodes) > gpn)
    # Tightly coupled: every node inside one fast interconnect domain (none declared: no domain).
    # A gang that may span domains (`span_domains`) is split over as few as hold it, on a pool that has
    # domains; its step time grows by the all-reduce model's slowdown (`links.py`).
    coupled = _row(steps, lambda s: s.tightly_coupled, bool)
    beyond = coupled & (
        (_col(pools, lambda p: p.domain_gpus or 0) < gpus) | (_col(pools, lambda p: p.domain_nodes or 0) < nodes)
    )
    may_split = _row(steps, lambda s: s.span_domains, bool) & _col(pools, lambda p: p.domain_nodes is not None, bool)
    refused["interconnect"] = beyond & ~may_split
    splits = split_gangs(steps, pools, beyond & may_split, throughput)
    pace = 1.0 / throughput
    if splits:
        pace = np.array(np.broadcast_to(pace, (S, P)))
        pace[splits.pairs[:, 0], splits.pairs[:, 1]] *= splits.slowdown
    refused["runtime"] = _mask_by_key([s.runtime for s in steps], pools, lambda r, p: r not in p.runtimes)
    # A step that cannot checkpoint loses its whole run to an interruption: never on spot, nor on any
    # pool that declares interruptions.
    refused["spot_checkpoint"] = (is_spot | (rate > 0)) & ~_row(steps, lambda s: s.checkpoints, bool)

    # Young/Daly: M for n nodes is 1/(n·λ); the interval and the waste follow from δ and M. Where the
    # pool does not interrupt, nothing is lost (only the columns that do are worked out).
    rework = np.zeros((S, P))
    cols = np.flatnonzero(rate[0] > 0)
    if cols.size:
        mtbi = 1.0 / (rate[:, cols] * nodes)
        interval = np.where(delta_h >= 2 * mtbi, mtbi, np.sqrt(2.0 * delta_h * mtbi))
        with np.errstate(divide="ignore", invalid="ignore"):
            part = np.nan_to_num(delta_h / interval + interval / (2.0 * mtbi), nan=0.0)
        rework[:, cols] = part
    refused["spot_rework"] = rework >= 1.0

    # Data gravity: GB per (step, dataset location) times $/GB per (location, pool).
    locations = sorted({(d.provider, d.region) for s in steps for d in s.datasets})
    index = {loc: i for i, loc in enumerate(locations)}
    gb = np.zeros((S, len(locations)))
    for i, s in enumerate(steps):
        for d in s.datasets:
            gb[i, index[(d.provider, d.region)]] += d.size_gb
    egress_price = np.array(
        [[context.egress.price_per_gb(lp, lr, p.provider, p.region) for p in pools] for lp, lr in locations]
    ).reshape(len(locations), P)
    moved = np.array([[(lp, lr) != (p.provider, p.region) for p in pools] for lp, lr in locations], dtype=float).reshape(len(locations), P)
    hours_per_gb = np.array([8.0 / context.egress.rates(lp).gbps / 3600.0 for lp, _ in locations])
    egress_usd = gb @ egress_price
    moved_gb = gb @ moved
    transfer = (gb * hours_per_gb[None, :]) @ moved

    # The step holds its GPUs from its start: while its data moves in, then for the run and its
    # rework. All of it is billed. A gang keeps the pool's spares standing by as long as it holds its
    # nodes; they draw on a commitment like its working nodes. A single process does not pay for them.
    held_hours = hours * pace * (1.0 + rework)
    held_hours += transfer
    end = held_hours + start[:, None]
    spares = _col(pools, lambda p: p.spare_nodes * p.gpus_per_node)
    gpu_hours = held * held_hours
    spare_gpu_hours = np.broadcast_to(np.zeros((1, 1)), (S, P))
    if gangs.size and spares.any():
        spare_gpu_hours = np.zeros((S, P))
        spare_gpu_hours[gangs] = spares * held_hours[gangs]
        gpu_hours += spare_gpu_hours
    del held_hours
    # cost = price·(h − c) + marginal·c + egress, c = min(h, commitment left)
    cost = price * gpu_hours
    committed_cols = np.flatnonzero(committed[0] > 0)
    if committed_cols.size:
        c = np.minimum(gpu_hours[:, committed_cols], committed[:, committed_cols])
        cost[:, committed_cols] -= (price - marginal)[:, committed_cols] * c
    cost += egress_usd

    w_start = _col(pools, lambda p: context.hours(p.window_start) if p.window_start else -math.inf)
    w_end = _col(pools, lambda p: context.hours(p.window_end) if p.window_end else math.inf)
    refused["window"] = (start[:, None] < w_start) | (end > w_end)
    refused["deadline"] = end > deadline[:, None]
    refused["budget"] = cost > budget

    feasible = np.ones((S, P), dtype=bool)
    for rule in RULES:  # in place: no steps × pools × rules array
        feasible &= ~refused[rule]
    return Assessment(
        steps=steps, pools=pools, context=context, refused=refused, feasible=feasible, rework=rework,
        held_gpus=held, gpu_hours=gpu_hours, spare_gpu_hours=spare_gpu_hours, cost_usd=cost,
        egress_usd=egress_usd, moved_gb=moved_gb, transfer_hours=transfer,
        start_hours=start, end_hours=end, deadline_hours=deadline, locations=locations,
        gb_by_location=gb, egress_price=egress_price, committed=committed[0], delta_hours=delta_h[:, 0],
        pace=pace, throughput=throughput, splits=splits,
    )


def _limits_mask(steps: list[StepSpec], pools: list[Pool], context: PlanContext) -> np.ndarray:
    """bool[S, P]: True where any limit of the step (`limits_of`) refuses the pool."""
    by_key: dict[tuple, list[Limit]] = {}
    for s in steps:
        key = _limits_key(s)
        if key not in by_key:
            by_key[key] = limits_of(context, s)
    return _mask_by_key([_limits_key(s) for s in steps], pools, lambda k, p: not all(lim.allows(p) for lim in by_key[k]))
