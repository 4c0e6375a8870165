"""What a step's code runs on, how fast there, and how its gang may be laid over fast domains.

Shared by the step spec (`StepSpec`) and a job file's steps (`JobStep`): the same fields, the
same checks. docs/accelerators.md explains them to a user.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from control_plane.catalog.accelerators import ACCELERATORS, DEFAULT_FAMILIES, check_support_key


class Support(BaseModel):
    """How a step's code does on one family (or one accelerator).

    `throughput`: work per accelerator-hour against the step's own reference (1.0; the one its
    `expected_hours` was measured on): 2.0 finishes in half the hours. `needs_porting`: the code
    does not run there yet; the planner never lands it there, and its evidence says what the
    pool would cost with `porting_usd` (the one-off work of porting) added, so the team can decide.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    throughput: Annotated[float, Field(gt=0)] = 1.0
    needs_porting: bool = False
    porting_usd: Annotated[float, Field(ge=0)] = 0.0
    source: str = Field("declared", description="Where the throughput comes from: `declared`, or the run that measured it.")


def _support(value: object) -> object:
    """`tpu: 1.4` is short for `tpu: {throughput: 1.4}`."""
    return {"throughput": value} if isinstance(value, int | float) and not isinstance(value, bool) else value


class AcceleratorNeeds(BaseModel):
    """The fields of a step that say where its code runs and how its gang may be split."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runs_on: dict[str, Support] | None = Field(
        default=None,
        description=(
            "Accelerator families (`nvidia`, `amd`, `tpu`, `trainium`, `cpu`, `local`) or single accelerators "
            "(`tpu-v5p`) the step's code runs on, each with its relative throughput (`tpu: 1.4`) or "
            "`{throughput, needs_porting, porting_usd}`; an accelerator's own entry wins over its family's. "
            "None: CUDA code (nvidia, local, cpu at throughput 1)."
        ),
    )
    span_domains: bool = Field(
        default=False,
        description=(
            "A tightly coupled gang may be split across fast domains (NVLink racks, TPU slices, UltraServers) when it "
            "does not fit one, paying for the slower links (`allreduce_gb`, `compute_seconds_per_step`). False: one domain or refused."
        ),
    )
    allreduce_gb: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="GB all-reduced per training step (gradients: about 2 bytes × parameters in bf16)."
    )
    compute_seconds_per_step: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="Seconds of compute per training step on the reference accelerator, communication left out."
    )

    @field_validator("runs_on", mode="before")
    @classmethod
    def _short_form(cls, runs_on: object) -> object:
        if isinstance(runs_on, dict):
            return {check_support_key(str(k)): _support(v) for k, v in runs_on.items()}
        return runs_on

    @field_validator("runs_on")
    @classmethod
    def _not_empty(cls, runs_on: dict[str, Support] | None) -> dict[str, Support] | None:
        if runs_on is not None and not runs_on:
            raise ValueError("`runs_on` is empty: name at least one family (e.g. `nvidia: 1.0`), or leave it out for CUDA code")
        return runs_on

    @model_validator(mode="after")
    def _a_split_is_costed(self) -> AcceleratorNeeds:
        if self.span_domains and (self.allreduce_gb is None or self.compute_seconds_per_step is None):
            raise ValueError(
                "`span_domains: true` needs `allreduce_gb` and `compute_seconds_per_step`: the planner costs the slower "
                "links between domains from them (docs/accelerators.md, 'Gangs across domains')"
            )
        return self

    def support_on(self, accelerator: str) -> Support | None:
        """How the step does on `accelerator`; None: its code does not run there."""
        if self.runs_on is None:
            return Support() if ACCELERATORS[accelerator].family in DEFAULT_FAMILIES else None
        return self.runs_on.get(accelerator) or self.runs_on.get(ACCELERATORS[accelerator].family)

    def families(self) -> list[str]:
        """What it runs on, in words: `nvidia, amd ×0.9, tpu-v5p ×1.4 (needs porting)`."""
        if self.runs_on is None:
            return list(DEFAULT_FAMILIES)
        return [
            f"{k}{f' ×{s.throughput:g}' if s.throughput != 1 else ''}{' (needs porting)' if s.needs_porting else ''}"
            for k, s in self.runs_on.items()
        ]
