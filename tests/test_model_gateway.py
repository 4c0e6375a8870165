"""The model gateway over real HTTP: stand-in providers on loopback answer through LiteLLM's Router.

Routing picks the cheapest model that meets the task's bar; a 429 or an outage falls back to the
second provider; a repeated prompt is answered from the cache at no token cost; a batch finishes
before its deadline at the batch price (or is finished online when it would not); data whose
agreement forbids outside models never reaches an outside provider (their own request logs are
read); every item is booked in the ledger beside GPU work.
"""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from control_plane.accounting.ledger import Ledger
from control_plane.catalog.models import load_models
from control_plane.catalog.tenants import Agreement
from data_layer.provenance import publish_version
from model_gateway.gateway import Gateway
from model_gateway.policy import DataPolicy, DataPolicyRefused
from model_gateway.tasks import Task
from model_gateway.usage import Who
from testbed.model_providers import hub as standin_hub
from workload_runtime.storage import Storage

TASK = Path(__file__).parent / "model_tasks" / "tell-parity"
ITEMS = [(f"n{n}", {"n": n}) for n in range(2000, 2016)]
SECRET = "ASSAY-VALUE-7731-SECRET"


@pytest.fixture(scope="module")
def evaluations(tmp_path_factory) -> Path:
    """Every stand-in model measured once on tell-parity (each test copies the results)."""
    root = tmp_path_factory.mktemp("evaluated")
    Gateway(Storage.at(str(root))).run(Task(TASK), [], inputs=[], who=_who("evaluate"), policy=DataPolicy())
    yield root / "models" / "evaluations"
    standin_hub.stop_all()


@pytest.fixture
def gateway(tmp_path, evaluations) -> Gateway:
    root = tmp_path / "root"
    shutil.copytree(evaluations, root / "models" / "evaluations")
    return Gateway(Storage.at(str(root)))


def _who(run: str, **kw) -> Who:
    return Who(run_id=run, asset="test/parity_labels", lane="test", **kw)


def _standin(gateway: Gateway, provider: str):
    return standin_hub.standin(gateway.catalog.providers[provider], gateway.storage.root, [Task(TASK)])


def _chat_requests(gateway: Gateway, provider: str) -> list[dict]:
    return [r for r in _standin(gateway, provider).requests() if r["path"].endswith(("/chat/completions", "/messages"))]


def _gateway_rows(gateway: Gateway, run: str):
    frame = Ledger.for_storage(gateway.storage).frame(run_id=run)
    return frame[frame["backend"] == "model-gateway"]


def test_the_cheapest_model_that_meets_the_bar_answers(gateway):
    run = gateway.run(Task(TASK), ITEMS, inputs=[], who=_who("cheapest"), policy=DataPolicy())
    eligible = [c for c in run.route.candidates if not c.ruled_out]
    assert run.route.primary.id == min(eligible, key=lambda c: c.expected_cost).model.id
    below = [c for c in run.route.candidates if "below the bar" in c.ruled_out]
    assert below and all(c.quality.rate < 0.85 for c in below)
    assert min(c.expected_cost for c in below) < min(c.expected_cost for c in eligible)  # the cheapest is not good enough
    assert len(run.completed) == len(ITEMS) and all(i.answer["parity"] in ("even", "odd") for i in run.items)
    rows = _gateway_rows(gateway, "cheapest")
    assert len(rows) == len(ITEMS) and set(rows["model"]) == {run.route.primary.id}
    assert rows["gpu_hours"].sum() == 0 and rows["completed_task"].all()
    assert rows["token_cost_usd"].sum() == pytest.approx(run.totals()["cost_usd"]) and run.totals()["cost_usd"] > 0
    for item in run.items:  # LiteLLM, given the catalog's prices, agrees with the gateway's own figure
        assert item.call.litellm_cost_usd == pytest.approx(item.call.cost_usd, rel=1e-6)


