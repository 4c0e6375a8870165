"""Figure 12: a Dagster instance on SQLite, opened and given one run, with each migration history
read once per process (`shared_resources/migration_history.py`) against Alembic reading it at
every database it opens.

Subject and baseline do the same thing: open a new instance in a fresh folder (its run, event log
and schedule databases are created) and materialize one small asset in it (one more database:
that run's event log), then dispose of it. The subject is this project's processes as they run
(each `ScriptDirectory` of a scripts folder shares one revision map, built once); the baseline
puts Alembic's own `ScriptDirectory.from_config` back for its repeats, which imports Dagster's 90
migration scripts again at each database's schema check. They alternate, repeat by repeat.

Run: ``python -m benchmarks.instance``.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
from alembic.script import ScriptDirectory
from rich.table import Table

from benchmarks import REPEATS, Timing, time_pair
from shared_resources import migration_history


QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


@dg.asset
def one_number() -> int:
    return 1


@dataclass
class InstanceResult:
    shared: Timing
    alembic: Timing

    @property
    def ratio(self) -> float:
        return self.shared.median / self.alembic.median

    def to_dict(self) -> dict[str, Any]:
        return {"shared_history": self.shared.to_dict(), "alembic_per_database": self.alembic.to_dict(), "ratio": self.ratio}


@contextlib.contextmanager
def alembic_reading():
    """Alembic's own `from_config` for the duration (every history read again), then the shared one back."""
    ScriptDirectory.from_config = classmethod(migration_history._ALEMBIC_FROM_CONFIG)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        migration_history.share_migration_histories()


def open_and_run(base: Path) -> None:
    folder = Path(tempfile.mkdtemp(dir=base))
    with dg.DagsterInstance.from_config(str(folder)) as instance:
        assert dg.materialize([one_number], instance=instance, run_config=QUIET).success
    shutil.rmtree(folder)


def run(repeats: int = REPEATS) -> InstanceResult:
    migration_history.share_migration_histories()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)

        def baseline() -> None:
            with alembic_reading():
                open_and_run(base)

        shared, alembic = time_pair(lambda: open_and_run(base), baseline, repeats=repeats, before_each=lambda: None)
    return InstanceResult(shared=shared, alembic=alembic)


def table(result: InstanceResult, repeats: int) -> Table:
    out = Table(
        title="12. A Dagster instance on SQLite: open it and run one asset, migration histories read once per process vs at every database",
        caption=(
            f"Median of {repeats} repeats, one call each, alternating (time.perf_counter): a new instance in a fresh folder "
            "(DagsterInstance.from_config), one materialize of a one-line asset, then closed. Shared = this project's "
            "processes (shared_resources/migration_history.py); Alembic = ScriptDirectory.from_config as Alembic ships it. "
            "Ratio = shared ÷ Alembic."
        ),
        title_justify="left",
        caption_justify="left",
    )
    for column in ("Case", "Shared ms", "Alembic ms", "Ratio"):
        out.add_column(column, justify="left" if column == "Case" else "right", style="bold" if column == "Ratio" else None)
    out.add_row("open + one run", f"{result.shared.median * 1e3:,.0f}", f"{result.alembic.median * 1e3:,.0f}", f"{result.ratio:.2f}×")
    return out


def main(repeats: int = REPEATS) -> None:
    from rich.console import Console

    Console(width=160).print(table(run(repeats), repeats))


if __name__ == "__main__":
    main()
