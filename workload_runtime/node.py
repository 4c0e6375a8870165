"""What the node a workload runs on offers it: a cache folder for files it makes at run time.

Workload side, standard library only. The orchestrator's settings do not travel to the node,
so the runtime reads the node's own environment here (and `SINEWGRID_WORKLOAD_EXTRAS` in
`workload.py`), nowhere else.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(name: str, override_env: str | None = None) -> Path:
    """`$<override_env>` if set, else `<user cache>/sinewgrid/<name>` (`$XDG_CACHE_HOME` or `~/.cache`)."""
    if override_env and os.environ.get(override_env):
        return Path(os.environ[override_env])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sinewgrid" / name
