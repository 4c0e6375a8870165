"""Reports on a synthetic ledger whose goodput and cost were worked out by hand (tests/synthetic_ledger.py)."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import io
import json
import re
import subprocess
from pathlib import Path

import dagster as dg
import matplotlib.image
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from control_plane.accounting import reports
from control_plane.accounting.ledger import LEDGER_URL_ENV, Ledger
from control_plane.accounting.records import AttemptRecord
from shared_resources.resources import platform_resources
from sinewgrid.cli import app
from tests.synthetic_ledger import (
    DAY1,
    DAY2,
    EXPECTED,
    EXPECTED_BREAKDOWN,
    EXPECTED_CHECKPOINT_GPU_HOURS,
    EXPECTED_CHECKPOINT_SECONDS,
    EXPECTED_GPU_HOURS,
    EXPECTED_LOST_GPU_HOURS,
    EXPECTED_LOST_SECONDS,
    EXPECTED_PRODUCTIVE_GPU_HOURS,
    TOTAL_COST,
    synthetic_records,
)
from workload_runtime.storage import Storage

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def booked(home, monkeypatch) -> Ledger:
    """The synthetic ledger, booked in the SQLite ledger of the test's storage root."""
    monkeypatch.delenv(LEDGER_URL_ENV, raising=False)
    ledger = Ledger.for_storage(Storage.at(str(home)))
    for record in synthetic_records():
        ledger.record(record)
    return ledger


@pytest.fixture
def frame(booked):
    return booked.frame()


@pytest.mark.parametrize("by", ["lane", "provider", "project", "run"])
def test_goodput_and_cost_per_group_match_the_hand_figures(frame, by):
    table = reports.summary(frame, by).set_index(by)
    assert set(table.index) == set(EXPECTED[by])
    for group, (cost, goodput, per_task) in EXPECTED[by].items():
        assert table.loc[group, "cost_usd"] == pytest.approx(cost), group
        assert table.loc[group, "goodput"] == pytest.approx(goodput), group
        assert table.loc[group, "cost_per_completed_task"] == pytest.approx(per_task), group
    assert list(table["cost_usd"]) == sorted(table["cost_usd"], reverse=True)  # costliest first


def test_totals_and_lost_time_by_reason(frame):
    totals = reports.totals(frame)
    assert totals["cost_usd"] == pytest.approx(TOTAL_COST)
    assert totals["gpu_hours"] == pytest.approx(EXPECTED_GPU_HOURS)
    assert totals["goodput"] == pytest.approx(EXPECTED_PRODUCTIVE_GPU_HOURS / EXPECTED_GPU_HOURS)
    assert totals["completed_tasks"] == 3
    assert totals["cost_per_completed_task"] == pytest.approx(TOTAL_COST / 3)
    for reason, hours in EXPECTED_LOST_GPU_HOURS.items():
        assert totals[f"lost_{reason}_gpu_hours"] == pytest.approx(hours), reason
        assert frame[f"lost_{reason}_seconds"].sum() == pytest.approx(EXPECTED_LOST_SECONDS[reason]), reason
    assert frame["checkpoint_seconds"].sum() == pytest.approx(EXPECTED_CHECKPOINT_SECONDS)
    lane = reports.summary(frame, "lane")
    parts = ["productive_gpu_hours", "checkpoint_gpu_hours", *(f"lost_{r}_gpu_hours" for r in EXPECTED_LOST_GPU_HOURS)]
    assert lane[parts].sum(axis=1).to_numpy() == pytest.approx(lane["gpu_hours"].to_numpy())  # the parts add up
    assert lane["checkpoint_gpu_hours"].sum() == pytest.approx(EXPECTED_CHECKPOINT_GPU_HOURS)


def test_cost_per_completed_task_counts_every_attempt_a_task_took(frame):
    assert reports.cost_per_completed_task(frame) == pytest.approx(TOTAL_COST / 3)
    per_lane = reports.cost_per_completed_task(frame, "lane")
    assert per_lane["cell"] == pytest.approx(4.55)  # $9.10 spent, preempted and refused attempts included, for 2 tasks


def test_a_group_without_completed_tasks_has_no_cost_per_task(frame):
    failed_only = frame[frame["outcome"] == "failed"]
    table = reports.summary(failed_only, "lane")
    assert table.loc[0, "completed_tasks"] == 0 and table["cost_per_completed_task"].isna().all()


