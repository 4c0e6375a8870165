"""The ledger's database: one row per step attempt, booked and read back through SQLAlchemy.

Records (`AttemptRecord`, in `control_plane.accounting.records`) live in a SQL database:
by default a SQLite file under the storage root (`ledger/ledger.db`), in production
PostgreSQL named by `SINEWGRID_LEDGER_URL`
(e.g. `postgresql+psycopg2://user:password@host/sinewgrid`). An `s3://` storage root needs
that setting: a database file cannot live on an object store.

This module holds the table, the engines, `Ledger` and `ledger_url`. `Ledger.record()` books
an attempt (booking the same attempt twice keeps one row); `Ledger.frame()` reads them back
as a DataFrame. `record_attempt` and `read_ledger` are the v1 entry points, kept for callers
that pass a storage root or its `ledger/attempts` URI.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import posixpath
import sqlite3
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import IntegrityError, OperationalError

from control_plane.accounting.migrations import upgrade_ledger
from control_plane.accounting.records import LOST_REASONS, AttemptRecord
from control_plane.settings import settings
from workload_runtime.storage import Storage

LEDGER_URL_ENV = "SINEWGRID_LEDGER_URL"


class LedgerConfigError(RuntimeError):
    """The ledger has no database it can use (e.g. an `s3://` root and no `SINEWGRID_LEDGER_URL`)."""


# The table ------------------------------------------------------------------------------
# What the newest migration (migrations/versions/) leaves in the database. A change here is a new
# migration there; tests/test_ledger.py checks that the two agree.

metadata = sa.MetaData()
attempts = sa.Table(
    "ledger_attempts",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(64), nullable=False, index=True),
    sa.Column("step", sa.String(200), nullable=False),
    sa.Column("asset", sa.String(300), nullable=False),
    sa.Column("partition", sa.String(300)),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("pool", sa.String(200), nullable=False),
    sa.Column("provider", sa.String(100), nullable=False, index=True),
    sa.Column("region", sa.String(100), nullable=False),
    sa.Column("backend", sa.String(32), nullable=False),
    sa.Column("purchasing", sa.String(32), nullable=False),
    sa.Column("gpus", sa.Integer, nullable=False),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, index=True),
    sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("allocated_seconds", sa.Float, nullable=False),
    sa.Column("productive_seconds", sa.Float, nullable=False),
    sa.Column("outcome", sa.String(32), nullable=False),
    sa.Column("exit_code", sa.Integer),
    sa.Column("price_per_gpu_hour", sa.Float, nullable=False),
    sa.Column("project", sa.String(200), nullable=False, index=True),
    sa.Column("lane", sa.String(100), nullable=False, index=True),
    sa.Column("checkpoint_seconds", sa.Float, nullable=False),
    sa.Column("queue_seconds", sa.Float, nullable=False),
    *(sa.Column(f"lost_{reason}_seconds", sa.Float, nullable=False) for reason in LOST_REASONS),
    sa.Column("tokens_in", sa.BigInteger),
    sa.Column("tokens_out", sa.BigInteger),
    sa.Column("token_cost_usd", sa.Float),
    sa.Column("task_id", sa.String(700), nullable=False),
    sa.Column("completed_task", sa.Boolean, nullable=False),
    sa.Column("cause", sa.String(64), nullable=False, server_default=""),
    sa.Column("ranks", sa.Integer, nullable=False, server_default="1"),
    sa.Column("node", sa.String(200), nullable=False, server_default=""),
    sa.Column("cache_bytes", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("store_bytes", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("tenant", sa.String(100), nullable=False, server_default="", index=True),
    sa.Column("model", sa.String(200), nullable=False, server_default=""),
    sa.Column("tokens_cached", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("cache_hits", sa.Integer, nullable=False, server_default="0"),
    sa.Column("gpu_hours", sa.Float, nullable=False),
    sa.Column("gpu_cost_usd", sa.Float, nullable=False),
    sa.Column("cost_usd", sa.Float, nullable=False),
    # One row per attempt: booking it again (a retried write, the watcher and the run both
    # seeing it) keeps the first.
    sa.UniqueConstraint("run_id", "step", "attempt", "started_at", name="uq_ledger_attempt"),
)
RECORD_FIELDS = [f.name for f in fields(AttemptRecord)]
DERIVED = ["wall_seconds", "gpu_hours", "gpu_cost_usd", "cost_usd", "goodput", "lost_seconds"]
COLUMNS = RECORD_FIELDS + DERIVED


def _sqlite_connect(dbapi_connection, _record) -> None:
    # The busy timeout makes concurrent writers (several run workers, the watcher) wait their
    # turn instead of failing. pysqlite's own transaction handling is switched off so that
    # `_sqlite_begin` can start every transaction as BEGIN IMMEDIATE (SQLAlchemy's documented
    # recipe): a transaction that reads and then writes would otherwise fail at once with
    # "database is locked" when another process wrote in between, without waiting.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA busy_timeout = 60000")
    cursor.close()


def _sqlite_begin(connection) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")


# The lock is held for one statement: ask again soon (30 s in all, as before, in shorter steps).
WAL_RETRY_SECONDS = 0.05
WAL_ATTEMPTS = 600


def _sqlite_wal(engine: Engine) -> None:
    """WAL (readers never wait for a writer) is a property of the file: set it once, retrying
    while another process holds the lock (`journal_mode` does not wait on the busy timeout)."""
    for attempt in range(WAL_ATTEMPTS):
        try:
            raw = engine.raw_connection()  # outside any transaction: the mode cannot change inside one
            try:
                cursor = raw.cursor()
                if cursor.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    cursor.execute("PRAGMA journal_mode = WAL")
                cursor.close()
            finally:
                raw.close()
            return
        except (OperationalError, sqlite3.OperationalError):
            if attempt == WAL_ATTEMPTS - 1:
                raise
            time.sleep(WAL_RETRY_SECONDS)


@functools.cache
def _engine(url: str, pid: int) -> Engine:
    """One engine per database and process (pooled connections must not cross a fork)."""
    del pid  # part of the cache key only
    if make_url(url).get_backend_name() == "sqlite":
        engine = sa.create_engine(url, connect_args={"timeout": 60})
        sa.event.listen(engine, "connect", _sqlite_connect)
        sa.event.listen(engine, "begin", _sqlite_begin)
        _sqlite_wal(engine)
    else:
        engine = sa.create_engine(url, pool_pre_ping=True)
    upgrade_ledger(engine)  # the schema through its Alembic migrations (migrations/)
    return engine


def ledger_url(storage: Storage) -> str:
    """The database the ledger of `storage` lives in: `SINEWGRID_LEDGER_URL`, else a SQLite
    file `ledger/ledger.db` under a local storage root."""
    url = settings().ledger_url.strip()
    if url:
        return url
    if not storage.is_local:
        raise LedgerConfigError(
            f"The storage root {storage.root} is an object store, where the ledger's SQLite file cannot live. "
            f"Set {LEDGER_URL_ENV} to a database URL, e.g. postgresql+psycopg2://user:password@host:5432/sinewgrid."
        )
    folder = Path(storage.root.removeprefix("file://")) / "ledger"
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'ledger.db'}"


class Ledger:
    """The attempt ledger in one SQL database (SQLite or PostgreSQL)."""

    def __init__(self, url: str):
        self.url = url
        try:
            backend = make_url(url).get_backend_name()
        except sa.exc.ArgumentError as exc:
            raise LedgerConfigError(f"{LEDGER_URL_ENV}={url!r} is not a database URL ({exc}); e.g. sqlite:///ledger.db") from exc
        self.backend = backend

    @classmethod
    def for_storage(cls, storage: Storage | str) -> Ledger:
        """The ledger of a storage root (a `Storage`, or its root path or URI)."""
        return cls(ledger_url(storage if isinstance(storage, Storage) else Storage.at(storage)))

    @property
    def engine(self) -> Engine:
        return _engine(self.url, os.getpid())

    def __repr__(self) -> str:
        return f"Ledger({make_url(self.url).render_as_string(hide_password=True)})"

    def record(self, record: AttemptRecord) -> bool:
        """Book one attempt. False when that attempt (run, step, attempt, start) was booked already."""
        row = {**asdict(record), "gpu_hours": record.gpu_hours, "gpu_cost_usd": record.gpu_cost_usd, "cost_usd": record.cost_usd}
        row["started_at"] = dt.datetime.fromisoformat(record.started_at)
        row["ended_at"] = dt.datetime.fromisoformat(record.ended_at)
        try:
            with self.engine.begin() as conn:
                conn.execute(attempts.insert().values(**row))
        except IntegrityError:
            return False
        return True

    def frame(self, *, since: dt.datetime | None = None, until: dt.datetime | None = None, **filters: Any) -> pd.DataFrame:
        """Every attempt booked, oldest first, with derived columns (cost, goodput, lost time).

        Filters are column values (`lane="cell"`, `run_id=...`, `outcome=["failed", "orphaned"]`);
        `since`/`until` bound the start time.
        """
        query = sa.select(*(c for c in attempts.c if c.name != "id"))
        for name, value in filters.items():
            if name not in attempts.c or name == "id":
                raise ValueError(f"cannot filter the ledger on {name!r}; columns are {', '.join(RECORD_FIELDS)}")
            column = attempts.c[name]
            query = query.where(column.in_(value) if isinstance(value, list | tuple | set) else column == value)
        if since is not None:
            query = query.where(attempts.c.started_at >= since.astimezone(dt.UTC))
        if until is not None:
            query = query.where(attempts.c.started_at < until.astimezone(dt.UTC))
        query = query.order_by(attempts.c.started_at, attempts.c.id)
        with self.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        frame = pd.DataFrame([dict(r) for r in rows], columns=[c.name for c in attempts.c if c.name != "id"])
        for column in ("started_at", "ended_at"):
            # SQLite hands back naive times; every time in the ledger is UTC.
            frame[column] = pd.to_datetime(frame[column], utc=True)
        frame["exit_code"] = frame["exit_code"].astype("Int64")
        frame["completed_task"] = frame["completed_task"].astype(bool)
        frame["wall_seconds"] = frame["allocated_seconds"]
        frame["goodput"] = (frame["productive_seconds"] / frame["allocated_seconds"].where(frame["allocated_seconds"] > 0)).fillna(0.0)
        frame["lost_seconds"] = frame[[f"lost_{r}_seconds" for r in LOST_REASONS]].sum(axis=1)
        return frame[COLUMNS].reset_index(drop=True)


# v1 entry points ------------------------------------------------------------------------


def _ledger(target: Ledger | Storage | str) -> Ledger:
    """A ledger from what v1 callers pass: a Ledger, a Storage, a database URL, a storage root,
    or the v1 `<root>/ledger/attempts` URI (`Storage.ledger()`)."""
    if isinstance(target, Ledger):
        return target
    if isinstance(target, Storage):
        return Ledger.for_storage(target)
    if target.split(":", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql", "postgres", "mysql"):
        return Ledger(target)
    root = target.rstrip("/")
    if root.endswith("ledger/attempts"):
        root = posixpath.dirname(posixpath.dirname(root))
    return Ledger.for_storage(root)


def record_attempt(target: Ledger | Storage | str, record: AttemptRecord) -> str:
    """Book `record` in the ledger of `target` (see `_ledger`); returns where it went."""
    ledger = _ledger(target)
    ledger.record(record)
    return repr(ledger)


def read_ledger(target: Ledger | Storage | str, **filters: Any) -> pd.DataFrame:
    """Every attempt in the ledger of `target`, oldest first (see `Ledger.frame`)."""
    return _ledger(target).frame(**filters)
