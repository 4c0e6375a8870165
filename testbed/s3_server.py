"""A real S3 API server on loopback, for tests: `moto_server` from this virtualenv.

No real S3 can be reached from the test machines; moto serves the same HTTP API, and s3fs,
boto3 and every subprocess a test starts talk to it through `AWS_ENDPOINT_URL` exactly as
they would to AWS. `s3_server()` starts one on a free port, waits until it answers and
stops it on exit. Run by hand: `python -m testbed.s3_server` starts one, prints its
endpoint and stops it on Enter.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from testbed.ports import free_port

START_TIMEOUT_S = 60.0


def moto_server_bin() -> Path:
    """The `moto_server` script beside this interpreter (installed by the `moto[server]` extra)."""
    path = Path(sys.executable).with_name("moto_server")
    if not path.exists():
        raise RuntimeError(
            f"The S3 tests need `moto_server`, and there is none at {path}. "
            "Install it into this virtualenv with `pip install 'moto[server]'`."
        )
    return path


@contextlib.contextmanager
def s3_server(timeout_s: float = START_TIMEOUT_S) -> Iterator[str]:
    """Start `moto_server -H 127.0.0.1 -p PORT`, yield its endpoint URL, stop it on exit."""
    port = free_port()
    server = subprocess.Popen(
        [str(moto_server_bin()), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError(f"moto_server exited with code {server.returncode} before it answered on port {port}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not answer on 127.0.0.1:{port} within {timeout_s:.0f}s") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


if __name__ == "__main__":
    with s3_server() as endpoint:
        input(f"S3 API at {endpoint} (AWS_ENDPOINT_URL={endpoint}); Enter stops it. ")
