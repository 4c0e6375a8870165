"""A step spec: what a piece of GPU work needs — never where it runs."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from shared_resources.pools import Capacity


class StepSpec(BaseModel):
    """The needs of one GPU step. Placement turns it into a ranked list of pools."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Stable name of the step, e.g. `cell.foundation_model`.")
    entry_point: str = Field(description="Python module run with `python -m`, e.g. `cell_lane.workloads.pretrain`.")
    tenant: str
    runtime: str = Field(default="default", description="Named runtime the workload needs (e.g. `isaaclab`); pools map it to a venv or image.")
    gpus: Annotated[int, Field(ge=0)] = 1
    nodes: Annotated[int, Field(ge=1)] = 1
    accelerators: list[str] | None = Field(default=None, description="Acceptable accelerators; None: any.")
    capacity: Capacity = Capacity.any
    tightly_coupled: bool = False
    checkpoints: bool = Field(default=True, description="Resumes from checkpoints, so spot capacity is acceptable.")
    checkpoint_every_steps: Annotated[int, Field(ge=1)] = 50
    checkpoint_seconds: Annotated[float, Field(ge=0)] = 5.0
    expected_hours: Annotated[float, Field(gt=0)] = 1.0
    max_preemptions: Annotated[int, Field(ge=0)] = 3
    budget_usd: float | None = None
    config: dict[str, Any] = Field(default_factory=dict, description="Handed to the workload as its config.")
