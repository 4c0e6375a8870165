"""Budgets over GPU hours and model tokens: the catalog, spending from a real ledger of GPU and
gateway rows, `enforce` at the limit, a GPU step refused before it is submitted, and alerts
delivered to a real webhook on loopback (once per budget and period, again after a failure)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import dagster as dg
import pytest

from control_plane.accounting.budgets import BudgetExceeded, Spend, _spent_in_sql, check, enforce, evaluate
from control_plane.accounting.ledger import LEDGER_URL_ENV, Ledger
from control_plane.accounting.records import AttemptRecord
from control_plane.catalog.budgets import DEFAULT_BUDGETS, BudgetCatalogError, load_budgets
from platform_location.defs.assets.budgets import BUDGETS
from platform_location.defs.budget_alerts import alert_round, alerts_due, budget_alerts
from shared_resources.resources import StorageResource
from testbed.counting_step import counting_spec, materialize_counting
from workload_runtime.storage import Storage

NOW = dt.datetime(2026, 3, 15, 12, tzinfo=dt.UTC)
APRIL = dt.datetime(2026, 4, 10, 12, tzinfo=dt.UTC)
BUDGETS_YAML = """
budgets:
  robotics: {scope: project, period: month, usd: 500}
  cell: {scope: project, period: month, usd: 500, gpu_hours: 100}
  lab-a-tokens: {scope: tenant, name: lab-a, period: month, tokens: 80000, warn_at: 0.5}
"""


def gpu_row(start: dt.datetime, *, hours: float, price: float, gpus: int = 2, project: str = "robotics", tenant: str = "robotics") -> AttemptRecord:
    return AttemptRecord.build(
        run_id=uuid.uuid4().hex[:8], step=f"{project}.train", asset=f"{project}/policy", partition=None, attempt=1, pool="aws-spot",
        provider="aws", region="eu", backend="slurm", purchasing="spot", price_per_gpu_hour=price, gpus=gpus, started=start,
        ended=start + dt.timedelta(hours=hours), productive_seconds=hours * 3600, outcome="succeeded", project=project, tenant=tenant,
    )


def gateway_row(
    start: dt.datetime, *, cost: float, tokens_in: int, tokens_out: int, project: str = "robotics", tenant: str = "robotics",
    model: str = "standin-openai/swift-1", task: str = "label-failure@v1", cached: int = 0, hits: int = 0, purchasing: str = "pay-as-you-go",
) -> AttemptRecord:
    """A row as the model gateway books it: one completed model task, no GPUs, no allocated time."""
    record = AttemptRecord.build(
        run_id=uuid.uuid4().hex[:8], step=task, asset=f"{project}/labels", partition=None, attempt=1, pool=model,
        provider=model.split("/", 1)[0], region="", backend="model-gateway", purchasing=purchasing, price_per_gpu_hour=0.0, gpus=0,
        started=start, ended=start, productive_seconds=0.0, outcome="succeeded", tokens_in=tokens_in, tokens_out=tokens_out,
        token_cost_usd=cost, project=project, tenant=tenant, task_id=uuid.uuid4().hex, completed_task=True,
    )
    return dataclasses.replace(record, model=model, tokens_cached=cached, cache_hits=hits)


@pytest.fixture
def ledger(home, monkeypatch) -> Ledger:
    monkeypatch.delenv(LEDGER_URL_ENV, raising=False)
    return Ledger.for_storage(Storage.at(str(home)))


@pytest.fixture
def budgets_file(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "budgets.yaml"
    path.write_text(BUDGETS_YAML)
    monkeypatch.setenv("SINEWGRID_BUDGETS", str(path))
    return path


def book_march(ledger: Ledger, at: dt.datetime = NOW) -> None:
    """robotics: $400 of GPU time (2 GPUs × 10 h × $20) and $12 of tokens → $412 of $500 (warn).
    lab-a: 90,000 tokens of 80,000 (over). cell: 10 GPU-h, $50 (ok). Last month's spending counts for nothing."""
    day = at.replace(day=2, hour=0)
    ledger.record(gpu_row(day, hours=10, price=20.0))
    ledger.record(gateway_row(day + dt.timedelta(hours=1), cost=12.0, tokens_in=40_000, tokens_out=8_000, cached=5_000, hits=2))
    ledger.record(gateway_row(day, cost=0.3, tokens_in=60_000, tokens_out=30_000, project="cell", tenant="lab-a"))
    ledger.record(gpu_row(day, hours=5, price=4.94, project="cell", tenant="lab-a"))
    ledger.record(gpu_row(day - dt.timedelta(days=5), hours=100, price=20.0))  # the month before


