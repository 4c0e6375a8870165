"""The Dagster instance the command line and the UI share (SQLite under the storage root by default)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import yaml

from control_plane.settings import settings, storage_root, use_dagster_home
from workload_runtime.storage import Storage

DEFAULT_DAGSTER_YAML = {
    "telemetry": {"enabled": False},
    # No "Join the Dagster community" dialog over the first page a newcomer opens with `make ui`.
    "nux": {"enabled": False},
    # Storage defaults to SQLite files in this folder; deploy/dagster.yaml is the
    # production instance on PostgreSQL.
}


def dagster_home() -> Path:
    """`$DAGSTER_HOME`, else `<storage root>/dagster` (a local root is needed for SQLite)."""
    if configured := settings().dagster_home:
        return Path(configured).expanduser().resolve()
    storage = Storage.at(storage_root())
    if not storage.is_local:
        raise SystemExit(
            f"SINEWGRID_HOME is {storage.root}; set DAGSTER_HOME to a local folder (or a PostgreSQL-backed "
            "instance, see deploy/dagster.yaml) for the Dagster instance."
        )
    return Path(storage.root) / "dagster"


def ensure_instance_home() -> Path:
    home = dagster_home()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text(yaml.safe_dump(DEFAULT_DAGSTER_YAML, sort_keys=False))
    use_dagster_home(home)
    return home


def get_instance() -> dg.DagsterInstance:
    ensure_instance_home()
    return dg.DagsterInstance.get()
