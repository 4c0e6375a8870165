"""Engines left behind by a test run that was killed: found by their own markers, stopped.

Each engine the testbed starts lives in a temporary folder named with its prefix
(`sinewgrid-slurm-`, `sgray-`, `sinewgrid-pg-`, `sinewgrid-s3-`) and holds an `owner.pid` file with the
process id of whoever started it. A run killed with SIGKILL never reaches its teardown, so
its daemons go on holding ports, cores and folders. `sweep(prefix)` finds the folders whose
owner is gone, stops every process that names the folder on its command line or in its
environment (`SLURM_CONF=...`), and removes the folder. Engines of a live owner, another
test run going on beside this one, are left alone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import psutil

OWNER_FILE = "owner.pid"


def claim(folder: Path) -> None:
    """Mark `folder` as belonging to this process."""
    (Path(folder) / OWNER_FILE).write_text(f"{os.getpid()}\n")


def owner_gone(folder: Path) -> bool:
    """True when `folder` names an owner and that process has ended. A folder without an
    owner file is left alone: it may be one being made right now."""
    try:
        pid = int((Path(folder) / OWNER_FILE).read_text().strip())
    except (OSError, ValueError):
        return False
    return not psutil.pid_exists(pid)


def processes_using(folder: Path) -> list[psutil.Process]:
    """Processes that name `folder` in their command line or environment (never this one)."""
    marker = str(folder)
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid == os.getpid():
            continue
        try:
            named = any(marker in arg for arg in proc.info["cmdline"] or [])
            if not named:
                named = any(marker in value for value in proc.environ().values())
        except (psutil.Error, OSError):
            continue
        if named:
            found.append(proc)
    return found


def stop_processes(procs: list[psutil.Process], grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL whatever is still there after `grace_s`."""
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


def sweep(prefix: str, parent: str | None = None) -> list[Path]:
    """Stop and remove every `<parent>/<prefix>*` engine whose owner is gone; the folders swept."""
    swept = []
    for folder in sorted(Path(parent or tempfile.gettempdir()).glob(f"{prefix}*")):
        if not folder.is_dir() or not owner_gone(folder):
            continue
        stop_processes(processes_using(folder))
        shutil.rmtree(folder, ignore_errors=True)
        swept.append(folder)
    return swept
