"""The job file (`JOB.yaml`): the model's steps, the data they read and the schedule.

`sinewgrid plan JOB.yaml` reads one and answers with a capacity plan. Errors name the
file, the entry (step or dataset) and the field, and say what to change. docs/placement.md
shows the format.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from control_plane.catalog.accelerators import check_accelerator, family_of
from control_plane.catalog.support import AcceleratorNeeds
from control_plane.catalog.pools import Capacity, Catalog, TenantLimits
from control_plane.catalog.step_spec import DatasetRef, StepSpec
from control_plane.catalog.yaml_files import read_yaml_mapping, validation_problems

JOB_FILE_HOLDS = (
    "A job file is a YAML mapping with `job` (a name), `tenant`, `start` (a UTC time) and `steps` "
    "(step name -> gpus, expected_hours, ...), optionally `datasets`, `budget_usd` and `limits`; see docs/placement.md."
)


class JobFileError(ValueError):
    """A job file that cannot be planned; the message names file, entry and field."""


class Dataset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    size_gb: Annotated[float, Field(ge=0)]
    provider: str
    region: str


class Repeat(BaseModel):
    """Run the step `count` times, `every_hours` apart (a nightly sweep: every_hours: 24)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: Annotated[int, Field(ge=1)]
    every_hours: Annotated[float, Field(gt=0)]


class JobStep(AcceleratorNeeds):
    """One step of the job: what it needs and when; never where (what its code runs on: `AcceleratorNeeds`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    entry_point: str = "planned"
    runtime: str = "default"
    tenant: str | None = None  # default: the job's tenant
    gpus: Annotated[int, Field(ge=0)] = 1
    nodes: Annotated[int, Field(ge=1)] = 1
    ranks_per_node: Annotated[int, Field(ge=1)] | None = None  # a gang of nodes × ranks (docs/gangs.md)
    accelerators: list[str] | None = None
    capacity: Capacity = Capacity.any
    tightly_coupled: bool = False
    checkpoints: bool = True
    checkpoint_seconds: Annotated[float, Field(ge=0)] = 60.0
    expected_hours: Annotated[float, Field(gt=0)]
    budget_usd: Annotated[float, Field(ge=0)] | None = None
    datasets: list[str] = Field(default_factory=list)
    start_hours: Annotated[float, Field(ge=0)] = 0.0  # after the job's `start`
    deadline_hours: Annotated[float, Field(gt=0)] | None = None  # after the step's own start
    repeat: Repeat | None = None

    @field_validator("accelerators")
    @classmethod
    def _known(cls, names: list[str] | None) -> list[str] | None:
        return [check_accelerator(n) for n in names] if names else names


class JobFile(BaseModel):
    """A job: its tenant, schedule origin, budget, input datasets and steps."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job: str
    tenant: str
    start: dt.datetime
    budget_usd: Annotated[float, Field(ge=0)] | None = None
    # Where the job's data may go: binds every step of the job, a step run for another tenant too,
    # on top of that tenant's own limits in the catalog (both apply).
    limits: TenantLimits | None = None
    datasets: dict[str, Dataset] = Field(default_factory=dict)
    steps: dict[str, JobStep] = Field(min_length=1)

    @field_validator("start")
    @classmethod
    def _utc(cls, moment: dt.datetime) -> dt.datetime:
        return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment

    @model_validator(mode="after")
    def _datasets_known(self) -> JobFile:
        for name, step in self.steps.items():
            unknown = [d for d in step.datasets if d not in self.datasets]
            if unknown:
                raise ValueError(
                    f"step `{name}`, field `datasets`: unknown dataset {', '.join(f'`{d}`' for d in unknown)} "
                    f"(the job's `datasets:` holds: {', '.join(self.datasets) or 'none'})"
                )
        return self

    def step_specs(self) -> list[StepSpec]:
        """Every run of every step as a StepSpec (a repeated step `sweep` becomes `sweep#1`, `sweep#2`, …)."""
        specs = []
        for name, step in self.steps.items():
            runs = step.repeat.count if step.repeat else 1
            fields = step.model_dump(exclude={"datasets", "start_hours", "repeat", "tenant"})
            datasets = [DatasetRef(name=d, **self.datasets[d].model_dump()) for d in step.datasets]
            for k in range(runs):
                offset = step.start_hours + (k * step.repeat.every_hours if step.repeat else 0.0)
                specs.append(
                    StepSpec(
                        name=f"{name}#{k + 1}" if step.repeat else name,
                        tenant=step.tenant or self.tenant,
                        limits=self.limits,
                        datasets=datasets,
                        start=self.start + dt.timedelta(hours=offset),
                        **fields,
                    )
                )
        return specs