# The catalog ---------------------------------------------------------------------------------


def test_the_packaged_budgets_are_generous_and_sinewgrid_budgets_names_another(budgets_file, monkeypatch):
    monkeypatch.delenv("SINEWGRID_BUDGETS")
    packaged = load_budgets()
    assert packaged.file == str(DEFAULT_BUDGETS)
    assert {(b.scope.value, b.name) for b in packaged.values()} == {("project", "cell"), ("project", "robotics"), ("tenant", "lab-a"), ("tenant", "lab-b")}
    assert all(b.usd >= 500 and b.period.value == "month" and b.warn_at == 0.8 for b in packaged.values())
    monkeypatch.setenv("SINEWGRID_BUDGETS", str(budgets_file))
    mine = load_budgets()
    assert mine.file == str(budgets_file) and mine["lab-a-tokens"].name == "lab-a" and mine["lab-a-tokens"].limits == {"tokens": 80000.0}
    assert [b.id for b in mine.applying_to(project="cell", tenant="lab-a")] == ["cell", "lab-a-tokens"]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("budgets:\n  cell: {scope: team, usd: 5}\n", r"budget `cell`, field `scope`: .*; use `project` or `tenant`"),
        ("budgets:\n  cell: {scope: project, period: week, usd: 5}\n", r"budget `cell`, field `period`: .*use `month` \(the calendar month, UTC\) or `all`"),
        ("budgets:\n  cell: {scope: project}\n", r"budget `cell`: no limit: give at least one of `usd`, `gpu_hours`, `tokens`"),
        ("budgets:\n  cell: {scope: project, usd: -5}\n", r"budget `cell`, field `usd`: Input should be greater than or equal to 0; a number of dollars"),
        ("budgets:\n  cell: {scope: project, usd: 5, warn_at: 1.5}\n", r"field `warn_at`: .*a fraction of the limit above 0 and at most 1"),
        ("budgets:\n  cell: {scope: project, dollars: 5}\n", r"field `dollars`: unknown field; known: scope, name"),
        ("budgets:\n  a: {scope: project, name: cell, usd: 5}\n  b: {scope: project, name: cell, tokens: 9}\n",
         r"budgets `a` and `b` both cover project cell over period `month`; merge them into one"),
        ("budgets:\n  cell: {scope: project, usd: 5}\n  cell: {scope: project, usd: 6}\n", r"`cell`.* twice \(lines 2 and 3\)"),
        ("budget:\n  cell: {scope: project, usd: 5}\n", r"unknown top-level section `budget` \(expected: budgets\)"),
        ("budgets: [cell]\n", r"`budgets:` must map each budget's name to its settings"),
        ("budgets:\n  cell: {scope: project, usd: 5\n", r"not valid YAML at line \d+"),
    ],
)
def test_a_bad_budgets_file_is_named_with_the_entry_and_the_fix(tmp_path, text, said):
    path = tmp_path / "budgets.yaml"
    path.write_text(text)
    with pytest.raises(BudgetCatalogError, match=said) as caught:
        load_budgets(path)
    assert str(path) in str(caught.value)


def test_a_missing_budgets_file_says_what_one_holds(tmp_path):
    with pytest.raises(BudgetCatalogError, match=r"no such budgets file\. A budgets file is a YAML mapping with one section, `budgets:`"):
        load_budgets(tmp_path / "nowhere.yaml")


