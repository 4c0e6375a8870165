"""The stand-in model providers of a catalog, started here on first use.

A provider of the embedded catalog with a `standin:` block and no `base_url` is served by a
stand-in (`testbed/model_providers/`) that this process starts on loopback the first
time the gateway needs it, and keeps for the life of the process. Its request log goes to
`models/standins/<provider>/requests.jsonl` under a local storage root (a temporary folder for
an object-store root), so a reader can check what reached each provider. It answers the tasks it
was told about: each task folder's `standin_skill.py`.
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

from control_plane.catalog.models import ModelCatalog, Provider
from model_gateway.tasks import Task
from testbed.model_providers import StandInConfig, StandInModel, StandInProvider, load_skill

_LOCK = threading.Lock()
_RUNNING: dict[tuple[str, str], StandInProvider] = {}  # (provider, log folder) → its stand-in


def log_folder(storage_root: str, provider: str) -> Path:
    """Where a stand-in's request log lives for this storage root."""
    local = not storage_root.startswith(("s3://", "gs://", "az://"))
    base = Path(storage_root) if local else Path(tempfile.gettempdir()) / "sinewgrid-standins"
    return base / "models" / "standins" / provider


def standin(provider: Provider, storage_root: str, tasks: list[Task]) -> StandInProvider:
    """The running stand-in of `provider` (started now if needed), knowing every task in `tasks`."""
    folder = log_folder(storage_root, provider.name)
    with _LOCK:
        running = _RUNNING.get((provider.name, str(folder)))
        if running is None:
            spec = provider.standin
            assert spec is not None
            models = [StandInModel(name, m.standin.quality if m.standin else 0.9, m.standin.latency_ms if m.standin else 0.0) for name, m in provider.models.items()]
            config = StandInConfig(
                name=provider.name,
                api=provider.api,  # type: ignore[arg-type]
                models=models,
                rate_limit_rpm=provider.rate_limit_rpm,
                outage=spec.outage,
                batch_seconds=spec.batch_seconds,
                log_dir=folder,
            )
            running = StandInProvider(config)
            running.start()
            _RUNNING[(provider.name, str(folder))] = running
        for task in tasks:
            if task.name not in running.skills and (task.folder / "standin_skill.py").exists():
                running.skills[task.name] = load_skill(task.folder)
        return running


def stop_all() -> None:
    with _LOCK:
        for provider in _RUNNING.values():
            provider.stop()
        _RUNNING.clear()
