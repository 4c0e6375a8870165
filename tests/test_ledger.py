"""The ledger books attempts in SQLite and in a real PostgreSQL alike, and keeps v1 callers working."""

from __future__ import annotations

import datetime as dt
import multiprocessing
import uuid

import pandas as pd
import pytest
import sqlalchemy as sa

from control_plane.accounting import ledger as ledger_module
from control_plane.accounting.ledger import (
    LEDGER_URL_ENV,
    Ledger,
    LedgerConfigError,
    read_ledger,
    record_attempt,
)
from control_plane.accounting.records import (
    AttemptRecord,
    ledger_markdown,
    split_time,
)
from control_plane.catalog.pools import load_pools
from tests.synthetic_ledger import DAY1, DAY2, synthetic_records
from workload_runtime.storage import Storage

T0 = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger(request, tmp_path) -> Ledger:
    if request.param == "sqlite":
        return Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    server = request.getfixturevalue("postgres")  # the session's server (tests/fixtures/postgres.py), a database per test
    return Ledger(server.create_database(f"ledger_{uuid.uuid4().hex[:10]}"))


def _record(run_id="run-1", attempt=1, **values) -> AttemptRecord:
    pool = load_pools(None)["cell-burst"]
    defaults = dict(
        run_id=run_id, step="cell.finetuned_model", asset="cell/finetuned_model", partition="drop-7", attempt=attempt,
        gpus=2, started=T0, ended=T0 + dt.timedelta(minutes=30), productive_seconds=1200.0, outcome="preempted", exit_code=75,
    )
    return AttemptRecord.for_attempt(pool=pool, **{**defaults, **values})


def test_a_record_round_trips_with_its_derived_figures(ledger):
    record = _record(checkpoint_seconds=60, queue_seconds=120)
    assert ledger.record(record) is True
    frame = ledger.frame()
    assert len(frame) == 1
    row = frame.iloc[0]
    assert (row.run_id, row.pool, row.purchasing, row.outcome, row.exit_code) == ("run-1", "cell-burst", "spot", "preempted", 75)
    assert (row.lane, row.project, row.partition) == ("cell", "cell", "drop-7")  # lane from the asset key, project from the lane
    assert row.started_at == pd.Timestamp(T0)
    assert row.allocated_seconds == row.wall_seconds == 1800.0
    assert (row.productive_seconds, row.checkpoint_seconds, row.queue_seconds) == (1200.0, 60.0, 120.0)
    # 1800 = 1200 productive + 120 queueing + 60 checkpoint + 420 lost to the preemption
    assert (row.lost_queueing_seconds, row.lost_preemption_seconds, row.lost_failure_seconds, row.lost_rework_seconds) == (120.0, 420.0, 0.0, 0.0)
    assert row.lost_seconds == 540.0
    assert row.gpu_hours == pytest.approx(1.0)  # half an hour on two GPUs
    assert row.cost_usd == pytest.approx(1.1) and row.gpu_cost_usd == pytest.approx(1.1)  # cell-burst: $1.10 per GPU-hour
    assert row.goodput == pytest.approx(1200 / 1800)
    assert pd.isna(row.tokens_in) and pd.isna(row.token_cost_usd)
    assert not row.completed_task and row.task_id == "run-1:cell.finetuned_model:drop-7"


def test_booking_an_attempt_twice_keeps_one_row(ledger):
    assert ledger.record(_record()) is True
    assert ledger.record(_record()) is False
    assert ledger.record(_record(attempt=2, started=T0 + dt.timedelta(hours=1), ended=T0 + dt.timedelta(hours=2), outcome="succeeded", exit_code=0)) is True
    assert list(ledger.frame()["attempt"]) == [1, 2]


def test_frames_are_oldest_first_and_filter_on_columns(ledger):
    for record in reversed(synthetic_records()):
        ledger.record(record)
    frame = ledger.frame()
    assert list(frame["started_at"]) == sorted(frame["started_at"])
    assert list(frame["run_id"]) == ["r1", "r1", "r2", "r2", "r3", "r3"]
    assert set(ledger.frame(lane="robotics")["run_id"]) == {"r3"}
    assert list(ledger.frame(outcome=["failed", "refused"])["run_id"]) == ["r2", "r3"]
    assert list(ledger.frame(since=DAY2)["run_id"]) == ["r3", "r3"]
    assert list(ledger.frame(until=DAY1 + dt.timedelta(hours=2))["attempt"]) == [1, 2]
    assert ledger.frame(provider="nowhere").empty
    with pytest.raises(ValueError, match="cannot filter the ledger on 'colour'"):
        ledger.frame(colour="red")


def test_token_costs_add_to_the_gpu_cost(ledger):
    ledger.record(_record(tokens_in=1000, tokens_out=500, token_cost_usd=0.25))
    row = ledger.frame().iloc[0]
    assert (row.tokens_in, row.tokens_out) == (1000, 500)
    assert row.cost_usd == pytest.approx(1.1 + 0.25)