# Spending and status ---------------------------------------------------------------------------


def test_spending_and_status_from_gpu_and_gateway_rows(ledger, budgets_file):
    book_march(ledger)
    statuses = {s.budget.id: s for s in check(ledger, load_budgets(), now=NOW)}
    robotics, cell, lab_a = statuses["robotics"], statuses["cell"], statuses["lab-a-tokens"]
    assert robotics.spent == Spend(usd=pytest.approx(412.0), gpu_hours=pytest.approx(20.0), tokens=48_000)
    assert robotics.status == "warn" and robotics.key == "robotics@2026-03"
    assert robotics.message == "project robotics: $412.00 of $500.00 this month (82%), warning at 80%"
    assert cell.status == "ok" and cell.spent.gpu_hours == pytest.approx(10.0) and cell.spent.usd == pytest.approx(49.7)
    assert cell.message == "project cell: $49.70 of $500.00 (10%), 10.00 GPU-h of 100.00 GPU-h (10%) this month, warning at 80%"
    assert lab_a.spent.tokens == 90_000 and lab_a.status == "over"
    assert lab_a.message == "tenant lab-a: 90,000 tokens of 80,000 tokens this month (112%), over its limit"
    # Next month starts afresh.
    assert {s.budget.id: s.status for s in check(ledger, load_budgets(), now=APRIL)} == {"robotics": "ok", "cell": "ok", "lab-a-tokens": "ok"}


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_enforce_reads_the_same_spending_as_the_reports_in_one_query(request, tmp_path, budgets_file, engine):
    if engine == "sqlite":
        ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    else:
        ledger = Ledger(request.getfixturevalue("postgres").create_database(f"budgets_{uuid.uuid4().hex[:10]}"))
    book_march(ledger)
    budgets = list(load_budgets().values())
    from_frame = [s.spent for s in evaluate(ledger.frame(), budgets, NOW)]
    from_sql = _spent_in_sql(ledger, budgets, NOW)
    for frame_spend, sql_spend in zip(from_frame, from_sql, strict=True):
        assert dataclasses.astuple(sql_spend) == pytest.approx(dataclasses.astuple(frame_spend))


def test_enforce_refuses_at_the_limit_and_not_below(ledger, tmp_path):
    path = tmp_path / "budgets.yaml"
    path.write_text("budgets:\n  grasp: {scope: project, usd: 100}\n")
    budgets = load_budgets(path)
    ledger.record(gateway_row(NOW.replace(day=3), cost=99.5, tokens_in=10, tokens_out=10, project="grasp"))
    (status,) = enforce(ledger, project="grasp", tenant="robotics", budgets=budgets, now=NOW)
    assert status.status == "warn"
    enforce(ledger, project="grasp", adding=Spend(usd=0.5), budgets=budgets, now=NOW)  # reaching the limit is allowed
    with pytest.raises(BudgetExceeded, match=r"the new work \(about \$0\.75\) would pass it"):
        enforce(ledger, project="grasp", adding=Spend(usd=0.75), budgets=budgets, now=NOW)
    ledger.record(gateway_row(NOW.replace(day=4), cost=0.5, tokens_in=10, tokens_out=10, project="grasp"))
    with pytest.raises(BudgetExceeded) as refused:
        enforce(ledger, project="grasp", tenant="robotics", budgets=budgets, now=NOW)
    message = str(refused.value)
    assert "new work refused for project grasp" in message
    assert "budget `grasp` of project grasp: $100.00 of $100.00 this month (100%), at its limit" in message
    assert f"raise `usd` of budget `grasp` in {path}" in message and "SINEWGRID_BUDGETS" in message
    assert "wait for next month (the budget starts again on 2026-04-01 00:00 UTC)" in message
    assert refused.value.metadata()["spent_usd"] == pytest.approx(100.0) and refused.value.metadata()["limit_usd"] == 100.0
    assert enforce(ledger, project="grasp", budgets=budgets, now=APRIL)[0].status == "ok"  # a new month


