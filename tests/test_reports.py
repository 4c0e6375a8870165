"""Reports on a synthetic ledger whose goodput and cost were worked out by hand (tests/synthetic_ledger.py)."""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import dagster as dg
import matplotlib.image
import pandas as pd
import pytest

from shared_resources.accounting import reports
from shared_resources.accounting.ledger import LEDGER_URL_ENV, Ledger
from shared_resources.accounting.records import AttemptRecord
from shared_resources.resources import platform_resources
from shared_resources.runtime.storage import Storage
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

REPO = Path(__file__).resolve().parent.parent
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
        dg.AssetKey(["platform", name]) for name in ("ledger_summary", "capacity_plan", "failure_drill", "preemption_trace", "dataset_catalog", "training_runs", "checkpoint_retention")
    }
    assert defs.resolve_job_def("ledger_report_job") is not None
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
    for name in ("cost_breakdown", "goodput_over_time"):
        embedded = re.fullmatch(r"!\[[^\]]+\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", md[name].value)
        assert embedded, md[name].value[:80]
        _assert_png(base64.b64decode(embedded.group(1)))
        path = Path(md[f"{name}_png"].value)
        assert path == home / "reports" / "ledger" / f"{name}.png"
        _assert_png(path.read_bytes())


def _sinewgrid(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SINEWGRID_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}
    env.pop(LEDGER_URL_ENV, None)
    return subprocess.run([sys.executable, "-m", "sinewgrid.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


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