def test_creating_the_schema_twice_is_harmless(ledger):
    ledger.record(_record())
    ledger_module._engine.cache_clear()  # a new process: create_all runs again against the existing table
    again = Ledger(ledger.url)
    ledger_module.metadata.create_all(again.engine)
    assert len(again.frame()) == 1


def test_an_empty_ledger_has_every_column(ledger):
    frame = ledger.frame()
    assert frame.empty and list(frame.columns) == ledger_module.COLUMNS


def _write_many(url: str, writer: int, count: int, barrier) -> None:
    barrier.wait()
    target = Ledger(url)
    for i in range(count):
        start = T0 + dt.timedelta(seconds=writer * 10_000 + i)
        target.record(_record(run_id=f"writer-{writer}", attempt=i, started=start, ended=start + dt.timedelta(seconds=5), outcome="succeeded"))


def test_two_processes_write_to_one_sqlite_ledger_at_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    writers = [context.Process(target=_write_many, args=(url, w, 40, barrier)) for w in (1, 2)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(timeout=300)
    assert [p.exitcode for p in writers] == [0, 0]
    frame = Ledger(url).frame()
    assert frame.groupby("run_id").size().to_dict() == {"writer-1": 40, "writer-2": 40}


@pytest.mark.parametrize(
    ("outcome", "reason"), [("preempted", "preemption"), ("failed", "failure"), ("orphaned", "failure"), ("refused", "queueing"), ("succeeded", "rework")]
)
def test_time_left_unexplained_is_charged_to_how_the_attempt_ended(outcome, reason):
    split = split_time(outcome, 100.0, 50.0, checkpoint=10.0, queue=5.0)
    assert (split.productive, split.checkpoint) == (50.0, 10.0)
    expected = {"preemption": 0.0, "failure": 0.0, "queueing": 5.0, "rework": 0.0}
    expected[reason] += 35.0
    assert split.lost == expected


def test_the_parts_never_exceed_the_allocation():
    split = split_time("preempted", 60.0, 50.0, checkpoint=30.0, queue=5.0, rework=40.0)
    assert (split.productive, split.lost["queueing"], split.checkpoint, split.lost["rework"], split.lost["preemption"]) == (50.0, 5.0, 5.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="unknown attempt outcome 'lost'"):
        split_time("lost", 1.0, 0.0)


def test_v1_callers_keep_working_through_the_storage_root(tmp_path, monkeypatch):
    monkeypatch.delenv(LEDGER_URL_ENV, raising=False)
    storage = Storage.at(str(tmp_path / "home"))
    record_attempt(storage.ledger(), _record())  # the v1 `ledger/attempts` URI
    record_attempt(storage, _record(attempt=2, started=T0 + dt.timedelta(hours=1), ended=T0 + dt.timedelta(hours=2)))
    assert (tmp_path / "home" / "ledger" / "ledger.db").is_file()
    assert list(read_ledger(storage.ledger())["attempt"]) == [1, 2]
    assert list(read_ledger(storage.root)["attempt"]) == [1, 2]
    assert list(read_ledger(storage, attempt=2)["attempt"]) == [2]


def test_an_object_store_root_needs_a_database_url(monkeypatch, tmp_path):
    monkeypatch.delenv(LEDGER_URL_ENV, raising=False)
    with pytest.raises(LedgerConfigError, match=f"s3://bucket/prefix.*{LEDGER_URL_ENV}"):
        Ledger.for_storage("s3://bucket/prefix")
    monkeypatch.setenv(LEDGER_URL_ENV, f"sqlite:///{tmp_path / 'prod.db'}")
    record_attempt(Storage.at("s3://bucket/prefix"), _record())
    assert len(read_ledger(f"sqlite:///{tmp_path / 'prod.db'}")) == 1


def test_a_malformed_database_url_is_named():
    with pytest.raises(LedgerConfigError, match="'not a url' is not a database URL"):
        Ledger("not a url")


def test_times_must_say_their_zone():
    with pytest.raises(ValueError, match="timezone-aware"):
        _record(started=dt.datetime(2025, 3, 1), ended=dt.datetime(2025, 3, 1, 1))


def test_the_markdown_table_says_why_time_was_lost():
    table = ledger_markdown([_record(queue_seconds=120)])
    assert "| 1 | `cell-burst` | local | spot | preempted | 1800.0 | 1200.0 | 0.0 | 600.0 (preemption 480.0, queueing 120.0) |" in table


def test_postgres_server_is_a_real_postgresql(postgres):
    engine = sa.create_engine(postgres.url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("select current_setting('server_version_num')::int")).scalar() >= 150000
    engine.dispose()
