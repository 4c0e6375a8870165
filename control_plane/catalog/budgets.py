"""The budgets catalog: how much a project or a tenant may spend on GPU hours and model tokens.

A budget applies to one project or one tenant (`scope` and `name`; the name defaults to the
entry's key) over a period (`month`: the calendar month in UTC; `all`: everything ever booked),
with any of three limits: `usd` (GPU cost plus token cost), `gpu_hours` and `tokens` (input plus
output). At `warn_at` of a limit (default 0.8) the budget warns; at the limit it is over, and new
work of that project or tenant is refused (`control_plane.accounting.budgets.enforce`).

The packaged catalog (`control_plane/catalog/budgets.yaml`) holds generous budgets for the
demo's projects and labs; `SINEWGRID_BUDGETS` points at another file.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from control_plane.catalog.yaml_files import read_yaml_mapping, validation_problems
from control_plane.settings import settings

DEFAULT_BUDGETS = Path(__file__).with_name("budgets.yaml")
BUDGETS_HOLDS = (
    "A budgets file is a YAML mapping with one section, `budgets:`, naming each budget with its `scope` "
    "(project or tenant), optionally `name` (default: the budget's own name), `period` (month or all), "
    "at least one limit (`usd`, `gpu_hours`, `tokens`) and `warn_at` (default 0.8); see "
    "control_plane/catalog/budgets.yaml."
)
LIMITS = ("usd", "gpu_hours", "tokens")
_NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,79}$")
# How to fix each field, said after what pydantic found wrong with it.
_FIXES = {
    "scope": "use `project` or `tenant`",
    "period": "use `month` (the calendar month, UTC) or `all` (everything booked)",
    "usd": "a number of dollars, 0 or more (GPU cost plus token cost)",
    "gpu_hours": "a number of GPU-hours, 0 or more",
    "tokens": "a whole number of tokens (input plus output), 0 or more",
    "warn_at": "a fraction of the limit above 0 and at most 1, e.g. 0.8",
    "name": "the project or tenant the budget applies to, as the ledger books it",
}


class BudgetCatalogError(ValueError):
    """A budgets file that cannot be used; the message names the file, the budget and the fix."""


class Scope(StrEnum):
    project = "project"
    tenant = "tenant"


class Period(StrEnum):
    month = "month"  # the calendar month, UTC
    all = "all"  # everything the ledger holds


class Budget(BaseModel):
    """One budget: a project's or a tenant's limits over a period."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="The budget's own name: its key in the budgets file.")
    scope: Scope
    name: str = Field("", description="The project or tenant it applies to (default: `id`).")
    title: str = ""
    period: Period = Period.month
    usd: Annotated[float, Field(ge=0)] | None = Field(None, description="Dollars: GPU cost plus token cost. 0 stops all new work.")
    gpu_hours: Annotated[float, Field(ge=0)] | None = None
    tokens: Annotated[int, Field(ge=0)] | None = Field(None, description="Model tokens, input plus output.")
    warn_at: Annotated[float, Field(gt=0, le=1)] = 0.8

    @model_validator(mode="after")
    def _named_and_limited(self) -> Budget:
        if not self.name:
            object.__setattr__(self, "name", self.id)
        if all(getattr(self, limit) is None for limit in LIMITS):
            raise ValueError("no limit: give at least one of `usd`, `gpu_hours`, `tokens`")
        return self

    @property
    def limits(self) -> dict[str, float]:
        """The limits it sets, by kind (`usd`, `gpu_hours`, `tokens`)."""
        return {limit: float(value) for limit in LIMITS if (value := getattr(self, limit)) is not None}

    @property
    def label(self) -> str:
        """How messages name it: `project robotics`, `tenant lab-a`."""
        return f"{self.scope.value} {self.name}"


class Budgets(dict[str, Budget]):
    """The budgets by their own name, read from one budgets file."""

    file: str = ""

    def applying_to(self, *, project: str = "", tenant: str = "") -> list[Budget]:
        """The budgets that apply to work of `project` for `tenant` (either may be empty)."""
        return [
            b for b in self.values()
            if (b.scope is Scope.project and project and b.name == project) or (b.scope is Scope.tenant and tenant and b.name == tenant)
        ]


def budgets_file() -> Path:
    configured = settings().budgets
    return Path(configured) if configured else DEFAULT_BUDGETS


def load_budgets(path: str | Path | None = None) -> Budgets:
    """Read and validate a budgets file (default: `SINEWGRID_BUDGETS`, else the packaged one).
    Read again only when the file changed: this runs before every GPU step and model call."""
    path = Path(path) if path else budgets_file()
    try:
        stamp = (str(path.resolve()), path.stat().st_mtime_ns, path.stat().st_size)
    except OSError:
        return _read_budgets(path)
    if stamp not in _CACHE:
        _CACHE.clear()
        _CACHE[stamp] = _read_budgets(path)
    return _CACHE[stamp]


_CACHE: dict[tuple, Budgets] = {}


def _read_budgets(path: Path) -> Budgets:
    doc = read_yaml_mapping(path, BudgetCatalogError, "budgets file", BUDGETS_HOLDS)
    problems = [f"{path}: unknown top-level section `{k}` (expected: budgets)" for k in doc if k != "budgets"]
    found = Budgets()
    found.file = str(path)
    entries = doc.get("budgets") or {}
    if not isinstance(entries, dict):
        problems.append(f"{path}: `budgets:` must map each budget's name to its settings ({BUDGETS_HOLDS})")
        entries = {}
    for key, entry in entries.items():
        if not _NAME.match(str(key)):
            problems.append(f"{path}: budget name `{key}`: use lower-case letters, digits, `-`, `_` and `.`, starting with a letter")
            continue
        if entry is not None and not isinstance(entry, dict):
            problems.append(f"{path}: budget `{key}`: must be a mapping of settings (scope, period, usd, ...), not {entry!r}")
            continue
        try:
            found[key] = Budget.model_validate({"id": key, **(entry or {})})
        except ValidationError as exc:
            problems += validation_problems(exc, path, f"budget `{key}`", fixes=_FIXES, known=[f for f in Budget.model_fields if f != "id"])
    problems += _repeated(path, found)
    if problems:
        raise BudgetCatalogError("invalid budgets file:\n  " + "\n  ".join(problems))
    return found


def _repeated(path: Path, budgets: Budgets) -> list[str]:
    """Two budgets of one project (or tenant) over the same period: which one holds is unclear."""
    seen: dict[tuple[str, str, str], str] = {}
    said = []
    for key, b in budgets.items():
        what = (b.scope.value, b.name, b.period.value)
        if what in seen:
            said.append(f"{path}: budgets `{seen[what]}` and `{key}` both cover {b.label} over period `{b.period.value}`; merge them into one")
        seen.setdefault(what, key)
    return said
