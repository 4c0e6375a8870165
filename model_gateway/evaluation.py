"""How good each model is at each task, measured on the task's own evaluation set and kept.

A task's evaluation set (`eval.jsonl`) holds inputs with their expected answers. Each model in the
catalog answers every row once; a row counts as right when the answer validates against the
task's schema, passes its verification (if it declares one) and matches the expected answer on
the task's `score` fields. The rate, its 95% Wilson interval and the mean tokens per call are kept
under `models/evaluations/<task>@v<version>/` in the storage root, one file per model and
version of the task: a model is measured again when the task (prompt, schema, evaluation set)
or the model's catalog entry (its provider's address, its name, the stand-in's quality) changes,
never because a price changed — prices are applied fresh when routing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from statsmodels.stats.proportion import proportion_confint

from control_plane.catalog.models import CatalogModel
from workload_runtime.storage import Storage, exists, read_json, write_json_atomic
from model_gateway.tasks import AnswerInvalid, Task


@dataclass(frozen=True)
class Quality:
    """One model's measured quality on one task."""

    model: str
    right: int
    n: int
    tokens_in_mean: float
    tokens_out_mean: float
    cost_usd: float = 0.0  # what measuring it cost
    measured_at: str = ""
    errors: int = 0  # calls that got no answer at all (an outage): such a measurement is not kept
    error: str = ""  # the first of them

    @property
    def rate(self) -> float:
        return self.right / self.n if self.n else 0.0

    @property
    def low(self) -> float:
        return float(proportion_confint(self.right, self.n, method="wilson")[0]) if self.n else 0.0

    @property
    def high(self) -> float:
        return float(proportion_confint(self.right, self.n, method="wilson")[1]) if self.n else 1.0

    def cost_per_call(self, model: CatalogModel, *, batch: bool = False) -> float:
        return model.cost(round(self.tokens_in_mean), round(self.tokens_out_mean), batch=batch)


@dataclass(frozen=True)
class Answered:
    """What one call of the evaluation returned: the answer text (or the error) and its tokens."""

    text: str | None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    error: str = ""


def model_fingerprint(model: CatalogModel) -> str:
    """What, if changed, may change a model's answers: not its prices."""
    p = model.provider
    said = {"api": p.api, "base_url": p.base_url, "model": model.name, "standin": model.spec.standin.model_dump() if model.spec.standin else None}
    return hashlib.sha256(json.dumps(said, sort_keys=True).encode()).hexdigest()[:12]


def _uri(storage: Storage, task: Task, model: CatalogModel) -> str:
    return storage.uri("models", "evaluations", task.ref, f"{model.id.replace('/', '__')}-{model_fingerprint(model)}-{task.fingerprint}.json")


def stored(storage: Storage, task: Task, model: CatalogModel) -> Quality | None:
    uri = _uri(storage, task, model)
    return Quality(**read_json(uri)) if exists(uri) else None


def measure(task: Task, model: CatalogModel, ask: Callable[[CatalogModel, dict[str, Any]], Answered], *, workers: int = 8) -> Quality:
    """Ask `model` every row of the task's evaluation set (a few at a time) and score the answers."""
    import datetime as dt

    rows = task.evaluation_set()

    def score(row: dict[str, Any]) -> tuple[bool, Answered]:
        answered = ask(model, row["input"])
        if answered.error:
            return False, answered
        try:
            return task.is_right(task.parse(answered.text, row["input"]), row["expected"]), answered
        except AnswerInvalid:
            return False, answered

    with ThreadPoolExecutor(max_workers=workers) as pool:
        scored = list(pool.map(score, rows))
    n = len(scored)
    return Quality(
        model=model.id,
        right=sum(ok for ok, _ in scored),
        n=n,
        tokens_in_mean=sum(a.tokens_in for _, a in scored) / n,
        tokens_out_mean=sum(a.tokens_out for _, a in scored) / n,
        cost_usd=round(sum(a.cost_usd for _, a in scored), 8),
        measured_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        errors=sum(bool(a.error) for _, a in scored),
        error=next((a.error for _, a in scored if a.error), ""),
    )


def qualities(storage: Storage, task: Task, models: list[CatalogModel], ask: Callable[[CatalogModel, dict[str, Any]], Answered]) -> tuple[dict[str, Quality], list[Quality]]:
    """Every model's quality on `task`: kept ones read back, missing ones measured now and kept.
    Returns those known and every measurement made now (whose cost the caller books); a model
    that could not be reached is left out of the first and kept nowhere."""
    found, measured = {}, []
    for model in models:
        quality = stored(storage, task, model)
        if quality is None:
            quality = measure(task, model, ask)
            measured.append(quality)
            if quality.errors:
                continue  # unreachable now: measured again next time, never routed to on a broken figure
            write_json_atomic(_uri(storage, task, model), asdict(quality))
        found[model.id] = quality
    return found, measured
