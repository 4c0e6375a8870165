"""Routing: for one task, the cheapest model that meets its quality bar, and who takes over when it fails.

Every model in the catalog is a candidate. A candidate is ruled out when the data's agreements do
not allow its provider (`policy.py`), when its measured quality on the task's evaluation set is
below the task's bar (`evaluation.py`), or, for a batch, when its provider has no batch API (it
may still take over online). The rest are ranked by the expected cost of one call: the mean
tokens each model used on the evaluation set at its prices (batch prices for a batch). The
cheapest is the primary; the first fallback is the cheapest on another provider, so an outage
of one provider never leaves a task without a model; the others follow by cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from control_plane.catalog.models import CatalogModel, ModelCatalog
from model_gateway.evaluation import Quality
from model_gateway.policy import DataPolicy, DataPolicyRefused
from model_gateway.tasks import Task


class NoModelMeetsBar(RuntimeError):
    """No allowed model meets the task's quality bar (the message lists every candidate and why)."""


@dataclass(frozen=True)
class Candidate:
    model: CatalogModel
    quality: Quality | None
    expected_cost: float  # USD per call, at the prices this route pays
    ruled_out: str = ""  # why it may not take the task ("" when it may)


@dataclass(frozen=True)
class Route:
    """The models one task goes to, in order, and the evidence for that order."""

    task: str
    bar: float
    batch: bool
    primary: CatalogModel
    fallbacks: list[CatalogModel]
    candidates: list[Candidate] = field(default_factory=list)

    @property
    def order(self) -> list[CatalogModel]:
        return [self.primary, *self.fallbacks]

    def markdown(self) -> str:
        """The candidates as a table, for an asset's metadata: why this model, why not the others."""
        roles = {m.id: ("primary" if i == 0 else f"fallback {i}") for i, m in enumerate(self.order)}
        lines = [
            "| model | provider | quality on the evaluation set (95% interval) | expected cost per call | role |",
            "|---|---|---|---|---|",
        ]
        for c in sorted(self.candidates, key=lambda c: (c.model.id not in roles, c.expected_cost)):
            q = f"{c.quality.rate:.0%} ({c.quality.low:.0%}–{c.quality.high:.0%}) of {c.quality.n}" if c.quality else "not measured"
            role = roles.get(c.model.id, f"not used: {c.ruled_out}")
            lines.append(f"| `{c.model.id}` | {c.model.provider.name} | {q} | ${c.expected_cost:.6f} | {role} |")
        return "\n".join(lines)


def choose(task: Task, catalog: ModelCatalog, qualities: dict[str, Quality], policy: DataPolicy, *, batch: bool = False) -> Route:
    """The route for `task` whose data carries `policy`'s agreements."""
    bar = task.spec.quality_bar
    candidates = []
    for model in catalog.models:
        quality = qualities.get(model.id)
        cost = quality.cost_per_call(model, batch=batch and model.provider.supports_batch) if quality else float("inf")
        if not policy.allows(model.provider):
            why = f"the data's agreement does not allow {model.provider.name} ({policy.why_not(model.provider)})"
        elif quality is None:
            why = "no evaluation on this task yet"
        elif quality.rate < bar:
            why = f"below the bar ({quality.rate:.0%} < {bar:.0%})"
        else:
            why = ""
        candidates.append(Candidate(model, quality, cost, why))
    eligible = sorted((c for c in candidates if not c.ruled_out), key=lambda c: c.expected_cost)
    if batch:
        # A batch goes to the cheapest model with a batch API; the others take over online.
        batchable = [c for c in eligible if c.model.provider.supports_batch]
        eligible = batchable[:1] + [c for c in eligible if c not in batchable[:1]] if batchable else eligible
    if not eligible:
        table = "; ".join(f"{c.model.id}: {c.ruled_out}" for c in candidates)
        refused_by_policy = [c for c in candidates if not policy.allows(c.model.provider)]
        if refused_by_policy:  # the agreements rule providers out: say so, and what would let the task run
            allowed = [c.model.id for c in candidates if policy.allows(c.model.provider)]
            raise DataPolicyRefused(
                f"{task.ref}: no model may take this task. The data is {policy.describe()}; the providers its agreements allow "
                f"({', '.join(allowed) or 'none'}) do not meet the bar of {bar:.0%}. Candidates: {table}. To go on, add an inside model "
                "(`outside: false`) that meets the bar to the model catalog, or have the tenant list a provider under `outside_models`."
            )
        raise NoModelMeetsBar(
            f"{task.ref}: no model meets the quality bar of {bar:.0%}. Candidates: {table}. Lower `quality_bar` in the task's "
            "task.yaml (a new version), improve the prompt, or add a stronger model to the model catalog."
        )
    primary = eligible[0].model
    others = [c.model for c in eligible[1:]]
    second = next((m for m in others if m.provider.name != primary.provider.name), None)
    fallbacks = ([second] if second else []) + [m for m in others if m is not second]
    return Route(task=task.ref, bar=bar, batch=batch and primary.provider.supports_batch, primary=primary, fallbacks=fallbacks, candidates=candidates)