def test_an_outage_falls_back_to_the_second_provider_and_the_answers_validate(gateway):
    primary = gateway.catalog.model("standin-anthropic/brisk-2")
    _standin(gateway, primary.provider.name).set_outage(True)
    run = gateway.run(Task(TASK), ITEMS, inputs=[], who=_who("outage"), policy=DataPolicy())
    assert run.route.primary.id == primary.id
    second = run.route.fallbacks[0]
    assert second.provider.name != primary.provider.name
    assert len(run.completed) == len(ITEMS)
    assert {i.total_call().model.id for i in run.items} <= {m.id for m in run.route.fallbacks}
    statuses = [r["status"] for r in _chat_requests(gateway, primary.provider.name)]
    assert statuses and set(statuses) == {529}  # the provider really was asked, and really was down
    assert set(_gateway_rows(gateway, "outage")["provider"]) <= {m.provider.name for m in run.route.fallbacks}


def test_a_rate_limit_falls_back_and_no_item_is_lost(gateway):
    standin = _standin(gateway, "standin-anthropic")
    standin.set_rate_limit(3)
    run = gateway.run(Task(TASK), ITEMS, inputs=[], who=_who("limited"), policy=DataPolicy())
    assert len(run.completed) == len(ITEMS)
    used = run.models_used()
    assert 0 < used.get("standin-anthropic/brisk-2", 0) <= 3 and sum(used.values()) == len(ITEMS)
    assert 429 in {r["status"] for r in _chat_requests(gateway, "standin-anthropic")}


def test_a_repeated_prompt_is_served_from_the_cache_and_costs_no_tokens(gateway):
    first = gateway.run(Task(TASK), ITEMS, inputs=[], who=_who("first"), policy=DataPolicy())
    asked = {p: len(_chat_requests(gateway, p)) for p in gateway.catalog.providers}
    again = gateway.run(Task(TASK), ITEMS, inputs=[], who=_who("again"), policy=DataPolicy())
    assert [i.answer for i in again.items] == [i.answer for i in first.items]
    assert again.totals()["cache_hits"] == len(ITEMS) and again.totals()["tokens_in"] == 0 and again.totals()["cost_usd"] == 0
    assert {p: len(_chat_requests(gateway, p)) for p in gateway.catalog.providers} == asked  # no provider was asked again
    rows = _gateway_rows(gateway, "again")
    assert rows["cache_hits"].sum() == len(ITEMS) and rows["token_cost_usd"].sum() == 0


def _batch_task(tmp_path: Path, deadline_minutes: float) -> Task:
    folder = tmp_path / "tell-parity-batch"
    shutil.copytree(TASK, folder)
    spec = yaml.safe_load((folder / "task.yaml").read_text())
    spec.update(mode="batch", deadline_minutes=deadline_minutes)
    (folder / "task.yaml").write_text(yaml.safe_dump(spec))
    return Task(folder)


def test_a_batch_finishes_before_its_deadline_at_the_batch_price(gateway, tmp_path):
    task = _batch_task(tmp_path, deadline_minutes=1)
    run = gateway.run(task, ITEMS, inputs=[], who=_who("batch"), policy=DataPolicy())
    assert run.route.batch and run.route.primary.provider.supports_batch
    assert run.batch is not None and run.batch.status == "completed" and run.batch.in_time
    assert all(i.batch and i.completed for i in run.items)
    rows = _gateway_rows(gateway, "batch")
    rows = rows[rows["step"] == task.ref]
    assert set(rows["purchasing"]) == {"batch"}
    model = run.route.primary
    expected = sum(model.cost(r.tokens_in, r.tokens_out, r.tokens_cached, batch=True) for r in rows.itertuples())
    assert rows["token_cost_usd"].sum() == pytest.approx(expected)
    online = sum(model.cost(r.tokens_in, r.tokens_out, r.tokens_cached) for r in rows.itertuples())
    assert rows["token_cost_usd"].sum() < online
    batches = [r for r in _standin(gateway, model.provider.name).requests() if r["path"] == "/v1/batches"]
    assert len(batches) == 1


