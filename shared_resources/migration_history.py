"""Each Alembic migration history is read once per process, not once per database opened.

Dagster checks a SQLite database's schema revision every time it opens one, and on the
embedded default every run's event log is a database of its own. Each check makes a new Alembic
`ScriptDirectory`, which imports every migration script of Dagster's history again (90 files)
to find its head: measured, 0.18 CPU-s a check and 141 checks in one `sinewgrid demo` (25 of
its ~230 CPU-s); a quarter of the CPU time of the Cell lane's ingest and end-to-end tests.

`share_migration_histories()` makes every `ScriptDirectory` of the same scripts folder share one
revision map, built the first time one is needed. A history does not change while a process
runs (a new migration is a new release), so a check reads the same head as before. Called where
the Dagster resources are defined (`shared_resources/__init__.py`), so every process that opens
a Dagster instance through a code location, the CLI or the tests has it; `benchmarks/instance.py`
measures it against Alembic's own behaviour.
"""

from __future__ import annotations

import threading
from typing import Any

from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionMap

_ALEMBIC_FROM_CONFIG = ScriptDirectory.__dict__["from_config"].__func__
_maps: dict[tuple, RevisionMap] = {}
_lock = threading.Lock()


def history_key(script: ScriptDirectory) -> tuple:
    """What a history's revisions are read from: its folders and how they are read."""
    return (script.dir, tuple(script.version_locations), script.sourceless, script.recursive_version_locations)


def _from_config(cls: type[ScriptDirectory], config: Any) -> ScriptDirectory:
    script = _ALEMBIC_FROM_CONFIG(cls, config)
    with _lock:
        script.revision_map = _maps.setdefault(history_key(script), script.revision_map)
    return script


def share_migration_histories() -> None:
    """From now on, `ScriptDirectory.from_config` reuses the revision map of the same scripts folder."""
    ScriptDirectory.from_config = classmethod(_from_config)  # type: ignore[method-assign,assignment]


def shared_histories() -> int:
    """How many histories this process has read (one per scripts folder)."""
    return len(_maps)
