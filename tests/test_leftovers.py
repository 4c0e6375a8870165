"""Engines a killed test run left behind are found by their own folder and stopped.

A run killed with SIGKILL never reaches its fixtures' teardown. The next run's engine fixtures
sweep the folders whose owner has ended (testbed/leftovers.py); here a real `moto_server` stands
in for such a leftover, and the folder of a live owner beside it is left alone.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from control_plane.settings import child_env
from testbed import leftovers
from testbed.s3_server import FOLDER_ENV, PREFIX, moto_server_bin


def test_a_server_a_killed_run_left_is_stopped_and_its_folder_removed(tmp_path: Path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = Path(tempfile.mkdtemp(prefix=PREFIX, dir=tmp_path))
    (left / leftovers.OWNER_FILE).write_text(f"{dead.pid}\n")  # its owner is gone
    server = subprocess.Popen(
        [str(moto_server_bin()), "-H", "127.0.0.1", "-p", "0"],
        env=child_env({FOLDER_ENV: str(left)}), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    live = Path(tempfile.mkdtemp(prefix=PREFIX, dir=tmp_path))
    leftovers.claim(live)  # another run going on beside this one: its owner (this process) lives
    try:
        assert leftovers.sweep(PREFIX, str(tmp_path)) == [left]
        server.wait(timeout=30)
        assert not left.exists() and live.exists()
    finally:
        server.kill()