def test_a_batch_that_would_miss_its_deadline_is_finished_online(gateway, tmp_path):
    task = _batch_task(tmp_path, deadline_minutes=0.05)  # three seconds
    model = gateway.catalog.model("standin-openai/sage-1")
    _standin(gateway, model.provider.name).config.batch_seconds = 120
    run = gateway.run(task, ITEMS, inputs=[], who=_who("late"), policy=DataPolicy())
    assert run.batch is not None and run.batch.status == "cancelled"
    assert len(run.completed) == len(ITEMS) and not any(i.batch for i in run.items)
    late = _gateway_rows(gateway, "late")
    assert "batch" not in set(late[late["step"] == task.ref]["purchasing"])


@pytest.fixture
def two_labs(tmp_path, monkeypatch):
    """lab-x agreed to no outside models; lab-y to the Anthropic-compatible stand-in."""
    tenants = {"tenants": {
        "lab-x": {"lane": "cell", "agreement": {"outside_models": []}},
        "lab-y": {"lane": "cell", "agreement": {"outside_models": ["standin-anthropic"]}},
    }}
    path = tmp_path / "tenants.yaml"
    path.write_text(yaml.safe_dump(tenants))
    monkeypatch.setenv("SINEWGRID_TENANTS", str(path))
    monkeypatch.setenv("SINEWGRID_KEYS_DIR", str(tmp_path / "keys"))


def _published(gateway: Gateway, tmp_path: Path, tenant: str) -> str:
    data = tmp_path / f"plates-{tenant}"
    data.mkdir()
    (data / "values.json").write_text(json.dumps({"value": SECRET}))
    version, _ = publish_version(gateway.storage, f"cell/plates-{tenant}", "v1", str(data), title=f"{tenant} plates", inputs=[], tenant=tenant)
    return version.ref


def _items_with_secret() -> list[tuple[str, dict]]:
    return [(item_id, {**payload, "note": SECRET}) for item_id, payload in ITEMS[:6]]


def test_data_that_may_not_go_to_outside_models_never_reaches_one(gateway, tmp_path, two_labs):
    ref = _published(gateway, tmp_path, "lab-x")
    run = gateway.run(Task(TASK), _items_with_secret(), inputs=[ref], who=_who("lab-x", tenant="lab-x"))
    assert run.policy.tenants == ["lab-x"]
    assert len(run.completed) == 6 and {m.provider.outside for m in run.route.order} == {False}
    for provider in gateway.catalog.providers.values():
        bodies = json.dumps(_standin(gateway, provider.name).requests())
        assert (SECRET in bodies) is (not provider.outside), provider.name  # the inside model saw it; no outside one did
    log = (Path(gateway.storage.root) / "models" / "requests" / "lab-x-tell-parity.jsonl").read_text()
    assert SECRET not in log and "withheld: data of lab-x" in log


def _holds(folder: Path, secret: str) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()] if folder.exists() else []


def test_a_tenants_call_without_lineage_inputs_is_still_that_tenants_data(gateway, tmp_path, two_labs):
    """As an attacker would call it: lab-x's payload with no lineage inputs (and an empty policy
    passed in) used to count as the platform's own data, go to an outside provider, be logged in
    plain text and enter the response cache. The call's tenant binds it, as its agreement says."""
    run = gateway.run(Task(TASK), _items_with_secret(), inputs=[], who=_who("lab-x-bare", tenant="lab-x"), policy=DataPolicy())
    assert run.policy.tenants == ["lab-x"]
    assert len(run.completed) == 6 and {m.provider.outside for m in run.route.order} == {False}
    assert all(SECRET not in json.dumps(_standin(gateway, p.name).requests()) for p in gateway.catalog.providers.values() if p.outside)
    models = Path(gateway.storage.root) / "models"
    assert not _holds(models / "requests", SECRET) and not _holds(models / "response-cache", SECRET)
    assert "withheld: data of lab-x" in (models / "requests" / "lab-x-bare-tell-parity.jsonl").read_text()


def test_a_call_that_reads_a_tenants_root_is_bound_by_that_tenant(gateway, tmp_path, two_labs):
    from control_plane.tenancy.control import tenant_storage

    lab_root = tenant_storage(gateway.storage.root, "lab-x")  # no tenant in `who`, but lab-x's data
    run = gateway.run(Task(TASK), _items_with_secret(), inputs=[], who=_who("lab-x-root"), data=lab_root)
    assert run.policy.tenants == ["lab-x"] and {m.provider.outside for m in run.route.order} == {False}


