"""What the gateway books: one ledger row per completed (or failed) item, and a request log.

Token work goes into the same ledger as GPU work, so one report and one budget cover both. A row
of the gateway has `backend` `model-gateway`, no GPUs and no allocated time (so no GPU hours);
`step` is the task and its version (`label-failure@v1`), `pool` and `model` the model that
answered, `provider` its provider, `purchasing` how its tokens were bought (`batch` for a batch),
`tokens_in`/`tokens_out`/`tokens_cached`, `cache_hits` (1 when the gateway's response cache
answered: no tokens bought) and `token_cost_usd`. `attempt` is the item's number within the run.

The request log (`models/requests/<run>-<task>.jsonl` under the storage root) keeps, per call, the
task, the model, the outcome and the tokens, and the prompt only when it holds no tenant's data
(`policy.loggable`). A row of an evaluation (`step` `evaluate <task>`) completes no task.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from control_plane.accounting.records import AttemptRecord
from control_plane.catalog.models import Purchasing
from model_gateway.client import Call
from model_gateway.evaluation import Quality
from model_gateway.policy import DataPolicy, loggable
from model_gateway.tasks import Task
from workload_runtime.storage import Storage, write_bytes_atomic

BACKEND = "model-gateway"


@dataclass(frozen=True)
class Who:
    """Whose work a task run is: the Dagster run and asset that asked, its project, lane and tenant."""

    run_id: str
    asset: str
    partition: str | None = None
    lane: str = ""
    project: str = ""
    tenant: str = ""

    @property
    def namespace(self) -> str:
        """The response cache's namespace: one tenant never gets another's cached answer."""
        return self.tenant or self.lane or "platform"


def row(
    who: Who, task: Task, number: int, item_id: str, call: Call, *, completed: bool, batch: bool, started: dt.datetime, step: str | None = None, counts: bool = True
) -> AttemptRecord:
    model = call.model
    purchasing = Purchasing.batch.value if batch else (model.provider.purchasing.value if model else Purchasing.pay_as_you_go.value)
    return AttemptRecord(
        run_id=who.run_id,
        step=step or task.ref,
        asset=who.asset,
        partition=who.partition,
        attempt=number,
        pool=model.id if model else call.asked,
        provider=model.provider.name if model else call.asked.split("/")[0],
        region="",
        backend=BACKEND,
        purchasing=purchasing,
        gpus=0,
        started_at=started.isoformat(),
        ended_at=(started + dt.timedelta(seconds=call.seconds)).isoformat(),
        allocated_seconds=0.0,
        productive_seconds=0.0,
        outcome="succeeded" if completed else "failed",
        exit_code=None,
        price_per_gpu_hour=0.0,
        project=who.project or who.lane,
        lane=who.lane,
        tokens_in=call.tokens_in,
        tokens_out=call.tokens_out,
        token_cost_usd=round(call.cost_usd, 10),
        task_id=f"{who.run_id}:{task.ref}:{item_id}",
        completed_task=completed and counts,
        cause="" if completed else "failed",
        tenant=who.tenant or who.lane,
        model=model.id if model else "",
        tokens_cached=call.tokens_cached,
        cache_hits=int(call.cache_hit),
    )


def evaluation_row(who: Who, task: Task, number: int, quality: Quality, catalog_model, started: dt.datetime) -> AttemptRecord:
    """What measuring one model on the task's evaluation set cost (booked once, as the platform's)."""
    call = Call(model=catalog_model, asked=catalog_model.id, tokens_in=round(quality.tokens_in_mean * quality.n), tokens_out=round(quality.tokens_out_mean * quality.n), cost_usd=quality.cost_usd)
    return row(who, task, number, f"evaluation:{catalog_model.id}", call, completed=not quality.errors, batch=False, started=started, step=f"evaluate {task.ref}", counts=False)


def log_requests(storage: Storage, who: Who, task: Task, policy: DataPolicy, entries: list[tuple[str, dict[str, Any], Call, str]]) -> str:
    """Write the run's request log: (item id, payload, call, outcome) per item. Returns its URI."""
    lines = []
    for item_id, payload, call, outcome in entries:
        content = json.dumps(payload, sort_keys=True, default=str)
        lines.append(json.dumps({
            "task": task.ref, "item": item_id, "model": call.model.id if call.model else "", "asked": call.asked, "outcome": outcome,
            "tokens_in": call.tokens_in, "tokens_out": call.tokens_out, "tokens_cached": call.tokens_cached, "cache_hit": call.cache_hit,
            "cost_usd": call.cost_usd, "seconds": round(call.seconds, 4), "error": call.error,
            "prompt": loggable(policy, content),
        }))
    uri = storage.uri("models", "requests", f"{who.run_id}-{task.name}.jsonl")
    write_bytes_atomic(uri, ("\n".join(lines) + "\n").encode())
    return uri

