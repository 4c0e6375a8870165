"""The pool catalog: typed pools read from YAML, with errors that name file, pool and field.

A catalog file holds `pools:` and, optionally, catalog-wide sections: `prices:` (where
the prices came from and when), `egress:` (what moving a gigabyte out of a provider or
region costs) and `tenants:` (which providers and regions each tenant may use).
`load_pools` returns the pools; `load_catalog` returns all of it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from control_plane.catalog.accelerators import ACCELERATORS, check_accelerator
from control_plane.catalog.backends import BACKENDS, backend_kind
from control_plane.catalog.egress import EgressTable
from control_plane.catalog.topology import Topology, domain_problems
from control_plane.catalog.yaml_files import read_yaml_mapping, validation_problems

DEFAULT_CATALOG = Path(__file__).with_name("pools.yaml")
CATALOG_HOLDS = (
    "A pool catalog is a YAML mapping with a `pools:` section (pool name -> settings), optionally `prices:`, "
    "`egress:` and `tenants:`; point SINEWGRID_POOLS or --pools at one (see docs/placement.md)."
)


class Purchasing(StrEnum):
    reserved = "reserved"
    block = "block"
    on_demand = "on_demand"
    spot = "spot"


class Capacity(StrEnum):
    """What kind of capacity a step asks for: steady (long runs), burst (short, elastic),
    evaluation (kept apart so evaluation never queues behind training), or any (no particular kind)."""

    steady = "steady"
    burst = "burst"
    evaluation = "evaluation"
    any = "any"


class PoolCapacity(StrEnum):
    """What kind of capacity a pool offers. One kind (steady, burst, evaluation) runs the steps that
    ask for it; `every` runs steps of every kind; `unspecified` (the default) promises no kind and
    runs only steps that ask for none (`capacity: any` on the step). Steps asking for no kind may
    land on any pool."""

    steady = "steady"
    burst = "burst"
    evaluation = "evaluation"
    every = "every"
    unspecified = "unspecified"

    def runs(self, asked: Capacity) -> bool:
        """Whether a step asking for `asked` may land here."""
        return asked is Capacity.any or self is PoolCapacity.every or self.value == asked.value


AMBIGUOUS_POOL_CAPACITY = (
    "`capacity: any` is ambiguous on a pool: write `capacity: every` for a pool that runs steps of every kind "
    "(steady, burst and evaluation), or `capacity: unspecified` (the default) for one that runs only steps asking "
    "for no particular kind, which is what `any` meant on a pool before"
)


class Pool(BaseModel):
    """What one provider sells: where, through which backend, how bought, at what price."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    provider: str
    region: str
    backend: str = Field(description=f"Which backend runs the pool's steps: {', '.join(BACKENDS)}.")
    backend_settings: dict[str, object] = Field(default_factory=dict)
    purchasing: Purchasing
    capacity: PoolCapacity = PoolCapacity.unspecified
    accelerator: str
    gpus_per_node: Annotated[int, Field(ge=0)]
    nodes: Annotated[int, Field(ge=1)] = 1
    quota_gpus: Annotated[int, Field(ge=0)] | None = None
    price_per_gpu_hour: Annotated[float, Field(ge=0)]
    # Where the price came from and when (a price list URL, a contract, "illustrative").
    # Empty: the catalog's `prices:` section says it for every pool.
    price_source: str = ""
    price_as_of: dt.date | None = None
    # Reserved or block capacity already paid for: GPU-hours of the commitment this plan may still
    # use, each at `marginal_price_per_gpu_hour` (power, support: what the commitment does not
    # cover). Hours beyond it cost `price_per_gpu_hour`. None: every hour at `price_per_gpu_hour`.
    committed_gpu_hours: Annotated[float, Field(ge=0)] | None = None
    marginal_price_per_gpu_hour: Annotated[float, Field(ge=0)] = 0.0
    # A short-term block is usable only inside its window (UTC).
    window_start: dt.datetime | None = None
    window_end: dt.datetime | None = None
    # Expected interruptions per node-hour (spot); a step on n nodes sees n times as many.
    interruption_rate_per_hour: Annotated[float, Field(ge=0)] = 0.0
    # The fast interconnect (an NVLink/InfiniBand island, a placement group, a Slurm switch): a tightly
    # coupled step lands only where all its nodes fit inside one domain. Say it in nodes
    # (`nodes_per_domain`) or in GPUs (`interconnect_domain_gpus`); both: they must agree.
    # Neither: the pool has no fast interconnect, and tightly coupled steps go elsewhere.
    interconnect_domain_gpus: Annotated[int, Field(ge=1)] | None = None  # GPUs in one fast domain
    nodes_per_domain: Annotated[int, Field(ge=1)] | None = None  # nodes in one fast domain
    # What a domain is (NVLink rack, TPU slice, UltraServer, switch) and its links: docs/accelerators.md.
    topology: Topology | None = None
    # Nodes held on standby to replace a gang's failed node (HyperPod's spare instances, a
    # reservation's standby nodes). Never offered to a step for fitting; a gang pays for them
    # while it runs (docs/placement.md, "Gangs: domains and spares").
    spare_nodes: Annotated[int, Field(ge=0)] = 0
    # Steps this pool runs at once (local backend); more are refused and fail over. None: no limit.
    max_concurrent_steps: Annotated[int, Field(ge=1)] | None = None
    # What happens after an attempt on this pool ends, unless the step says: a policy of
    # control_plane/compute/recovery.py (`failover`, `stay`). None: `failover`.
    recovery: str | None = None
    # After a refusal or a preemption the pool is avoided this long, if another pool can run the step.
    cooldown_seconds: Annotated[float, Field(ge=0)] = 300.0
    # A job the engine still holds pending after this long is cancelled: the pool counts as refusing.
    pending_deadline_seconds: Annotated[float, Field(gt=0)] = 600.0
    tenants: list[str] | None = None  # None: every tenant may use it
    # Health. Before a step lands on the pool it is qualified: the backend says the pool can take
    # work (Slurm: partition up, a node not drained), and a probe job checks that the step's runtime
    # starts, the storage root is reachable and the GPUs answer; a pass holds `qualify_ttl_seconds`.
    # `health_check` is a command run on the node (like Slurm's HealthCheckProgram, e.g. NHC), at
    # qualification and, on local pools, every `health_check_interval_seconds` while a step runs;
    # a non-zero exit drains the pool for `drain_seconds` and moves the step.
    qualify: bool = True  # false: land steps without qualifying the pool (no backend check, no probe)
    health_check: list[str] = Field(default_factory=list)
    health_check_interval_seconds: Annotated[float, Field(gt=0)] = 10.0
    qualify_ttl_seconds: Annotated[float, Field(ge=0)] = 900.0
    drain_seconds: Annotated[float, Field(ge=0)] = 1800.0
    # Runtime name -> how this pool runs it: a Python interpreter (local, Slurm; relative to the
    # repository or absolute), a container image (Kubernetes), or a Ray runtime environment
    # (a mapping). `default` is the interpreter running Dagster unless the pool says otherwise.
    runtimes: dict[str, str | dict[str, object]] = Field(default_factory=lambda: {"default": ""})

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, kind: str) -> str:
        backend_kind(kind)
        return kind

    @field_validator("capacity", mode="before")
    @classmethod
    def _unambiguous_capacity(cls, value: object) -> object:
        if isinstance(value, str) and value == "any":
            raise ValueError(AMBIGUOUS_POOL_CAPACITY)
        return value

    @field_validator("accelerator")
    @classmethod
    def _known_accelerator(cls, name: str) -> str:
        return check_accelerator(name)

    @field_validator("window_start", "window_end")
    @classmethod
    def _utc(cls, moment: dt.datetime | None) -> dt.datetime | None:
        return moment.replace(tzinfo=dt.UTC) if moment is not None and moment.tzinfo is None else moment

    @model_validator(mode="after")
    def _window_in_order(self) -> Pool:
        if self.window_start and self.window_end and self.window_end <= self.window_start:
            raise ValueError(f"`window_end` ({self.window_end}) must come after `window_start` ({self.window_start})")
        return self

    @field_validator("runtimes")
    @classmethod
    def _default_runtime_always(cls, runtimes: dict[str, str | dict[str, object]]) -> dict[str, str | dict[str, object]]:
        return {"default": "", **runtimes}

    @model_validator(mode="after")
    def _backend_settings_fit_backend(self) -> Pool:
        try:
            backend_kind(self.backend).settings.model_validate(self.backend_settings)
        except ValidationError as exc:
            problems = "; ".join(validation_problems(exc, f"not valid for a {self.backend} pool", under="backend_settings"))
            raise ValueError(problems) from None
        return self

    @model_validator(mode="after")
    def _domains_and_spares_fit(self) -> Pool:
        if self.spare_nodes >= self.nodes:
            raise ValueError(
                f"`spare_nodes` ({self.spare_nodes}) must be fewer than `nodes` ({self.nodes}): spares stand by for the "
                "nodes steps run on. Lower `spare_nodes` or raise `nodes`."
            )
        if self.nodes_per_domain is not None and self.nodes_per_domain > self.nodes:
            raise ValueError(
                f"`nodes_per_domain` ({self.nodes_per_domain}) is more than the pool's `nodes` ({self.nodes}). "
                "Lower it; if the whole pool is one domain, it equals `nodes`."
            )
        problems = domain_problems(
            accelerator_family=self.family, topology=self.topology, gpus_per_node=self.gpus_per_node, nodes=self.nodes,
            nodes_per_domain=self.nodes_per_domain, interconnect_domain_gpus=self.interconnect_domain_gpus,
        )
        if problems:
            raise ValueError("; ".join(problems))
        if (
            self.nodes_per_domain is not None
            and self.interconnect_domain_gpus is not None
            and self.nodes_per_domain * self.gpus_per_node != self.interconnect_domain_gpus
        ):
            raise ValueError(
                f"`interconnect_domain_gpus` ({self.interconnect_domain_gpus}) and `nodes_per_domain` ({self.nodes_per_domain}) "
                f"disagree: {self.nodes_per_domain} nodes × {self.gpus_per_node} GPUs per node = "
                f"{self.nodes_per_domain * self.gpus_per_node}. Keep one of the two."
            )
        return self

    @property
    def family(self) -> str:
        """What the accelerator's code must be written for: nvidia, amd, tpu, trainium, cpu, local."""
        return ACCELERATORS[self.accelerator].family

    @property
    def domain_nodes(self) -> int | None:
        """Nodes inside one fast interconnect domain; None: the pool has no fast interconnect."""
        if self.nodes_per_domain is not None:
            return self.nodes_per_domain
        if self.interconnect_domain_gpus is not None:
            return self.interconnect_domain_gpus // self.gpus_per_node if self.gpus_per_node else self.nodes
        if self.topology is not None and self.topology.slice_chips and self.gpus_per_node:
            return max(self.topology.slice_chips // self.gpus_per_node, 1)
        return None

    @property
    def domain_gpus(self) -> int | None:
        """GPUs inside one fast interconnect domain; None: the pool has no fast interconnect."""
        if self.interconnect_domain_gpus is not None:
            return self.interconnect_domain_gpus
        return self.domain_nodes * self.gpus_per_node if self.domain_nodes is not None else None

    @property
    def domain_noun(self) -> str:
        """What one of its fast domains is called: `NVLink domain`, `TPU slice`, `switch`, …."""
        return self.topology.domain.noun if self.topology is not None else "interconnect domain"

    @property
    def link_gb_per_s(self) -> tuple[float, float]:
        """GB/s per accelerator inside one domain and between domains."""
        topology = self.topology or Topology()
        inside = topology.link_gb_per_s or ACCELERATORS[self.accelerator].link_gb_per_s or topology.cross_domain_gb_per_s
        return inside, topology.cross_domain_gb_per_s

    @property
    def offered_nodes(self) -> int:
        """Nodes steps may be fitted on: all but the standby spares."""
        return self.nodes - self.spare_nodes

    @property
    def total_gpus(self) -> int:
        """GPUs steps may hold at once: the quota if the pool has one, else the offered nodes' (spares left out)."""
        return self.quota_gpus if self.quota_gpus is not None else self.gpus_per_node * self.offered_nodes


class PoolCatalogError(ValueError):
    """A pool catalog that cannot be used; the message names the file, pool and field."""


class PriceProvenance(BaseModel):
    """Where a catalog's prices came from and when; `illustrative` marks sample prices."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = ""
    as_of: dt.date | None = None
    illustrative: bool = False


class TenantLimits(BaseModel):
    """Where one tenant's work may run (data residency, contracts). None: anywhere."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    providers: list[str] | None = None
    regions: list[str] | None = None
    reason: str = Field(
        "",
        description="Where these limits come from, in words, when not from a catalog or a job file "
        "(e.g. 'the data agreement of lab-b (cell/omics@v3: eu-west-1)'); placement's evidence names it.",
    )


@dataclass
class Catalog:
    """A pool catalog with its catalog-wide sections; several files merge into one."""

    pools: dict[str, Pool]
    prices: PriceProvenance = field(default_factory=PriceProvenance)
    egress: EgressTable = field(default_factory=EgressTable)
    tenants: dict[str, TenantLimits] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    def price_provenance(self, pool: Pool) -> str:
        """'illustrative, list-price ballparks (as of 2026-11-01)': what the plan prints per pool."""
        source = pool.price_source or self.prices.source or "source not recorded"
        as_of = pool.price_as_of or self.prices.as_of
        return f"{source}{f' (as of {as_of})' if as_of else ''}"

    def merged(self, other: Catalog) -> Catalog:
        clash = set(self.pools) & set(other.pools)
        if clash:
            raise PoolCatalogError(f"{other.files[0]}: pool names already defined in {', '.join(self.files)}: {', '.join(sorted(clash))}")
        # The egress `default` is whichever file sets one (never the order the files are read in);
        # two files that set different ones are an error.
        mine, theirs = ("default" in self.egress.model_fields_set), ("default" in other.egress.model_fields_set)
        if mine and theirs and self.egress.default != other.egress.default:
            raise PoolCatalogError(
                f"{other.files[0]}: `egress.default` differs from the one set in {', '.join(self.files)}; "
                "set the default egress rates in one catalog file only"
            )
        default = {"default": self.egress.default if mine else other.egress.default} if mine or theirs else {}
        egress = EgressTable(
            source="; ".join(s for s in (self.egress.source, other.egress.source) if s),
            providers={**self.egress.providers, **other.egress.providers},
            **default,
        )
        prices = PriceProvenance(
            source=self.prices.source or other.prices.source,
            as_of=self.prices.as_of or other.prices.as_of,
            illustrative=self.prices.illustrative or other.prices.illustrative,
        )
        pools = {**{n: _with_provenance(p, self.prices) for n, p in self.pools.items()},
                 **{n: _with_provenance(p, other.prices) for n, p in other.pools.items()}}
        return Catalog(pools, prices, egress, {**self.tenants, **other.tenants}, self.files + other.files)


def _with_provenance(pool: Pool, prices: PriceProvenance) -> Pool:
    if pool.price_source and pool.price_as_of:
        return pool
    return pool.model_copy(update={"price_source": pool.price_source or prices.source, "price_as_of": pool.price_as_of or prices.as_of})


CATALOG_SECTIONS = {"pools", "prices", "egress", "tenants"}


def _section(path: Path, doc: dict, name: str, model, problems: list[str]):
    try:
        return model.model_validate(doc.get(name) or {})
    except ValidationError as exc:
        problems += validation_problems(exc, path, f"`{name}:` section")
        return model()


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Read and validate a whole catalog file (pools plus prices, egress and tenant limits).

    A folder reads every `*.yaml` in it and merges them (pool names must not repeat).
    """
    path = Path(path) if path else DEFAULT_CATALOG
    if path.is_dir():
        files = sorted(path.glob("*.yaml"))
        if not files:
            raise PoolCatalogError(f"{path}: folder holds no *.yaml pool catalogs.")
        catalog = load_catalog(files[0])
        for file in files[1:]:
            catalog = catalog.merged(load_catalog(file))
        return catalog
    doc = read_yaml_mapping(path, PoolCatalogError, "pool catalog", CATALOG_HOLDS)
    pools = _pools_of(path, doc)
    problems = [f"{path}: unknown top-level section `{k}` (expected: {', '.join(sorted(CATALOG_SECTIONS))})" for k in doc if k not in CATALOG_SECTIONS]
    prices = _section(path, doc, "prices", PriceProvenance, problems)
    egress = _section(path, doc, "egress", EgressTable, problems)
    tenants: dict[str, TenantLimits] = {}
    for tenant, limits in (doc.get("tenants") or {}).items():
        try:
            tenants[tenant] = TenantLimits.model_validate(limits or {})
        except ValidationError as exc:
            problems += validation_problems(exc, path, f"tenant `{tenant}`", known=TenantLimits.model_fields)
    if problems:
        raise PoolCatalogError("invalid pool catalog:\n  " + "\n  ".join(problems))
    pools = {n: _with_provenance(p, prices) for n, p in pools.items()}
    return Catalog(pools, prices, egress, tenants, [str(path)])


def load_pools(path: str | Path | None = None) -> dict[str, Pool]:
    """Read and validate a pool catalog (`pools.yaml`); the packaged default if no path."""
    path = Path(path) if path else DEFAULT_CATALOG
    return _pools_of(path, read_yaml_mapping(path, PoolCatalogError, "pool catalog", CATALOG_HOLDS))


def _pools_of(path: Path, doc: dict) -> dict[str, Pool]:
    if not isinstance(doc.get("pools"), dict) or not doc["pools"]:
        raise PoolCatalogError(f"{path}: expected a top-level `pools:` mapping of pool name to settings.")
    pools: dict[str, Pool] = {}
    problems: list[str] = []
    for name, fields in doc["pools"].items():
        if not isinstance(fields, dict):
            problems.append(f"{path}: pool `{name}`: expected a mapping of fields, got {type(fields).__name__}")
            continue
        try:
            pools[name] = Pool(name=name, **fields)
        except ValidationError as exc:
            problems += validation_problems(exc, path, f"pool `{name}`", known=[f for f in Pool.model_fields if f != "name"])
    if problems:
        raise PoolCatalogError("invalid pool catalog:\n  " + "\n  ".join(problems))
    return pools