def test_token_costs_join_gpu_costs(booked):
    start = DAY2 + dt.timedelta(hours=5)
    booked.record(
        AttemptRecord.build(
            run_id="r4", step="robotics.labeller", asset="robotics/labeller", partition=None, attempt=1, pool="api",
            provider="model-api", region="us", backend="local", purchasing="on_demand", price_per_gpu_hour=0.0, gpus=0,
            started=start, ended=start + dt.timedelta(minutes=1), productive_seconds=60, outcome="succeeded",
            tokens_in=10_000, tokens_out=2_000, token_cost_usd=0.9, lane="robotics", project="grasp",
        )
    )
    table = reports.summary(booked.frame(), "provider").set_index("provider")
    assert table.loc["model-api", "token_cost_usd"] == pytest.approx(0.9)
    assert table.loc["model-api", "cost_usd"] == pytest.approx(0.9)
    assert reports.totals(booked.frame())["cost_usd"] == pytest.approx(TOTAL_COST + 0.9)


def test_cost_breakdown_and_goodput_over_time(frame):
    breakdown = reports.cost_breakdown(frame)
    assert {(p, m): breakdown.loc[p, m] for p in breakdown.index for m in breakdown.columns} == pytest.approx(EXPECTED_BREAKDOWN)
    daily = reports.goodput_over_time(frame)
    assert daily.loc[DAY1.replace(tzinfo=None), "cell"] == pytest.approx(180 / 276)
    assert daily.loc[DAY2.replace(tzinfo=None), "robotics"] == pytest.approx(0.6)


def test_an_unknown_grouping_is_named():
    with pytest.raises(ValueError, match="cannot report by 'colour'; choose one of run, project, provider, lane"):
        reports.summary(pd.DataFrame(), "colour")


def _assert_png(data: bytes) -> None:
    assert data[:8] == PNG_MAGIC
    image = matplotlib.image.imread(io.BytesIO(data), format="png")
    assert image.shape[0] > 100 and image.shape[1] > 100
    assert image.std() > 0  # something was drawn


@pytest.mark.parametrize("draw", [reports.cost_breakdown_png, reports.goodput_over_time_png])
def test_figures_are_valid_pngs_even_for_an_empty_ledger(frame, draw):
    _assert_png(draw(frame))
    _assert_png(draw(frame.head(0)))


def test_the_platform_location_loads():
    from platform_location.definitions import defs

    assert set(defs.resolve_all_asset_keys()) == {
        dg.AssetKey(["platform", name])
        for name in ("ledger_summary", "budgets", "capacity_plan", "failure_drill", "preemption_trace", "dataset_catalog", "training_runs", "checkpoint_retention", "gpu_queues")
    }
    assert defs.resolve_job_def("ledger_report_job") is not None
    assert defs.resolve_schedule_def("gpu_queues_every_15_minutes").default_status == dg.DefaultScheduleStatus.STOPPED
    assert defs.resolve_sensor_def("budget_alerts").minimum_interval_seconds == 60
    assert defs.resolve_schedule_def("daily_ledger_report").cron_schedule == "0 6 * * *"


def test_the_ledger_summary_asset_materializes_with_tables_and_plots(home, booked, instance):
    from platform_location.defs.assets.ledger_reports import ledger_summary

    result = dg.materialize([ledger_summary], resources=platform_resources(root=str(home)), instance=instance)
    assert result.success
    md = result.asset_materializations_for_node("platform__ledger_summary")[0].metadata
    assert md["cost_usd"].value == pytest.approx(TOTAL_COST)
    assert md["completed_tasks"].value == 3
    assert md["cost_per_completed_task_usd"].value == pytest.approx(TOTAL_COST / 3, abs=1e-4)
    assert "| cell | 4 |" in md["by_lane"].value and "$9.10" in md["by_lane"].value and "$4.55" in md["by_lane"].value
    assert "$2.05" in md["by_provider"].value and "| grasp |" in md["by_project"].value
    assert "| cell | 4 |" in md["by_tenant"].value  # the platform's own steps: their tenant is their lane
    assert md["gpu_cost_usd"].value == pytest.approx(TOTAL_COST) and md["token_cost_usd"].value == 0.0 and md["tokens_in"].value == 0
    assert "tokens_in | tokens_out | tokens_cached | cache_hits" in md["by_lane"].value and "| none (GPU steps) |" in md["by_model"].value
    assert md["by_task"].value.startswith("| task |")  # a GPU step or a model task per row
    for name in ("cost_breakdown", "goodput_over_time"):
        embedded = re.fullmatch(r"!\[[^\]]+\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", md[name].value)
        assert embedded, md[name].value[:80]
        _assert_png(base64.b64decode(embedded.group(1)))
        path = Path(md[f"{name}_png"].value)
        assert path == home / "reports" / "ledger" / f"{name}.png"
        _assert_png(path.read_bytes())


