"""The model gateway: one task over many items, to the cheapest model that meets the task's bar.

`Gateway.run(task, items, inputs=..., who=...)`, in order:

1. **Budgets.** The project's and the tenant's budgets (tokens and GPU hours in one ledger) must
   not be over their hard limit; otherwise nothing is sent and `BudgetExceeded` says which budget.
2. **Policy.** The agreements of the data behind `inputs` (lineage ids) decide which providers
   may see the prompt (`policy.py`).
3. **Quality.** Every catalog model's quality on the task's evaluation set, measured once per
   version of the task and of the model (`evaluation.py`).
4. **Route.** The cheapest allowed model that meets the bar; fallbacks on another provider first
   (`routing.py`).
5. **Calls.** A batch task goes to the provider's batch API at the batch price and must be done
   before its deadline; what is not done then (or a batch the provider would not take) is answered
   online (`batch.py`). An online task goes item by item through LiteLLM's Router, which falls
   back along the route and cools a failing model down (`client.py`). Every answer is validated against the task's schema (and verified, where the
   task declares a check); an answer that fails is asked of the next model of the route once.
6. **Books.** One ledger row per item, the evaluations' cost, and a request log (`usage.py`).
"""

from __future__ import annotations

import datetime as dt
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from control_plane.accounting.ledger import Ledger
from control_plane.catalog.models import ModelCatalog, load_models
from control_plane.settings import settings
from control_plane.tenancy.control import tenants_of_root
from model_gateway.addresses import addresses
from model_gateway.batch import BatchOutcome, run_batch
from model_gateway.client import Call, ModelClient
from model_gateway.evaluation import Answered, qualities
from model_gateway.policy import DataPolicy, declared, policy_for
from model_gateway.results import ItemResult, TaskRun
from model_gateway.routing import choose
from model_gateway.tasks import AnswerInvalid, Task
from model_gateway.usage import Who, evaluation_row, log_requests, row
from workload_runtime.storage import Storage