def test_enforce_applies_a_tenants_budget_and_reads_nothing_without_one(ledger, budgets_file):
    book_march(ledger)
    with pytest.raises(BudgetExceeded, match=r"tenant lab-a: 90,000 tokens of 80,000 tokens this month \(112%\), past its limit"):
        enforce(ledger, project="some-project", tenant="lab-a", now=NOW)
    nowhere = Ledger(f"sqlite:///{budgets_file.parent / 'no-such-folder' / 'ledger.db'}")  # reading it would fail
    assert enforce(nowhere, project="no-budget", tenant="nobody", now=NOW) == []


def test_a_gpu_step_of_a_project_over_its_budget_is_refused_before_it_is_submitted(home, tmp_path, monkeypatch):
    monkeypatch.delenv(LEDGER_URL_ENV, raising=False)
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("budgets:\n  test: {scope: project, period: all, usd: 1}\n")
    monkeypatch.setenv("SINEWGRID_BUDGETS", str(budgets))
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        "pools:\n  only:\n    provider: local\n    region: local\n    backend: local\n    purchasing: on_demand\n"
        "    accelerator: local\n    gpus_per_node: 1\n    price_per_gpu_hour: 1.0\n    qualify: false\n"
    )
    ledger = Ledger.for_storage(Storage.at(str(home)))
    ledger.record(gateway_row(dt.datetime(2026, 1, 5, tzinfo=dt.UTC), cost=1.5, tokens_in=100, tokens_out=100, project="test", tenant="test"))
    spec = counting_spec()  # tenant "test": its project (its lane) is "test"
    with pytest.raises(dg.Failure, match=r"test\.counting was not started\. Budget exceeded, new work refused for project test") as refused:
        materialize_counting(home, pools, spec, instance=dg.DagsterInstance.ephemeral())
    assert "raise `usd` of budget `test` in " + str(budgets) in refused.value.description
    assert refused.value.metadata["budget"].value == "test"
    assert len(ledger.frame()) == 1  # nothing booked: no attempt ran
    assert not (home / "logs").exists() and not (home / "checkpoints").exists()  # nothing launched, no workload log
    budgets.write_text("budgets:\n  test: {scope: project, period: all, usd: 10}\n")  # raising the limit lets it run
    assert materialize_counting(home, pools, spec, instance=dg.DagsterInstance.ephemeral()).success
    assert list(ledger.frame()["backend"]) == ["model-gateway", "local"]


# Alerts ---------------------------------------------------------------------------------------


