"""The ledger's schema, version by version, as Alembic migrations (`versions/`).

`upgrade_ledger(engine)` brings a ledger to the newest schema: it creates the table in an empty
database, upgrades one Alembic has versioned, and first stamps a ledger created before Alembic
(the table there, no version table) with the revision its columns match.

Several processes (run workers, the watcher) open the ledger at once, so the whole upgrade runs in
one transaction that holds the database's write lock: SQLite's BEGIN IMMEDIATE (the engine's own
`begin`), PostgreSQL's transaction-scoped advisory lock. The others wait, then find it at head.
"""

from __future__ import annotations

import time
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

FOLDER = Path(__file__).parent
# Not Alembic's default `alembic_version`: the ledger may share a PostgreSQL database with the
# Dagster instance, whose storage keeps its own Alembic version there.
VERSION_TABLE = "ledger_alembic_version"
TABLE = "ledger_attempts"
BASELINE = "0001"  # the first ledgers' table
# Columns added after the baseline: a pre-Alembic ledger with all of them is at this revision.
ADDED = {"0002": ("cause", "ranks", "node", "cache_bytes", "store_bytes", "tenant", "model", "tokens_cached", "cache_hits")}
# Any fixed 64-bit number, the same in every process: PostgreSQL's advisory lock for the upgrade.
_PG_LOCK = 0x5EDE_1ED6_E400_0001


def alembic_config(connection: Connection) -> Config:
    """Alembic's configuration for the ledger, from the installed package (no alembic.ini)."""
    config = Config()
    config.set_main_option("script_location", str(FOLDER))
    config.attributes["connection"] = connection
    return config


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()


def _pre_alembic_revision(connection: Connection) -> str:
    """The revision a ledger created before Alembic matches: the newest whose added columns it has
    all of (the baseline otherwise; the next migration adds only what is missing)."""
    present = {column["name"] for column in sa.inspect(connection).get_columns(TABLE)}
    matched = BASELINE
    for revision, columns in ADDED.items():
        if not set(columns) <= present:
            break
        matched = revision
    return matched


def _upgrade_once(engine: Engine) -> None:
    with engine.begin() as connection:  # on SQLite the engine begins every transaction IMMEDIATE
        if connection.dialect.name == "postgresql":
            connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK})
        config = alembic_config(connection)
        if current_revision(connection) is None and sa.inspect(connection).has_table(TABLE):
            command.stamp(config, _pre_alembic_revision(connection))
        command.upgrade(config, "head")


def upgrade_ledger(engine: Engine, attempts: int = 5) -> None:
    """Bring the ledger in `engine` to the newest schema (see the module's docstring)."""
    for attempt in range(attempts):
        try:
            _upgrade_once(engine)
            return
        except (OperationalError, ProgrammingError, IntegrityError):
            # A database without the locks above (or a lock wait that ran out): another process
            # may have changed the schema under us. Try again from what is there now.
            if attempt == attempts - 1:
                raise
            time.sleep(0.5 * (attempt + 1))