class Gateway:
    """The gateway for one storage root (its ledger, evaluations, cache and logs) and one catalog."""

    def __init__(self, storage: Storage, catalog: ModelCatalog | None = None, *, workers: int = 4):
        self.storage = storage
        self.catalog = catalog or load_models()
        self.workers = workers
        self._client: ModelClient | None = None

    def client(self, tasks: list[Task]) -> ModelClient:
        found = addresses(self.catalog, self.storage.root, tasks)
        if self._client is None or self._client.addresses != found:
            self._client = ModelClient(self.catalog, found, self._cache_folder())
        return self._client

    def _cache_folder(self) -> Path:
        if self.storage.is_local:
            return Path(self.storage.root) / "models" / "response-cache"
        return settings().user_cache / "sinewgrid" / "model-responses"

    # The steps -----------------------------------------------------------------------------
    def run(
        self,
        task: Task,
        items: list[tuple[str, dict[str, Any]]],
        *,
        inputs: list[str],
        who: Who,
        policy: DataPolicy | None = None,
        data: Storage | None = None,
        deadline_minutes: float | None = None,
    ) -> TaskRun:
        """Answer every item of `task`; `inputs` are the lineage ids of the data the items come from,
        under `data` (a tenant's root; default: the gateway's own)."""
        from control_plane.accounting.budgets import enforce

        enforce(self.storage, project=who.project or who.lane, tenant=who.tenant)
        policy = policy if policy is not None else policy_for(data or self.storage, inputs)
        # Whose call it is counts, not only its lineage inputs (fail closed: a tenant's call with none is its data).
        policy = declared(policy, [who.tenant, *tenants_of_root(self.storage.root, (data or self.storage).root)])
        # A tenant's answers are never kept in the response cache: its data is sealed at rest, and
        # the cache (on the platform's disk) would hold what was derived from it in plain text.
        cache = not policy.tenants
        client = self.client([task])
        known, measured = qualities(self.storage, task, self.catalog.models, self._asker(client, task))
        self._book_evaluations(who, task, measured)
        route = choose(task, self.catalog, known, policy, batch=task.spec.mode == "batch")
        started = dt.datetime.now(dt.UTC)
        results: dict[str, ItemResult] = {}
        batch = None
        if route.batch and items:
            minutes = deadline_minutes if deadline_minutes is not None else task.spec.deadline_minutes
            try:
                batch = run_batch(task, items, route.primary, client.addresses[route.primary.provider.name], deadline_minutes=minutes)
            except Exception as exc:  # the batch API refused or is down: every item goes online instead
                batch = BatchOutcome(batch_id="", status=f"not sent ({type(exc).__name__}: {str(exc)[:200]})", seconds=0.0, deadline_seconds=60.0 * (minutes or 60))
            payloads = dict(items)
            for item_id, call in batch.calls.items():
                results[item_id] = self._settle(task, item_id, payloads[item_id], call, batch=True)
        online = [(i, p) for i, p in items if i not in results or not results[i].completed]
        order = route.order  # a batch's leftovers go online along the whole route
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            for item_id, result in zip([i for i, _ in online], pool.map(lambda item: self._online(client, task, item[1], order, who, item[0], cache), online)):
                if item_id in results:  # a batch answer that failed its check: its tokens were bought too
                    result.spent = [*results[item_id].calls, *result.spent]
                results[item_id] = result
        ordered = [results[i] for i, _ in items]
        self._book(who, task, policy, items, ordered, started)
        return TaskRun(task=task, route=route, policy=policy, items=ordered, evaluations=measured, catalog=self.catalog, batch=batch)

    def _asker(self, client: ModelClient, task: Task):
        def ask(model, payload: dict[str, Any]) -> Answered:
            call = client.complete(task, payload, [model], namespace="evaluation", cache=False)  # a re-measurement must ask the model again
            return Answered(text=call.text, tokens_in=call.tokens_in, tokens_out=call.tokens_out, cost_usd=call.cost_usd, error=call.error)

        return ask

    def _online(self, client: ModelClient, task: Task, payload: dict[str, Any], order, who: Who, item_id: str, cache: bool) -> ItemResult:
        call = client.complete(task, payload, order, namespace=who.namespace, cache=cache)
        result = self._settle(task, item_id, payload, call, batch=False)
        if result.invalid and call.model is not None:
            # One more try on the next models of the route (a cached bad answer is never reused).
            rest = [m for m in order if m.id != call.model.id]
            if rest:
                retry = client.complete(task, payload, rest, namespace=who.namespace, cache=False)
                again = self._settle(task, item_id, payload, retry, batch=False)
                again.spent = [call, *again.spent]
                return again
        return result

    @staticmethod
    def _settle(task: Task, item_id: str, payload: dict[str, Any], call: Call, *, batch: bool) -> ItemResult:
        if call.error:
            return ItemResult(id=item_id, payload=payload, call=call, batch=batch, error=call.error)
        try:
            return ItemResult(id=item_id, payload=payload, call=call, batch=batch, answer=task.parse(call.text, payload))
        except AnswerInvalid as exc:
            return ItemResult(id=item_id, payload=payload, call=call, batch=batch, invalid=str(exc), error=str(exc))

    # The books -----------------------------------------------------------------------------
    def _book(self, who: Who, task: Task, policy: DataPolicy, items, results: list[ItemResult], started: dt.datetime) -> None:
        ledger = Ledger.for_storage(self.storage)
        for number, result in enumerate(results, 1):
            call = result.total_call()
            ledger.record(row(who, task, number, result.id, call, completed=result.completed, batch=result.batch, started=started))
        log_requests(self.storage, who, task, policy, [(r.id, p, c, "answered" if r.completed else (r.error or "failed")) for r, (_, p) in zip(results, items) for c in r.calls])

    def _book_evaluations(self, who: Who, task: Task, measured) -> None:
        if not measured:
            return
        ledger, now = Ledger.for_storage(self.storage), dt.datetime.now(dt.UTC)
        evaluator = Who(run_id=who.run_id, asset=who.asset, partition=who.partition, lane=who.lane, project=who.project, tenant="")
        for number, quality in enumerate(measured, 1):
            ledger.record(evaluation_row(evaluator, task, number, quality, self.catalog.model(quality.model), now))
