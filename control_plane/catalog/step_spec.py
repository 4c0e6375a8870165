"""A step spec: what a piece of GPU work needs — never where it runs."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from control_plane.catalog.accelerators import check_accelerator
from control_plane.catalog.pools import Capacity, TenantLimits
from control_plane.catalog.support import AcceleratorNeeds
from workload_runtime.inputs import DEFAULT_CHECKPOINT_EVERY_STEPS, DEFAULT_TELEMETRY_SECONDS, Failpoint

# What a training step imports on its pool, and so what qualifying a pool for it imports there.
TRAINING_IMPORTS = ("torch", "safetensors")


class DatasetRef(BaseModel):
    """An input dataset and where it sits: placement prefers compute next to it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    size_gb: Annotated[float, Field(ge=0)]
    provider: str
    region: str


class StepSpec(AcceleratorNeeds):
    """The needs of one GPU step. Placement turns it into a ranked list of pools.

    What its code runs on and how its gang may be split over fast domains: `AcceleratorNeeds`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Stable name of the step, e.g. `cell.foundation_model`.")
    entry_point: str = Field(description="Python module run with `python -m`, e.g. `cell_lane.workloads.pretrain`.")
    tenant: str
    runtime: str = Field(default="default", description="Named runtime the workload needs (e.g. `isaaclab`); pools map it to a venv or image.")
    gpus: Annotated[int, Field(ge=0)] = 1
    nodes: Annotated[int, Field(ge=1)] = 1
    ranks_per_node: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description=(
            "Processes per node for a step that trains data-parallel (usually one per GPU). With `nodes` it makes the "
            "step a gang of `nodes × ranks_per_node` ranks that start together or not at all. None: one process per node."
        ),
    )
    exclude_nodes: list[str] = Field(
        default_factory=list,
        description="Nodes of the pool the step must not use (Slurm `--exclude`); the platform adds a gang's failed node when it replaces it with a spare.",
    )
    accelerators: list[str] | None = Field(default=None, description="Acceptable accelerators; None: any.")
    limits: TenantLimits | None = Field(
        default=None,
        description=(
            "Where this step may run on top of its tenant's limits: the providers and regions its job's owner agreed "
            "its data may go to (a job file's `limits:`). Both apply. None: only the tenant's."
        ),
    )
    capacity: Capacity = Capacity.any
    tightly_coupled: bool = False
    checkpoints: bool = Field(default=True, description="Resumes from checkpoints, so spot capacity is acceptable.")
    checkpoint_every_steps: Annotated[int, Field(ge=1)] = DEFAULT_CHECKPOINT_EVERY_STEPS
    checkpoint_seconds: Annotated[float, Field(ge=0)] = 5.0
    expected_hours: Annotated[float, Field(gt=0)] = 1.0
    max_preemptions: Annotated[int, Field(ge=0)] = 3
    # A straggler: steps `straggler_factor` times slower than this attempt's own earlier ones, for
    # `straggler_patience` telemetry reports in a row. `replace` drains the pool and moves the step
    # (it resumes from a checkpoint taken on SIGTERM); `report` only says so.
    on_straggler: Literal["replace", "report"] = "report"
    straggler_factor: Annotated[float, Field(gt=1)] = 3.0
    straggler_patience: Annotated[int, Field(ge=1)] = 3
    telemetry_seconds: Annotated[float, Field(gt=0)] = Field(default=DEFAULT_TELEMETRY_SECONDS, description="How often the workload reports its time per step.")
    recovery: str | None = Field(
        default=None,
        description="The recovery policy after an attempt ends (`control_plane/compute/recovery.py`); None: the pool's, else `failover`.",
    )
    priority_class: str | None = Field(
        default=None,
        description="Its priority class in the quotas catalog (`control_plane/catalog/quotas.yaml`: e.g. `deadline`, `training`, `sweep`); None: the catalog's default.",
    )
    budget_usd: float | None = None
    datasets: list[DatasetRef] = Field(default_factory=list, description="Inputs the step reads; moving them costs egress and time.")
    start: dt.datetime | None = Field(default=None, description="When the step is planned to start (UTC); None: now.")
    deadline: dt.datetime | None = Field(default=None, description="When it must be done (UTC), data transfer and rework included.")
    deadline_hours: Annotated[float, Field(gt=0)] | None = Field(default=None, description="Or: hours after its start by which it must be done.")
    config: dict[str, Any] = Field(
        default_factory=dict, description="Handed to the workload as its config: the workload's config model, or the same as a mapping."
    )
    imports: list[str] = Field(
        default_factory=lambda: list(TRAINING_IMPORTS),
        description="Modules the workload needs on the pool: the qualification probe imports each there and reports its version.",
    )
    failpoint: Failpoint | None = Field(default=None, description="Failure drills only: a fault armed inside the workload.")

    @field_validator("config", mode="before")
    @classmethod
    def _config_model(cls, config: Any) -> Any:
        return config.model_dump(mode="json") if isinstance(config, BaseModel) else config

    @field_validator("accelerators")
    @classmethod
    def _known_accelerators(cls, names: list[str] | None) -> list[str] | None:
        return [check_accelerator(n) for n in names] if names else names

    @field_validator("start", "deadline")
    @classmethod
    def _utc(cls, moment: dt.datetime | None) -> dt.datetime | None:
        return moment.replace(tzinfo=dt.UTC) if moment is not None and moment.tzinfo is None else moment

    @property
    def world_size(self) -> int:
        """How many processes run the step: more than one makes it a gang (`workload_runtime/gang.py`)."""
        return self.nodes * (self.ranks_per_node or 1)

    @property
    def gang(self) -> bool:
        return self.world_size > 1

    def deadline_at(self, start: dt.datetime) -> dt.datetime | None:
        """The latest end: the earlier of `deadline` and `start + deadline_hours`."""
        ends = [d for d in (self.deadline, start + dt.timedelta(hours=self.deadline_hours) if self.deadline_hours else None) if d]
        return min(ends) if ends else None