class Webhook:
    """A real HTTP server on loopback that records each POSTed alert; `fail` answers the next n with 500."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        self.refused = 0
        self.fail = 0
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if hook.fail:
                    hook.fail -= 1
                    hook.refused += 1
                    self.send_response(500)
                else:
                    hook.received.append(body)
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/T0KEN"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def webhook():
    hook = Webhook()
    yield hook
    hook.close()


def test_alerts_reach_the_webhook_once_per_budget_and_period_and_after_a_failure(ledger, budgets_file, webhook):
    book_march(ledger)
    march = check(ledger, load_budgets(), now=NOW)
    assert {s.budget.id for s in alerts_due(march, {})} == {"robotics", "lab-a-tokens"}
    first = alert_round(march, None, webhook.url)
    assert {(b["budget"], b["status"], b["period_key"]) for b in webhook.received} == {("robotics", "warn", "2026-03"), ("lab-a-tokens", "over", "2026-03")}
    robotics = next(b for b in webhook.received if b["budget"] == "robotics")
    assert robotics["text"] == "Sinewgrid budget warning: project robotics: $412.00 of $500.00 this month (82%), warning at 80%"
    assert robotics["spent"]["usd"] == pytest.approx(412.0) and robotics["limits"] == {"usd": 500.0}
    again = alert_round(check(ledger, load_budgets(), now=NOW), first.cursor, webhook.url)
    assert len(webhook.received) == 2 and not again.shown and not again.sent  # said once per budget and period

    ledger.record(gateway_row(NOW.replace(day=5), cost=100.0, tokens_in=1, tokens_out=1))  # robotics passes its limit
    over = alert_round(check(ledger, load_budgets(), now=NOW), again.cursor, webhook.url)
    assert [(s.budget.id, s.status) for s in over.sent] == [("robotics", "over")] and webhook.received[-1]["text"].startswith("Sinewgrid OVER BUDGET")

    book_march(ledger, at=APRIL)  # April spends as March did: a new period, alerted afresh
    webhook.fail = 2
    failed = alert_round(check(ledger, load_budgets(), now=APRIL), over.cursor, webhook.url)
    assert webhook.refused == 2 and len(failed.failed) == 2 and not failed.sent and len(webhook.received) == 3
    assert "HTTPError" in failed.failed[0][1] and len(failed.shown) == 2
    retried = alert_round(check(ledger, load_budgets(), now=APRIL), failed.cursor, webhook.url)
    assert {(b["budget"], b["period_key"]) for b in webhook.received[3:]} == {("robotics", "2026-04"), ("lab-a-tokens", "2026-04")}
    assert not retried.shown and not retried.failed  # shown in the UI once; delivered on the retry
    assert set(json.loads(retried.cursor)["posted"]) == {"robotics@2026-04", "lab-a-tokens@2026-04"}  # March is forgotten
    alert_round(check(ledger, load_budgets(), now=APRIL), retried.cursor, webhook.url)
    assert len(webhook.received) == 5


def test_an_unreachable_webhook_is_a_failure_to_retry_not_an_error(ledger, budgets_file):
    book_march(ledger)
    tick = alert_round(check(ledger, load_budgets(), now=NOW), None, "http://127.0.0.1:9/never")
    assert len(tick.failed) == 2 and not tick.sent and json.loads(tick.cursor)["posted"] == {}


def test_the_sensor_observes_platform_budgets_and_calls_the_webhook(home, ledger, tmp_path, monkeypatch, webhook, instance):
    budgets = tmp_path / "all-time.yaml"
    budgets.write_text("budgets:\n  robotics: {scope: project, period: all, usd: 10}\n  cell: {scope: project, period: all, usd: 10}\n")
    monkeypatch.setenv("SINEWGRID_BUDGETS", str(budgets))
    monkeypatch.setenv("SINEWGRID_ALERT_WEBHOOK", webhook.url)
    ledger.record(gateway_row(dt.datetime(2026, 1, 5, tzinfo=dt.UTC), cost=9.0, tokens_in=10, tokens_out=10))
    context = dg.build_sensor_context(instance=instance, resources={"storage": StorageResource(root=str(home))})
    result = budget_alerts(context)
    (observation,) = result.asset_events
    assert observation.asset_key == BUDGETS
    assert "project robotics: $9.00 of $10.00 in all (90%), warning at 80%" in observation.metadata["alerts"].value
    assert "| `cell` | project cell | all | $0.00 | $10.00 | 0% | 80% | ok |" in observation.metadata["budgets"].value
    assert observation.metadata["budgets_warn"].value == 1 and observation.metadata["webhook"].value.startswith("1 delivered, 0 to retry")
    assert [b["budget"] for b in webhook.received] == ["robotics"]
    quiet = budget_alerts(dg.build_sensor_context(instance=instance, cursor=result.cursor, resources={"storage": StorageResource(root=str(home))}))
    assert not quiet.asset_events and "2 budget(s): 1 ok, 1 warn, 0 over; nothing new to alert" in quiet.skip_reason.skip_message
    assert len(webhook.received) == 1


def test_the_platform_budgets_asset_shows_every_budget(home, ledger, budgets_file, instance):
    from platform_location.defs.assets.budgets import budgets_report
    from shared_resources.resources import platform_resources

    result = dg.materialize([budgets_report], resources=platform_resources(root=str(home)), instance=instance)
    md = result.asset_materializations_for_node("platform__budgets")[0].metadata
    assert md["budgets_ok"].value == 3 and "| `lab-a-tokens` | tenant lab-a |" in md["budgets"].value