def load_job(path: str | Path) -> JobFile:
    """Read and validate a job file; JobFileError names file, entry and field."""
    path = Path(path)
    doc = read_yaml_mapping(path, JobFileError, "job file", JOB_FILE_HOLDS)
    try:
        return JobFile.model_validate(doc)
    except ValidationError as exc:
        raise JobFileError("invalid job file:\n  " + "\n  ".join(validation_problems(exc, path))) from None


def check_against_catalog(job: JobFile, catalog: Catalog, path: str | Path) -> None:
    """Refuse requests no pool could ever meet (size, accelerator), before planning."""
    problems = []
    pools = list(catalog.pools.values())
    if not pools:
        raise JobFileError(f"{path}: the pool catalog ({', '.join(catalog.files)}) holds no pools.")
    largest = max(pools, key=lambda p: p.total_gpus)
    sold = {p.accelerator for p in pools}
    for name, step in job.steps.items():
        if step.gpus > largest.total_gpus:
            problems.append(
                f"{path}: step `{name}`, field `gpus`: asks for {step.gpus} GPUs, more than any pool has "
                f"(largest: `{largest.name}` with {largest.total_gpus}). Lower `gpus` or add a bigger pool."
            )
        if step.accelerators and not sold & set(step.accelerators):
            problems.append(
                f"{path}: step `{name}`, field `accelerators`: no pool sells {', '.join(step.accelerators)} "
                f"(the catalog sells: {', '.join(sorted(sold))})."
            )
        if not any(step.support_on(a) is not None for a in sold):
            problems.append(
                f"{path}: step `{name}`, field `runs_on`: its code runs on {', '.join(step.families())}, and no pool sells "
                f"one (the catalog sells: {', '.join(sorted(f'{a} ({family_of(a)})' for a in sold))}). Add the family the "
                "pools sell to `runs_on` once the code runs there, or add a pool."
            )
    if problems:
        raise JobFileError("impossible request:\n  " + "\n  ".join(problems))


def plan_job_file(path: str | Path, pool_sources: list[str | Path | None], time_budget_s: float | None = None):
    """Load a job file and the catalogs (files or folders, merged in order; None: the default)
    and plan it. Raises JobFileError, PoolCatalogError or InfeasiblePlanError with their reasons."""
    from control_plane.catalog.pools import load_catalog
    from control_plane.placement.planner import plan_job

    job = load_job(path)
    sources = list(pool_sources) or [None]
    catalog = load_catalog(sources[0])
    for source in sources[1:]:
        catalog = catalog.merged(load_catalog(source))
    check_against_catalog(job, catalog, path)
    budget = {} if time_budget_s is None else {"time_budget_s": time_budget_s}
    return plan_job(job.job, job.step_specs(), catalog, epoch=job.start, budget_usd=job.budget_usd, **budget)


def plan_calendar(paths: list[str | Path], pool_sources: list[str | Path | None], name: str = "calendar"):
    """Plan several job files together, so their steps share the pools' quotas and commitments.

    Each step is named `<job>/<step>`; each job's `limits:` bind its own steps only. The jobs'
    budgets are checked one by one afterwards (JobPlan.rows() carries each step's cost)."""
    from control_plane.catalog.pools import load_catalog
    from control_plane.placement.planner import InfeasiblePlanError, plan_job

    sources = list(pool_sources) or [None]
    catalog = load_catalog(sources[0])
    for source in sources[1:]:
        catalog = catalog.merged(load_catalog(source))
    jobs = [(path, load_job(path)) for path in paths]
    steps: list[StepSpec] = []
    for path, job in jobs:
        check_against_catalog(job, catalog, path)
        steps += [s.model_copy(update={"name": f"{job.job}/{s.name}"}) for s in job.step_specs()]
    plan = plan_job(name, steps, catalog, epoch=min(job.start for _, job in jobs))
    for _, job in jobs:
        spent = sum(r["cost_usd"] for r in plan.rows() if r["step"].startswith(f"{job.job}/"))
        if job.budget_usd is not None and spent > job.budget_usd:
            raise InfeasiblePlanError(f"{job.job}: the calendar's plan costs ${spent:,.2f}, over its budget ${job.budget_usd:,.2f}.")
    return plan