def test_an_agreement_that_lists_a_provider_lets_the_data_go_there(gateway, tmp_path, two_labs):
    ref = _published(gateway, tmp_path, "lab-y")
    run = gateway.run(Task(TASK), _items_with_secret(), inputs=[ref], who=_who("lab-y", tenant="lab-y"))
    assert run.route.primary.id == "standin-anthropic/brisk-2"
    assert SECRET in json.dumps(_standin(gateway, "standin-anthropic").requests())
    assert SECRET not in json.dumps(_standin(gateway, "standin-openai").requests())


def test_no_allowed_model_meeting_the_bar_refuses_with_a_clear_message(gateway, tmp_path, two_labs):
    ref = _published(gateway, tmp_path, "lab-x")
    folder = tmp_path / "strict"
    shutil.copytree(TASK, folder)
    (folder / "task.yaml").write_text((folder / "task.yaml").read_text().replace("quality_bar: 0.85", "quality_bar: 0.99"))
    with pytest.raises(DataPolicyRefused) as refused:
        gateway.run(Task(folder), _items_with_secret(), inputs=[ref], who=_who("strict", tenant="lab-x"))
    message = str(refused.value)
    assert "lab-x" in message and "outside models: none" in message and "outside: false" in message
    assert all(SECRET not in json.dumps(_standin(gateway, p).requests()) for p in gateway.catalog.providers)


def test_the_packaged_catalog_reads_and_prices_a_call():
    catalog = load_models()
    model = catalog.model("standin-openai/swift-1")
    assert model.cost(1_000_000, 0) == pytest.approx(0.15) and model.cost(0, 1_000_000, batch=True) == pytest.approx(0.30)
    assert model.cost(1_000_000, 0, 1_000_000) == pytest.approx(0.075)  # all input from the prompt cache
    assert catalog.prices_as_of and {p.outside for p in catalog.providers.values()} == {True, False}
    assert Agreement().outside_models == []


def test_a_budget_warns_then_refuses_new_calls_with_a_clear_message(gateway, tmp_path, monkeypatch):
    from control_plane.accounting.budgets import BudgetExceeded, check
    from platform_location.defs.budget_alerts import alert_round
    from tests.test_budgets import Webhook

    first = gateway.run(Task(TASK), ITEMS, inputs=[], who=_who("spend-1"), policy=DataPolicy())
    cost = first.totals()["cost_usd"]
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(yaml.safe_dump({"budgets": {"test": {"scope": "project", "period": "month", "usd": round(cost * 1.6, 8), "warn_at": 0.5}}}))
    monkeypatch.setenv("SINEWGRID_BUDGETS", str(budgets))
    hook = Webhook()
    try:
        warned = alert_round(check(gateway.storage), None, hook.url)
        assert [(s.budget.id, s.status) for s in warned.sent] == [("test", "warn")]  # 62% of the budget: the warning went out
        assert hook.received[0]["budget"] == "test" and hook.received[0]["status"] == "warn"
    finally:
        hook.close()
    more = [(f"m{n}", {"n": n}) for n in range(3000, 3016)]  # new prompts: the cache cannot answer them
    gateway.run(Task(TASK), more, inputs=[], who=_who("spend-2"), policy=DataPolicy())  # under the limit when it starts
    asked = sum(len(_chat_requests(gateway, p)) for p in gateway.catalog.providers)
    with pytest.raises(BudgetExceeded) as refused:
        gateway.run(Task(TASK), [(f"k{n}", {"n": n}) for n in range(4000, 4004)], inputs=[], who=_who("spend-3"), policy=DataPolicy())
    message = str(refused.value)
    assert "project test" in message and str(budgets) in message
    assert sum(len(_chat_requests(gateway, p)) for p in gateway.catalog.providers) == asked  # nothing was sent
    assert _gateway_rows(gateway, "spend-3").empty