def _sinewgrid(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`sinewgrid ARGS` on the storage root `home`, run in this process as its console script runs it."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {"SINEWGRID_HOME": str(home), "DAGSTER_HOME": str(home / "dagster"), **(env or {})}.items():
            patch.setenv(name, value)
        patch.delenv(LEDGER_URL_ENV, raising=False)
        result = CliRunner().invoke(app, list(args))
    return subprocess.CompletedProcess(["sinewgrid", *args], result.exit_code, result.stdout, result.stderr)


def test_sinewgrid_report_prints_the_tables_and_json(home, booked):
    done = _sinewgrid(home, "report", "--by", "provider", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    payload = json.loads(done.stdout)
    rows = {row["provider"]: row for row in payload["rows"]}
    assert rows["gcp"]["cost_per_completed_task"] == pytest.approx(2.05)
    assert payload["totals"]["cost_usd"] == pytest.approx(TOTAL_COST)
    table = _sinewgrid(home, "report", "--by", "lane")
    assert table.returncode == 0, table.stderr[-2000:]
    assert "robotics" in table.stdout and "$9.10" in table.stdout and "$12.10" in table.stdout
    wrong = _sinewgrid(home, "report", "--by", "colour")
    assert wrong.returncode != 0 and "run, project, provider, lane" in wrong.stdout + wrong.stderr


# Tokens beside GPU-hours, and committing to a model provider ---------------------------------


def _gateway(start: dt.datetime, cost: float, *, provider: str = "standin-openai", model: str = "swift-1", task: str = "label-failure@v1",
             tokens: tuple[int, int, int, int] = (0, 0, 0, 0), tenant: str = "robotics", purchasing: str = "pay-as-you-go") -> AttemptRecord:
    """A row as the model gateway books it: one completed task, no GPUs (tokens: in, out, cached, cache hits)."""
    record = AttemptRecord.build(
        run_id=f"g-{start:%m%d%H%M}-{provider}-{cost}", step=task, asset="robotics/labels", partition=None, attempt=1, pool=f"{provider}/{model}",
        provider=provider, region="", backend="model-gateway", purchasing=purchasing, price_per_gpu_hour=0.0, gpus=0, started=start,
        ended=start, productive_seconds=0.0, outcome="succeeded", tokens_in=tokens[0], tokens_out=tokens[1], token_cost_usd=cost,
        lane="robotics", project="grasp", tenant=tenant,
    )
    return dataclasses.replace(record, model=f"{provider}/{model}", tokens_cached=tokens[2], cache_hits=tokens[3])


def test_tokens_sit_beside_gpu_hours_by_task_model_and_tenant(booked):
    booked.record(_gateway(DAY2 + dt.timedelta(hours=6), 0.25, tokens=(10_000, 2_000, 4_000, 1)))
    booked.record(_gateway(DAY2 + dt.timedelta(hours=7), 0.75, model="sage-1", task="summarise-episode@v2", tokens=(20_000, 5_000, 0, 0)))
    frame = booked.frame()
    by_task = reports.summary(frame, "task").set_index("task")
    assert by_task.loc["label-failure@v1", ["tokens_in", "tokens_out", "tokens_cached", "cache_hits"]].tolist() == [10_000, 2_000, 4_000, 1]
    assert by_task.loc["label-failure@v1", "gpu_hours"] == 0 and by_task.loc["label-failure@v1", "token_cost_usd"] == pytest.approx(0.25)
    assert by_task.loc["cell.pretrain", "tokens_in"] == 0 and by_task.loc["cell.pretrain", "gpu_hours"] == pytest.approx(4.0)  # 2 h × 2 GPUs
    by_model = reports.summary(frame, "model").set_index("model")
    assert by_model.loc["standin-openai/sage-1", "tokens_out"] == 5_000
    assert by_model.loc["none (GPU steps)", "gpu_hours"] == pytest.approx(EXPECTED_GPU_HOURS) and by_model.loc["none (GPU steps)", "tokens_in"] == 0
    by_tenant = reports.summary(frame, "tenant").set_index("tenant")
    assert by_tenant.loc["robotics", "tokens_in"] == 30_000 and by_tenant.loc["robotics", "gpu_hours"] == pytest.approx(6.0)  # 0.5 h + 1 h × 4 GPUs
    markdown = reports.summary_markdown(reports.summary(frame, "tenant"))
    assert "| gpu_hours | productive_gpu_hours |" in markdown and "| 30,000 | 7,000 | 4,000 | 1 |" in markdown
    totals = reports.totals(frame)
    assert (totals["tokens_in"], totals["tokens_out"], totals["token_cost_usd"]) == (30_000, 7_000, pytest.approx(1.0))


def test_commit_recommendation_commits_at_the_discount_quantile_of_daily_spend(booked):
    # 30 days of demand: $1 … $30, in a shuffled order; a batch task and GPU steps are not pay-as-you-go demand.
    rng = np.random.default_rng(3)
    start = dt.datetime(2025, 6, 1, tzinfo=dt.UTC)
    for day, dollars in enumerate(rng.permutation(np.arange(1, 31))):
        at = start + dt.timedelta(days=day, hours=9)
        booked.record(_gateway(at, float(dollars) / 2))
        booked.record(_gateway(at + dt.timedelta(hours=1), float(dollars) / 2, tokens=(1, 1, 0, 0)))
    booked.record(_gateway(start + dt.timedelta(days=3), 1000.0, purchasing="batch"))
    # Another provider, first used three days before the end: a day without tasks spent $0.
    for day, dollars in ((27, 4.0), (29, 2.0)):
        booked.record(_gateway(start + dt.timedelta(days=day), dollars, provider="standin-anthropic", model="brisk-2"))
    table = reports.commit_recommendation(booked.frame(), {"standin-openai": 0.2}, default_discount=0.5).set_index("provider")
    openai = table.loc["standin-openai"]
    assert openai["days"] == 30 and openai["mean_daily_usd"] == pytest.approx(15.5) and not openai["provisional"]
    assert openai["commit_per_day_usd"] == 6.0  # 6 of 30 days (20%) spend $6 or less
    demand = np.arange(1, 31, dtype=float)
    cost = lambda c: 0.8 * c + np.maximum(demand - c, 0).mean()  # noqa: E731
    assert all(cost(6.0) <= cost(c) for c in np.arange(0, 31, 0.25))  # no other commitment is cheaper
    assert openai["expected_saving_per_month_usd"] == pytest.approx((15.5 - cost(6.0)) * 30)  # $0.70 a day
    assert openai["p90_daily_usd"] == pytest.approx(np.quantile(demand, 0.9))
    anthropic = table.loc["standin-anthropic"]
    assert anthropic["days"] == 3 and anthropic["provisional"] and anthropic["discount"] == 0.5
    assert anthropic["commit_per_day_usd"] == 2.0 and anthropic["mean_daily_usd"] == pytest.approx(2.0)  # $4, $0, $2
    assert reports.commit_recommendation(booked.frame().head(0), {}).empty


def test_sinewgrid_report_shows_tokens_budgets_and_the_commitment(home, booked, tmp_path):
    booked.record(_gateway(DAY2 + dt.timedelta(hours=6), 0.25, tokens=(12_000, 3_000, 4_000, 2)))
    by_model = _sinewgrid(home, "report", "--by", "model")
    assert by_model.returncode == 0, by_model.stderr[-2000:]
    assert "tokens in/out" in by_model.stdout and "12.0k/3,000" in by_model.stdout and "4,000/2" in by_model.stdout
    assert "standin-openai/swift-1" in by_model.stdout and "none (GPU steps)" in by_model.stdout
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("budgets:\n  grasp: {scope: project, period: all, usd: 1, tokens: 1000000}\n")
    done = _sinewgrid(home, "report", "--budgets", "--commit", "--json", env={"SINEWGRID_BUDGETS": str(budgets)})
    assert done.returncode == 0, done.stderr[-2000:]
    payload = json.loads(done.stdout)
    (grasp,) = payload["budgets"]
    assert grasp["status"] == "over" and grasp["spent"]["usd"] == pytest.approx(3.25) and grasp["spent"]["tokens"] == 15_000
    (openai,) = payload["commit"]
    assert openai["provider"] == "standin-openai" and openai["days"] == 1 and openai["provisional"]
    shown = _sinewgrid(home, "report", "--budgets", "--commit", env={"SINEWGRID_BUDGETS": str(budgets)})
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "project grasp: $3.25 of $1.00 (325%), 15,000 tokens of 1,000,000 tokens (2%) in all, over its limit" in shown.stdout
    assert "provisional: 1 day(s)" in shown.stdout and "commit_discount" in shown.stdout


def test_the_demo_summary_tables_put_token_cost_beside_gpu_cost(home, booked):
    from sinewgrid.summary import ledger_by_step, ledger_by_tenant, model_tasks

    booked.record(_gateway(DAY2 + dt.timedelta(hours=6), 0.25, tokens=(12_000, 3_000, 0, 0)))
    tenants = ledger_by_tenant(Storage.at(str(home))).set_index("tenant")
    assert tenants.loc["robotics", ["tokens", "gpu_cost_usd", "token_cost_usd", "cost_usd"]].tolist() == pytest.approx([15_000, 3.0, 0.25, 3.25])
    assert tenants.loc["cell", "tokens"] == 0 and tenants.loc["cell", "token_cost_usd"] == 0.0
    steps = ledger_by_step(Storage.at(str(home))).set_index("step")
    assert "label-failure@v1" not in steps.index and (steps["gpu_hours"] > 0).all()  # GPU steps only: model tasks have their own table
    tasks = model_tasks(Storage.at(str(home))).set_index("step")
    assert tasks.loc["label-failure@v1", ["tokens_in", "tokens_out", "token_cost_usd"]].tolist() == pytest.approx([12_000, 3_000, 0.25])


def test_the_demo_summary_figures_goodput_and_cost_as_the_reports_do(home, booked):
    """`sinewgrid summary` reads its goodput and cost from `reports.summary`: weighed by GPUs. A
    step that ran on one GPU and on four shows it: unweighted it would be (30 + 15) / (30 + 60) = 50%."""
    from rich.console import Console

    from sinewgrid.cli_summary import print_gpu_steps
    from sinewgrid.summary import ledger_by_step, ledger_by_tenant

    start = DAY2 + dt.timedelta(hours=8)
    booked.record(AttemptRecord.build(  # beside r2's 30 minutes, all productive, on one GPU of the same pool
        run_id="r4", step="cell.finetune", asset="cell/finetune", partition=None, attempt=1, pool="gcp-on_demand", provider="gcp",
        region="eu", backend="slurm", purchasing="on_demand", price_per_gpu_hour=2.0, gpus=4, started=start,
        ended=start + dt.timedelta(minutes=60), productive_seconds=15 * 60, outcome="failed", exit_code=1, lane="cell", project="screen",
    ))
    frame = booked.frame()
    storage = Storage.at(str(home))
    steps = ledger_by_step(storage).set_index(["step", "pool", "purchasing"])
    finetune = steps.loc[("cell.finetune", "gcp-on_demand", "on_demand")]
    assert finetune["goodput"] == pytest.approx((30 * 1 + 15 * 4) / (30 * 1 + 60 * 4))
    rows = frame[(frame["step"] == "cell.finetune") & (frame["pool"] == "gcp-on_demand")]
    assert finetune[["goodput", "gpu_hours", "cost_usd"]].tolist() == pytest.approx([reports.totals(rows)[k] for k in ("goodput", "gpu_hours", "cost_usd")])
    assert steps["cost_usd"].sum() == pytest.approx(reports.totals(frame)["cost_usd"])
    tenants = ledger_by_tenant(storage).set_index("tenant")
    expected = reports.summary(frame, "tenant").set_index("tenant")
    assert sorted(tenants.index) == ["cell", "robotics"]  # rows without a tenant count as their lane's, here and in the reports
    for tenant in tenants.index:
        assert tenants.loc[tenant, ["goodput", "gpu_hours", "cost_usd"]].tolist() == pytest.approx(expected.loc[tenant, ["goodput", "gpu_hours", "cost_usd"]].tolist())
        assert tenants.loc[tenant, "goodput"] == pytest.approx(reports.totals(frame[frame["lane"] == tenant])["goodput"])
    console = Console(record=True, width=200)
    print_gpu_steps(console, storage)
    (line,) = [line for line in console.export_text().splitlines() if "cell.finetune" in line and "gcp-on_demand" in line]
    assert "33%" in line and "50%" not in line
