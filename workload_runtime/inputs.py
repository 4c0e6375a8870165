"""What a workload receives besides its own config: one typed model, both sides of the seam.

The `compute` resource builds a `WorkloadInputs` for every attempt; the backend puts it in the
Pipes extras (`to_extras()`); the workload helper reads it back (`from_extras()`). Run by hand,
the same JSON comes from `--extras FILE.json` or `SINEWGRID_WORKLOAD_EXTRAS`. The defaults
below are the only copy: `StepSpec` takes its cadence defaults from here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workload_runtime.tenant_access import TenantAccess

DEFAULT_CHECKPOINT_EVERY_STEPS = 50
DEFAULT_TELEMETRY_SECONDS = 1.0


class WorkloadInputsError(ValueError):
    """Extras a workload cannot start with; the message names each field and the fix."""


class Failpoint(BaseModel):
    """A fault a failure drill (or a test) arms inside the workload (never set outside them).

    `torn-checkpoint`: the writer of the first checkpoint at or after `at_step` kills itself
    (SIGKILL) after its tensor files and before its manifest, once: it first creates `marker`
    (holding the time it died), and does nothing while `marker` exists.

    `hold`: gives a fault injected from outside an event to fire on, whatever the machine's
    speed. Once the workload has done unit `at_step` or later (a training step, after any
    checkpoint due at it; a committed episode) and sent at least `after_reports` step-time
    reports, it creates `marker` (JSON: the step, its pid, the time, the reports sent) and waits
    there, doing no work, until SIGTERM arrives (it checkpoints and exits 75, as on any
    preemption), the file `release` appears, or `hold_seconds` pass. Once: nothing while
    `marker` exists. The held time counts neither as work nor as step time.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["torn-checkpoint", "hold"]
    at_step: Annotated[int, Field(ge=0)]
    marker: str = Field(description="A file the failpoint creates when it fires; it fires only while the file is absent.")
    after_reports: Annotated[int, Field(ge=0)] = Field(0, description="hold: fire only once this many telemetry reports were sent.")
    hold_seconds: Annotated[float, Field(gt=0)] = Field(300.0, description="hold: the longest it waits (a drill that died never leaves it waiting).")

    @property
    def release(self) -> str:
        """hold: the file whose creation lets a held workload go on."""
        return f"{self.marker}.release"


class LineageStamp(BaseModel):
    """Where a checkpoint came from: written into every checkpoint manifest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: str
    lineage: str
    run_id: str
    asset: str
    datasets: list[str] = Field(default_factory=list)
    code_version: str = ""


class WorkloadInputs(BaseModel):
    """Everything the platform hands one attempt of a workload, besides the workload's config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config: dict[str, Any] = Field(default_factory=dict, description="The workload's own config (its config model validates it).")
    checkpoint_uri: str | None = Field(default=None, description="Where this run's checkpoints live (none for the qualification probe).")
    checkpoint_every_steps: Annotated[int, Field(ge=1)] = DEFAULT_CHECKPOINT_EVERY_STEPS
    checkpoint_interval_seconds: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="Young/Daly interval for an interruptible pool: checkpoint at least this often."
    )
    telemetry_seconds: Annotated[float, Field(gt=0)] = DEFAULT_TELEMETRY_SECONDS
    lineage: LineageStamp | None = None
    attempt: Annotated[int, Field(ge=1)] = 1
    pool: str = ""
    storage_root: str | None = None
    log_uri: str | None = None
    failpoint: Failpoint | None = None
    tenant: TenantAccess | None = Field(
        default=None, description="The tenant whose work this is: its storage root, credentials and key (none for the platform's own steps)."
    )

    def to_extras(self) -> dict[str, Any]:
        """The Pipes extras (plain JSON) that carry these inputs to the workload."""
        return self.model_dump(mode="json", exclude_none=True)

    @classmethod
    def from_extras(cls, extras: Any, where: str = "the Pipes extras") -> WorkloadInputs:
        """Read the inputs back; a clear error naming every bad field otherwise."""
        try:
            return cls.model_validate(dict(extras or {}))
        except ValidationError as exc:
            raise WorkloadInputsError(
                f"{where} are not valid workload inputs: {field_problems(exc, 'extras')}. Expected a JSON object with `config`, "
                "`checkpoint_uri` and optionally `checkpoint_every_steps`, `telemetry_seconds`, `attempt`, ..."
            ) from None

    @classmethod
    def from_pipes_env(cls) -> WorkloadInputs | None:
        """The inputs a Pipes launcher handed this process, read without opening the session
        (a gang's other ranks: rank 0 alone talks to Pipes); None outside Pipes."""
        from dagster_pipes import PipesDefaultContextLoader, PipesEnvVarParamsLoader

        loader = PipesEnvVarParamsLoader()
        if not loader.is_dagster_pipes_process():
            return None
        with PipesDefaultContextLoader().load_context(loader.load_context_params()) as data:
            return cls.from_extras(data.get("extras") or {})


def field_problems(exc: ValidationError, whole: str) -> str:
    """What pydantic refused, on one line: `field.path`: what is wrong; ... (`whole` names what an
    error of the whole value is about). The workload side's form; catalogs and job files on the
    control plane say theirs with `catalog.yaml_files.validation_problems`."""
    return "; ".join(f"`{'.'.join(map(str, e['loc'])) or whole}`: {e['msg']}" for e in exc.errors())