def _catalog_copy(tmp_path: Path, change) -> Path:
    from control_plane.catalog.models import DEFAULT_MODELS

    raw = yaml.safe_load(DEFAULT_MODELS.read_text())
    change(raw["providers"])
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_slow_provider_times_out_into_the_fallback(gateway, tmp_path):
    path = _catalog_copy(tmp_path, lambda p: p["standin-anthropic"].update(timeout_s=1))
    slow = Gateway(gateway.storage, load_models(path))
    standin_hub.standin(slow.catalog.providers["standin-anthropic"], slow.storage.root, [Task(TASK)]).set_hang(5)
    run = slow.run(Task(TASK), ITEMS[:8], inputs=[], who=_who("slow"), policy=DataPolicy())
    assert run.route.primary.provider.name == "standin-anthropic"
    assert len(run.completed) == 8 and "standin-anthropic" not in {i.total_call().model.provider.name for i in run.items}


def test_a_model_is_measured_again_when_its_entry_changes_but_not_its_price(gateway, tmp_path):
    from model_gateway.evaluation import stored

    task, model_id = Task(TASK), "standin-openai/swift-1"
    assert stored(gateway.storage, task, gateway.catalog.model(model_id)) is not None
    cheaper = load_models(_catalog_copy(tmp_path / "price", lambda p: p["standin-openai"]["models"]["swift-1"].update(input=0.01)))
    assert stored(gateway.storage, task, cheaper.model(model_id)) is not None  # a price is applied fresh, never re-measured
    better = load_models(_catalog_copy(tmp_path / "quality", lambda p: p["standin-openai"]["models"]["swift-1"]["standin"].update(quality=0.99)))
    assert stored(gateway.storage, task, better.model(model_id)) is None  # another model behind the name: measured again
    run = Gateway(gateway.storage, better).run(task, ITEMS[:4], inputs=[], who=_who("remeasured"), policy=DataPolicy())
    assert [q.model for q in run.evaluations] == [model_id] and run.route.primary.id == model_id  # now the cheapest that meets the bar


def test_an_answer_that_fails_the_task_s_verification_is_asked_of_the_next_model(gateway, tmp_path):
    folder = tmp_path / "tell-parity-checked"
    shutil.copytree(TASK, folder)
    spec = yaml.safe_load((folder / "task.yaml").read_text())
    spec.update(quality_bar=0.6, verify="verify.py")  # the cheap model meets this bar; its wrong answers are caught
    (folder / "task.yaml").write_text(yaml.safe_dump(spec))
    (folder / "verify.py").write_text(
        "def verify(payload, answer):\n"
        "    right = 'even' if payload['n'] % 2 == 0 else 'odd'\n"
        "    return None if answer['parity'] == right else f\"{payload['n']} is {right}, not {answer['parity']}\"\n"
    )
    run = gateway.run(Task(folder), ITEMS, inputs=[], who=_who("verified"), policy=DataPolicy())
    assert run.route.primary.id == "standin-openai/swift-1"
    retried = [i for i in run.items if i.spent]
    assert retried, "the cheap model answered every item right: nothing was verified"
    assert len(run.completed) == len(ITEMS) and all(i.answer["parity"] == ("even" if i.payload["n"] % 2 == 0 else "odd") for i in run.items)
    assert all(i.total_call().model.id != "standin-openai/swift-1" for i in retried)
    rows = _gateway_rows(gateway, "verified").set_index("task_id")
    for item in retried:  # both calls are paid for, and booked on the item
        assert rows.loc[f"verified:{run.task.ref}:{item.id}", "tokens_in"] == sum(c.tokens_in for c in item.calls) > item.call.tokens_in


def test_a_batch_the_provider_will_not_take_is_answered_online(gateway, tmp_path):
    task = _batch_task(tmp_path, deadline_minutes=1)
    _standin(gateway, "standin-openai").set_outage(True)  # the batch model's provider is down: no upload, no batch
    run = gateway.run(task, ITEMS, inputs=[], who=_who("no-batch"), policy=DataPolicy())
    assert run.route.batch and run.batch is not None and run.batch.status.startswith("not sent")
    assert len(run.completed) == len(ITEMS) and not any(i.batch for i in run.items)
    assert "standin-openai" not in {i.total_call().model.provider.name for i in run.items}
