"""The pool catalog: typed pools read from YAML, with errors that name file, pool and field."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from shared_resources.backend_settings import SETTINGS_BY_BACKEND

DEFAULT_CATALOG = Path(__file__).with_name("pools.yaml")


class Backend(StrEnum):
    local = "local"
    slurm = "slurm"
    kubernetes = "kubernetes"
    ray = "ray"


class Purchasing(StrEnum):
    reserved = "reserved"
    block = "block"
    on_demand = "on_demand"
    spot = "spot"


class Capacity(StrEnum):
    """What kind of capacity a pool offers: steady (long runs), burst (short, elastic),
    evaluation (kept apart so evaluation never queues behind training), any."""

    steady = "steady"
    burst = "burst"
    evaluation = "evaluation"
    any = "any"


class Pool(BaseModel):
    """What one provider sells: where, through which backend, how bought, at what price."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    provider: str
    region: str
    backend: Backend
    backend_settings: dict[str, object] = Field(default_factory=dict)
    purchasing: Purchasing
    capacity: Capacity = Capacity.any
    accelerator: str
    gpus_per_node: Annotated[int, Field(ge=0)]
    nodes: Annotated[int, Field(ge=1)] = 1
    quota_gpus: Annotated[int, Field(ge=0)] | None = None
    price_per_gpu_hour: Annotated[float, Field(ge=0)]
    interruption_rate_per_hour: Annotated[float, Field(ge=0)] = 0.0
    interconnect_domain_gpus: Annotated[int, Field(ge=1)] | None = None  # GPUs in one fast domain
    # Steps this pool runs at once (local backend); more are refused and fail over. None: no limit.
    max_concurrent_steps: Annotated[int, Field(ge=1)] | None = None
    # After a refusal or a preemption the pool is avoided this long, if another pool can run the step.
    cooldown_seconds: Annotated[float, Field(ge=0)] = 300.0
    # A job the engine still holds pending after this long is cancelled: the pool counts as refusing.
    pending_deadline_seconds: Annotated[float, Field(gt=0)] = 600.0
    tenants: list[str] | None = None  # None: every tenant may use it
    # Runtime name -> how this pool runs it: a Python interpreter (local, Slurm; relative to the
    # repository or absolute), a container image (Kubernetes), or a Ray runtime environment
    # (a mapping). `default` is the interpreter running Dagster unless the pool says otherwise.
    runtimes: dict[str, str | dict[str, object]] = Field(default_factory=lambda: {"default": ""})

    @field_validator("runtimes")
    @classmethod
    def _default_runtime_always(cls, runtimes: dict[str, str | dict[str, object]]) -> dict[str, str | dict[str, object]]:
        return {"default": "", **runtimes}

    @model_validator(mode="after")
    def _backend_settings_fit_backend(self) -> Pool:
        try:
            SETTINGS_BY_BACKEND[self.backend.value].model_validate(self.backend_settings)
        except ValidationError as exc:
            problems = "; ".join(f"`backend_settings.{'.'.join(map(str, e['loc']))}`: {e['msg']}" for e in exc.errors())
            raise ValueError(f"not valid for a {self.backend.value} pool: {problems}") from None
        return self

    @property
    def total_gpus(self) -> int:
        return self.quota_gpus if self.quota_gpus is not None else self.gpus_per_node * self.nodes


class PoolCatalogError(ValueError):
    """A pool catalog that cannot be used; the message names the file, pool and field."""


def load_pools(path: str | Path | None = None) -> dict[str, Pool]:
    """Read and validate a pool catalog (`pools.yaml`); the packaged default if no path."""
    path = Path(path) if path else DEFAULT_CATALOG
    if not path.exists():
        raise PoolCatalogError(f"{path}: pool catalog not found. Point SINEWGRID_POOLS at a pools.yaml.")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise PoolCatalogError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("pools"), dict) or not doc["pools"]:
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
            for err in exc.errors():
                field = ".".join(str(p) for p in err["loc"]) or "backend_settings"
                hint = f" (got {err['input']!r})" if err["type"] not in ("missing", "value_error") else ""
                problems.append(f"{path}: pool `{name}`, field `{field}`: {err['msg']}{hint}")
    if problems:
        raise PoolCatalogError("invalid pool catalog:\n  " + "\n  ".join(problems))
    return pools
