"""The quotas catalog: which team may use how much of each pool, and what preempts what.

The model is Kueue's (ClusterQueues in a cohort, fair sharing, priority classes), which the other
engines' own mechanisms map onto (Slurm accounts and QOS, Ray placement groups; docs/queues.md):

- a **team** is whose steps they are: its `members` are lanes or tenants (a step belongs to the
  first team that names its tenant, else its lane); `weight` is its fair-share weight;
- each pool's GPUs are shared by **nominal quotas** (`quotas: {pool: {team: {gpus: N}}}`): what
  the team may always use there; a pool's capacity not given to any team is everyone's to borrow;
- teams in one **cohort** lend their idle quota to each other and take it back: a team may go
  past its nominal quota by at most `borrowing_limit` GPUs (default: no limit), and lends at most
  `lending_limit` of its own (default: all of it). Teams in no cohort neither lend nor borrow;
- **priority classes** order the work (`priority_classes: {name: value}`, higher first); a step
  names one, else it gets `default_priority`. A team reclaiming its lent quota preempts borrowers
  of any priority; within a team, higher priority preempts lower.

The packaged catalog (`control_plane/catalog/quotas.yaml`) gives the demo's lanes their pools;
`SINEWGRID_QUOTAS` points at another file. Admission itself is `control_plane/queues/admission.py`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from control_plane.catalog.yaml_files import read_yaml_mapping, validation_problems

DEFAULT_QUOTAS = Path(__file__).with_name("quotas.yaml")
QUOTAS_HOLDS = (
    "A quotas file is a YAML mapping with `teams:` (each team's `members`, lanes or tenants, and its fair-share "
    "`weight`), `quotas:` (per pool, each team's `gpus` and optionally `borrowing_limit`, `lending_limit`), and "
    "optionally `cohorts:` (teams that lend to each other), `priority_classes:` (name: value) and `default_priority`; "
    "see control_plane/catalog/quotas.yaml."
)
SECTIONS = ("teams", "cohorts", "quotas", "priority_classes", "default_priority")
_NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,79}$")
_FIXES = {
    "members": "a list of the lanes or tenants whose steps are this team's, e.g. [cell, lab-a]",
    "weight": "a number above 0: the team's share of borrowed capacity against the others'",
    "gpus": "a whole number of GPUs, 0 or more",
    "borrowing_limit": "a whole number of GPUs, 0 or more, or leave it out for no limit",
    "lending_limit": "a whole number of GPUs, 0 or more, or leave it out to lend all of it",
    "teams": "a list of team names",
}


class QuotaCatalogError(ValueError):
    """A quotas file that cannot be used; the message names the file, the entry and the fix."""


class Team(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    members: list[str] = Field(min_length=1)
    weight: Annotated[float, Field(gt=0)] = 1.0
    description: str = ""


class Cohort(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    teams: list[str] = Field(min_length=1)
    description: str = ""


class Quota(BaseModel):
    """One team's share of one pool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: Annotated[int, Field(ge=0)]
    borrowing_limit: Annotated[int, Field(ge=0)] | None = None
    lending_limit: Annotated[int, Field(ge=0)] | None = None


class Quotas(BaseModel):
    """A whole quotas file, validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    teams: dict[str, Team] = Field(default_factory=dict)
    cohorts: dict[str, Cohort] = Field(default_factory=dict)
    quotas: dict[str, dict[str, Quota]] = Field(default_factory=dict)
    priority_classes: dict[str, int] = Field(default_factory=lambda: {"default": 0})
    default_priority: str = "default"
    file: str = ""

    def team_of(self, tenant: str, lane: str) -> str | None:
        """The team a step of `tenant` (in `lane`) belongs to: the first naming its tenant, else its lane."""
        for wanted in (tenant, lane):
            for name, team in self.teams.items():
                if wanted in team.members:
                    return name
        return None

    def cohort_of(self, team: str) -> str | None:
        return next((name for name, cohort in self.cohorts.items() if team in cohort.teams), None)

    def quota(self, pool: str, team: str) -> Quota:
        """`team`'s quota on `pool`: nothing nominal (it may only borrow) when the file gives it none."""
        return self.quotas.get(pool, {}).get(team) or Quota(gpus=0)

    def priority(self, name: str | None) -> int:
        """The value of priority class `name` (the default class's when None)."""
        wanted = name or self.default_priority
        if wanted not in self.priority_classes:
            raise QuotaCatalogError(
                f"{self.file or 'quotas'}: no priority class `{wanted}` (the classes: {', '.join(sorted(self.priority_classes))}); "
                "name one of them, or add it under `priority_classes:`"
            )
        return self.priority_classes[wanted]

    def problems_with(self, capacity: Mapping[str, int]) -> list[str]:
        """What does not hold against the pool catalog (`capacity`: each pool's GPUs): quotas of
        pools it lacks, and nominal quotas that add up to more than a pool has."""
        said = []
        for pool, shares in self.quotas.items():
            if pool not in capacity:
                said.append(f"{self.file}: quotas for pool `{pool}`, which the pool catalog does not have (its pools: {', '.join(sorted(capacity))})")
                continue
            nominal = sum(q.gpus for q in shares.values())
            if nominal > capacity[pool]:
                said.append(
                    f"{self.file}: the nominal quotas on pool `{pool}` add up to {nominal} GPUs, more than its {capacity[pool]} "
                    f"({', '.join(f'{t} {q.gpus}' for t, q in shares.items())}); lower them, or let teams borrow instead"
                )
        return said


