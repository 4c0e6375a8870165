"""What a task run returns: each item's answer (or why it has none), and the run's figures.

`TaskRun.metadata()` is what an asset shows in the UI: the model that answered, the route and
why, the tokens, cache hits and cost per completed task beside the items that failed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from control_plane.catalog.models import ModelCatalog
from model_gateway.batch import BatchOutcome
from model_gateway.client import Call
from model_gateway.evaluation import Quality
from model_gateway.policy import DataPolicy
from model_gateway.routing import Route
from model_gateway.tasks import Task


@dataclass
class ItemResult:
    """One item: its answer, or the error that left it without one."""

    id: str
    payload: dict[str, Any]
    call: Call
    batch: bool = False
    answer: dict[str, Any] | None = None
    error: str = ""
    invalid: str = ""  # the answer came back but failed the schema or the task's verification
    spent: list[Call] = field(default_factory=list)  # earlier calls for this item (a retry after an invalid answer)

    @property
    def completed(self) -> bool:
        return self.answer is not None

    @property
    def calls(self) -> list[Call]:
        return [*self.spent, self.call]

    def total_call(self) -> Call:
        """All calls for this item as one: the tokens and cost of each, the model that answered last."""
        calls = self.calls
        return Call(
            model=self.call.model or next((c.model for c in reversed(calls) if c.model), None),
            asked=calls[0].asked,
            tokens_in=sum(c.tokens_in for c in calls),
            tokens_out=sum(c.tokens_out for c in calls),
            tokens_cached=sum(c.tokens_cached for c in calls),
            cache_hit=all(c.cache_hit for c in calls),
            cost_usd=sum(c.cost_usd for c in calls),
            seconds=sum(c.seconds for c in calls),
            error=self.error,
        )


@dataclass
class TaskRun:
    task: Task
    route: Route
    policy: DataPolicy
    items: list[ItemResult]
    evaluations: list[Quality]
    catalog: ModelCatalog
    batch: BatchOutcome | None = None

    @property
    def completed(self) -> list[ItemResult]:
        return [i for i in self.items if i.completed]

    @property
    def failed(self) -> list[ItemResult]:
        return [i for i in self.items if not i.completed]

    def totals(self) -> dict[str, Any]:
        calls = [i.total_call() for i in self.items]
        cost = sum(c.cost_usd for c in calls)
        done = len(self.completed)
        return {
            "items": len(self.items),
            "completed": done,
            "failed": len(self.items) - done,
            "tokens_in": sum(c.tokens_in for c in calls),
            "tokens_out": sum(c.tokens_out for c in calls),
            "tokens_cached": sum(c.tokens_cached for c in calls),
            "cache_hits": sum(c.cache_hit for c in calls),
            "batch_items": sum(i.batch and i.completed for i in self.items),
            "fell_back": sum(c.model is not None and c.model.id != self.route.primary.id for c in calls),
            "cost_usd": cost,
            "cost_per_completed_task_usd": cost / done if done else None,
            "evaluation_cost_usd": sum(q.cost_usd for q in self.evaluations),
        }

    def frame(self) -> pd.DataFrame:
        """One row per item: its id, answer fields, the model that answered, tokens and cost."""
        rows = []
        for item in self.items:
            call = item.total_call()
            rows.append({
                "id": item.id,
                **(item.answer or {}),
                "model": call.model.id if call.model else "",
                "provider": call.model.provider.name if call.model else "",
                "batch": item.batch,
                "tokens_in": call.tokens_in,
                "tokens_out": call.tokens_out,
                "tokens_cached": call.tokens_cached,
                "cache_hit": call.cache_hit,
                "cost_usd": call.cost_usd,
                "error": item.error,
            })
        return pd.DataFrame(rows)

    def models_used(self) -> dict[str, int]:
        used: dict[str, int] = {}
        for item in self.completed:
            model = item.total_call().model
            if model is not None:
                used[model.id] = used.get(model.id, 0) + 1
        return used

    def metadata(self) -> dict[str, Any]:
        """Dagster metadata: what an asset that used the gateway shows in the UI."""
        import dagster as dg

        t = self.totals()
        failures = "\n".join(f"- `{i.id}`: {i.error}" for i in self.failed[:10]) or "none"
        return {
            "task": self.task.ref,
            "model": self.route.primary.id,
            "models_used": dg.MetadataValue.json(self.models_used()),
            "route": dg.MetadataValue.md(self.route.markdown()),
            "data_policy": self.policy.describe(),
            "completed_tasks": t["completed"],
            "failed_tasks": t["failed"],
            "failures": dg.MetadataValue.md(failures),
            "tokens_in": t["tokens_in"],
            "tokens_out": t["tokens_out"],
            "tokens_cached": t["tokens_cached"],
            "cache_hits": t["cache_hits"],
            "answered_in_batch": t["batch_items"],
            "fell_back": t["fell_back"],
            "token_cost_usd": round(t["cost_usd"], 6),
            "cost_per_completed_task_usd": round(t["cost_per_completed_task_usd"], 8) if t["cost_per_completed_task_usd"] is not None else None,
            "evaluation_cost_usd": round(t["evaluation_cost_usd"], 6),
            "prices_as_of": self.catalog.prices_as_of,
            **({"batch": f"{self.batch.status} in {self.batch.seconds:.1f} s of a {self.batch.deadline_seconds / 60:.0f}-minute deadline "
                f"({len(self.batch.calls)} of {len(self.items)} items at the batch price)"} if self.batch else {}),
        }
