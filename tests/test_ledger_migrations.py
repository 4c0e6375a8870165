"""The ledger's schema goes through Alembic: a new ledger is created at head, a ledger created
before Alembic is stamped with the revision its columns match and upgraded in place (rows kept,
new columns at their defaults), and several processes opening an old ledger at once all succeed."""

from __future__ import annotations

import datetime as dt
import multiprocessing
import uuid
from dataclasses import asdict

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from control_plane.accounting import ledger as ledger_module
from control_plane.accounting.ledger import Ledger, attempts
from control_plane.accounting.migrations import VERSION_TABLE, alembic_config
from control_plane.accounting.records import AttemptRecord
from control_plane.catalog.pools import load_pools

T0 = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)
# The columns added after the first ledgers (each with a server default), and their defaults.
ADDED_DEFAULTS = {
    "cause": "", "ranks": 1, "node": "", "cache_bytes": 0, "store_bytes": 0, "tenant": "", "model": "", "tokens_cached": 0, "cache_hits": 0,
}


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    server = request.getfixturevalue("postgres")  # the session's server (tests/fixtures/postgres.py), a database per test
    return server.create_database(f"ledger_{uuid.uuid4().hex[:10]}")


def _head() -> str:
    return ScriptDirectory.from_config(alembic_config(None)).get_current_head()


def _version(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


def _old_ledger(url: str, without: set[str] = set(ADDED_DEFAULTS), runs: int = 3) -> None:
    """A ledger as an older release left it: the table without the columns in `without`, a few rows
    booked, no Alembic version table."""
    pool = load_pools(None)["cell-burst"]
    old = sa.MetaData()
    table = sa.Table(
        attempts.name, old,
        *(sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable, index=c.index, server_default=c.server_default and c.server_default.arg)
          for c in attempts.c if c.name not in without),
        sa.UniqueConstraint("run_id", "step", "attempt", "started_at", name="uq_ledger_attempt"),
    )
    engine = sa.create_engine(url)
    try:
        old.create_all(engine)
        with engine.begin() as conn:
            for i in range(runs):
                record = AttemptRecord.for_attempt(
                    pool=pool, run_id=f"old-{i}", step="cell.finetuned_model", asset="cell/finetuned_model", partition=None, attempt=1,
                    gpus=2, started=T0 + dt.timedelta(hours=i), ended=T0 + dt.timedelta(hours=i, minutes=30), productive_seconds=600.0,
                    outcome="succeeded", exit_code=0,
                )
                row = {**asdict(record), "gpu_hours": record.gpu_hours, "gpu_cost_usd": record.gpu_cost_usd, "cost_usd": record.cost_usd}
                row["started_at"], row["ended_at"] = dt.datetime.fromisoformat(record.started_at), dt.datetime.fromisoformat(record.ended_at)
                conn.execute(table.insert().values(**{k: v for k, v in row.items() if k in table.c}))
        assert not sa.inspect(engine).has_table(VERSION_TABLE)
    finally:
        engine.dispose()


@pytest.fixture(autouse=True)
def _fresh_engines():
    """Every test opens its ledgers as a new process would (the engine, and so the upgrade, is cached per process)."""
    ledger_module._engine.cache_clear()
    yield
    ledger_module._engine.cache_clear()


def test_a_new_ledger_is_created_at_head_and_matches_the_table_in_the_code(url):
    engine = Ledger(url).engine
    assert _version(engine) == _head()
    with engine.connect() as conn:
        differences = compare_metadata(MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}), ledger_module.metadata)
    assert differences == []  # a change to the table in ledger.py needs a migration of its own


def test_a_ledger_from_before_alembic_is_upgraded_in_place(url):
    _old_ledger(url)
    ledger = Ledger(url)
    engine = ledger.engine
    assert _version(engine) == _head()
    columns = {c["name"] for c in sa.inspect(engine).get_columns(attempts.name)}
    assert set(ADDED_DEFAULTS) <= columns
    assert "ix_ledger_attempts_tenant" in {i["name"] for i in sa.inspect(engine).get_indexes(attempts.name)}
    frame = ledger.frame()
    assert list(frame["run_id"]) == ["old-0", "old-1", "old-2"]  # the old rows are kept...
    for column, default in ADDED_DEFAULTS.items():  # ...with each new column at its default
        assert frame[column].tolist() == [default] * 3, column
    assert frame["gpu_hours"].tolist() == pytest.approx([1.0] * 3)
    pool = load_pools(None)["cell-burst"]
    assert ledger.record(AttemptRecord.for_attempt(
        pool=pool, run_id="new", step="s", asset="cell/a", partition=None, attempt=1, gpus=1, started=T0, ended=T0 + dt.timedelta(minutes=1),
        productive_seconds=30.0, outcome="preempted", cause="notice", tenant="lab-a",
    ))
    assert ledger.frame(run_id="new")[["cause", "tenant"]].values.tolist() == [["notice", "lab-a"]]


def test_a_ledger_that_already_had_every_column_is_stamped_at_head(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    _old_ledger(url, without=set())
    assert _version(Ledger(url).engine) == _head()
    assert len(Ledger(url).frame()) == 3


def test_a_ledger_with_some_of_the_later_columns_gets_the_rest(tmp_path):
    """Columns arrived one release at a time; a ledger from between two of them has some."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    _old_ledger(url, without={"tenant", "model", "tokens_cached", "cache_hits"})
    frame = Ledger(url).frame()
    assert len(frame) == 3 and set(frame["tenant"]) == {""} and set(frame["ranks"]) == {1}


def _open(url: str, barrier) -> None:
    barrier.wait()
    assert len(Ledger(url).frame()) == 3


def test_processes_opening_an_old_ledger_at_once_all_get_it_upgraded(url):
    _old_ledger(url)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    openers = [context.Process(target=_open, args=(url, barrier)) for _ in range(2)]
    for process in openers:
        process.start()
    for process in openers:
        process.join(timeout=300)
    assert [p.exitcode for p in openers] == [0, 0]
    assert _version(Ledger(url).engine) == _head()
