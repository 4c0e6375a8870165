"""The Dagster UI on loopback, for tests: `dagster-webserver` from this virtualenv.

`dagster_webserver(dagster_home, sinewgrid_home)` starts it on the project's workspace
(workspace.yaml, the code locations `make ui` shows) and the given instance, waits until it
answers `/server_info`, and stops it, with the code servers it started, on exit. Run by hand:
`python -m testbed.webserver SINEWGRID_HOME` serves that storage root's instance until Enter.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from control_plane.settings import child_env
from testbed.ports import free_port

REPO = Path(__file__).resolve().parent.parent
WORKSPACE = REPO / "workspace.yaml"
START_TIMEOUT_S = 240.0  # three code locations load in their own processes; slow on a busy 2-core machine
BIND_ATTEMPTS = 3
PORT_TAKEN = ("address already in use", "errno 98")


class PortTaken(RuntimeError):
    """The port chosen for the server was taken before it could bind it."""


def webserver_bin() -> Path:
    """The `dagster-webserver` script beside this interpreter (installed with the project)."""
    path = Path(sys.executable).with_name("dagster-webserver")
    if not path.exists():
        raise RuntimeError(f"The UI test needs `dagster-webserver`, and there is none at {path}. Install the project: `make venv`.")
    return path


@contextlib.contextmanager
def dagster_webserver(dagster_home: Path, sinewgrid_home: Path, timeout_s: float = START_TIMEOUT_S) -> Iterator[str]:
    """Serve the workspace on `dagster_home`'s instance; yield the base URL once it answers.

    A free port is chosen and, if another process takes it before the server binds it, a new
    one (up to BIND_ATTEMPTS). The server and its code servers are stopped on exit, even when
    the block raises.
    """
    env = child_env({"DAGSTER_HOME": str(dagster_home), "SINEWGRID_HOME": str(sinewgrid_home), "DAGSTER_DISABLE_TELEMETRY": "1"})
    with tempfile.TemporaryDirectory(prefix="sinewgrid-webserver-") as folder:
        for attempt in range(1, BIND_ATTEMPTS + 1):
            port = free_port()
            log_path = Path(folder) / f"webserver-{attempt}.log"
            with log_path.open("wb") as log:
                # Its own process group: the code servers it starts are stopped with it.
                server = subprocess.Popen(
                    [str(webserver_bin()), "-w", str(WORKSPACE), "-h", "127.0.0.1", "-p", str(port)],
                    cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                )
            try:
                url = _wait_until_it_answers(server, f"http://127.0.0.1:{port}", log_path, timeout_s)
            except PortTaken:
                _stop(server)
                if attempt == BIND_ATTEMPTS:
                    raise
                continue
            except BaseException:
                _stop(server)
                raise
            try:
                yield url
            finally:
                _stop(server)
            return


def _wait_until_it_answers(server: subprocess.Popen, url: str, log_path: Path, timeout_s: float) -> str:
    """`url`, once the server answers `/server_info` there with its version."""
    deadline = time.monotonic() + timeout_s
    while True:
        if _server_info(url) is not None:
            return url
        if server.poll() is not None:
            log = log_path.read_text(errors="replace")
            if any(sign in log.lower() for sign in PORT_TAKEN):
                raise PortTaken(f"{url} was taken before dagster-webserver bound it")
            raise RuntimeError(f"dagster-webserver exited with code {server.returncode} before it answered at {url}. Its output:\n{log[-4000:]}")
        if time.monotonic() > deadline:
            log = log_path.read_text(errors="replace")
            raise RuntimeError(f"dagster-webserver did not answer at {url}/server_info within {timeout_s:.0f}s. Its output:\n{log[-4000:]}")
        time.sleep(0.5)


def _server_info(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(f"{url}/server_info", timeout=5) as response:
            return json.loads(response.read()) if response.status == 200 else None
    except (OSError, ValueError):
        return None


def _stop(server: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL to what is left after 15 s."""
    for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, sig)
        try:
            server.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        # The server is gone; make sure nothing it started outlives it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        return


if __name__ == "__main__":
    home = Path(sys.argv[1]).resolve()
    with dagster_webserver(home / "dagster", home) as base:
        input(f"Dagster UI at {base}; Enter stops it. ")
