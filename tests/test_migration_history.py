"""Each Alembic migration history is read once per process (shared_resources/migration_history.py)."""

from __future__ import annotations

import dagster as dg
import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory

import shared_resources  # noqa: F401  (what every code location imports: it shares the histories)
from control_plane.accounting.migrations import FOLDER
from shared_resources import migration_history


@dg.asset
def one_number() -> int:
    return 1


def ledger_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(FOLDER))
    return config


def test_scripts_of_one_folder_share_one_history_with_alembics_own_head():
    first, second = ScriptDirectory.from_config(ledger_config()), ScriptDirectory.from_config(ledger_config())
    assert first is not second and first.revision_map is second.revision_map
    alembic_own = migration_history._ALEMBIC_FROM_CONFIG(ScriptDirectory, ledger_config())
    assert alembic_own.revision_map is not first.revision_map
    assert first.get_current_head() == alembic_own.get_current_head()
    assert [s.revision for s in first.walk_revisions()] == [s.revision for s in alembic_own.walk_revisions()]


def test_a_sqlite_instance_and_its_runs_read_dagsters_history_at_most_once(tmp_path, monkeypatch: pytest.MonkeyPatch):
    reads: list[str] = []
    load = ScriptDirectory._load_revisions

    def counted(self):
        reads.append(self.dir)
        yield from load(self)

    monkeypatch.setattr(ScriptDirectory, "_load_revisions", counted)
    monkeypatch.setattr(migration_history, "_maps", {})  # as a fresh process
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        with dg.DagsterInstance.from_config(str(tmp_path / name)) as instance:
            for _ in range(2):
                assert dg.materialize([one_number], instance=instance, run_config=quiet).success
    # Two instances, four runs: eight databases checked, Dagster's history read once.
    assert len(reads) == 1 and migration_history.shared_histories() == 1, reads