def load_quotas(path: str | Path | None = None) -> Quotas:
    """Read and validate a quotas file (default: `SINEWGRID_QUOTAS`, else the packaged one)."""
    from control_plane.settings import settings

    path = Path(path or settings().quotas or DEFAULT_QUOTAS)
    doc = read_yaml_mapping(path, QuotaCatalogError, "quotas file", QUOTAS_HOLDS)
    problems = [f"{path}: unknown top-level section `{k}` (expected: {', '.join(SECTIONS)})" for k in doc if k not in SECTIONS]
    # Each entry on its own, so that a problem names its team, cohort or pool and team.
    entries = [(f"team `{k}`", Team, v) for k, v in _section(doc, "teams", problems, path).items()]
    entries += [(f"cohort `{k}`", Cohort, v) for k, v in _section(doc, "cohorts", problems, path).items()]
    for pool, shares in _section(doc, "quotas", problems, path).items():
        if not isinstance(shares, dict):
            problems.append(f"{path}: pool `{pool}`: map each team to its quota, e.g. {{cell: {{gpus: 8}}}}")
            continue
        entries += [(f"pool `{pool}`, team `{team}`", Quota, v) for team, v in shares.items()]
    for label, model, value in entries:
        try:
            model.model_validate(value)
        except ValidationError as exc:
            problems += validation_problems(exc, path, label, fixes=_FIXES, known=list(model.model_fields))
    if problems:
        raise QuotaCatalogError("invalid quotas file:\n  " + "\n  ".join(problems))
    try:
        found = Quotas.model_validate({**{k: v for k, v in doc.items() if k in SECTIONS}, "file": str(path)})
    except ValidationError as exc:
        raise QuotaCatalogError("invalid quotas file:\n  " + "\n  ".join(validation_problems(exc, path, fixes=_FIXES))) from None
    problems += _references(found, path)
    if problems:
        raise QuotaCatalogError("invalid quotas file:\n  " + "\n  ".join(problems))
    return found


def _section(doc: dict, name: str, problems: list[str], path: Path) -> dict:
    value = doc.get(name) or {}
    if not isinstance(value, dict):
        problems.append(f"{path}: `{name}:` must map names to their settings ({QUOTAS_HOLDS})")
        return {}
    return value


def _references(q: Quotas, path: Path) -> list[str]:
    """Names that must match: every team named is defined, in one cohort at most, and so on."""
    said = [f"{path}: team name `{t}`: use lower-case letters, digits, `-`, `_` and `.`, starting with a letter" for t in q.teams if not _NAME.match(t)]
    members: dict[str, str] = {}
    for name, team in q.teams.items():
        for member in team.members:
            if member in members:
                said.append(f"{path}: `{member}` is a member of both team `{members[member]}` and team `{name}`; a step must belong to one team")
            members.setdefault(member, name)
    in_cohort: dict[str, str] = {}
    for cohort, c in q.cohorts.items():
        for team in c.teams:
            if team not in q.teams:
                said.append(f"{path}: cohort `{cohort}` names team `{team}`, which `teams:` does not define")
            elif team in in_cohort:
                said.append(f"{path}: team `{team}` is in cohort `{in_cohort[team]}` and cohort `{cohort}`; a team lends and borrows in one cohort")
            in_cohort.setdefault(team, cohort)
    for pool, shares in q.quotas.items():
        for team, quota in shares.items():
            if team not in q.teams:
                said.append(f"{path}: pool `{pool}` gives a quota to team `{team}`, which `teams:` does not define")
            if quota.lending_limit is not None and quota.lending_limit > quota.gpus:
                said.append(f"{path}: pool `{pool}`, team `{team}`: `lending_limit` {quota.lending_limit} is more than its {quota.gpus} GPUs")
    if q.default_priority not in q.priority_classes:
        said.append(f"{path}: `default_priority: {q.default_priority}` is not one of `priority_classes` ({', '.join(sorted(q.priority_classes))})")
    return said
