"""A real S3 API server on loopback, for tests: `moto_server` from this virtualenv.

No real S3 can be reached from the test machines; moto serves the same HTTP API, and s3fs,
boto3 and every subprocess a test starts talk to it through `AWS_ENDPOINT_URL` exactly as
they would to AWS. `s3_server()` starts one on a port it picks itself, waits until it answers
an S3 request and stops it on exit. Run by hand: `python -m testbed.s3_server` starts one, prints its
endpoint and stops it on Enter.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

from control_plane.settings import child_env
from testbed import leftovers

PREFIX = "sinewgrid-s3-"
# Names the server's folder in its environment, so a later run finds a server a killed run left
# (testbed/leftovers.py): moto's command line does not name it.
FOLDER_ENV = "SINEWGRID_TESTBED_FOLDER"
START_TIMEOUT_S = 60.0
RUNNING_ON = re.compile(r"Running on http://127\.0\.0\.1:(\d+)")
REQUEST = re.compile(r'"(GET|HEAD|PUT|POST|DELETE) (\S+) HTTP/[\d.]+" (\d{3})')
_LOGS: dict[str, Path] = {}  # endpoint -> the server's output (its request log), while it runs


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
    """Start `moto_server` on a port it picks itself, yield its endpoint URL once it answers
    an S3 request, stop it on exit (even when the block raises)."""
    leftovers.sweep(PREFIX)  # servers a killed earlier run left behind
    with tempfile.TemporaryDirectory(prefix=PREFIX) as folder:
        leftovers.claim(Path(folder))
        log_path = Path(folder) / "moto.log"
        with log_path.open("wb") as log:
            # Port 0: the server binds a free port itself and prints it, so no other process can
            # take it between choosing and binding.
            server = subprocess.Popen(
                [str(moto_server_bin()), "-H", "127.0.0.1", "-p", "0"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env({FOLDER_ENV: folder}),
            )
        endpoint = ""
        try:
            endpoint = _wait_until_it_answers(server, log_path, timeout_s)
            _LOGS[endpoint] = log_path
            yield endpoint
        finally:
            _LOGS.pop(endpoint, None)
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=10)


def object_reads(endpoint: str, prefix: str) -> list[str]:
    """The objects read so far from the server at `endpoint` whose key starts with `prefix`
    (`bucket/key...`): one entry per successful GET of an object, from the server's own request
    log. Listings (`GET /bucket?list-type=2...`) are not reads of an object and are left out.

    The server logs a request just after answering it: a marker request is sent first and the
    log read once it shows, so every request answered before this call is in it."""
    marker = f"log-sync-{uuid.uuid4().hex}"
    with contextlib.suppress(OSError):
        urllib.request.urlopen(f"{endpoint}/{marker}", timeout=5).close()
    deadline = time.monotonic() + 30
    while marker not in (log := _LOGS[endpoint].read_text(errors="replace")) and time.monotonic() < deadline:
        time.sleep(0.05)
    reads = []
    for method, target, status in REQUEST.findall(log):
        path = urllib.parse.unquote(target.split("?", 1)[0]).lstrip("/")
        if method == "GET" and status.startswith("2") and "?" not in target and path.startswith(prefix):
            reads.append(path)
    return reads


def _wait_until_it_answers(server: subprocess.Popen, log_path: Path, timeout_s: float) -> str:
    """The endpoint, once the server has printed its port and answers ListBuckets there."""
    deadline = time.monotonic() + timeout_s
    endpoint = None
    while True:
        log = log_path.read_text(errors="replace")
        if endpoint is None and (found := RUNNING_ON.search(log)):
            endpoint = f"http://127.0.0.1:{found.group(1)}"
        if endpoint and _lists_buckets(endpoint):
            return endpoint
        if server.poll() is not None:
            raise RuntimeError(f"moto_server exited with code {server.returncode} before it answered. Its output:\n{log[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"moto_server did not answer an S3 request within {timeout_s:.0f}s. Its output:\n{log[-2000:]}")
        time.sleep(0.1)


def _lists_buckets(endpoint: str) -> bool:
    """True when `endpoint` answers an S3 ListBuckets (`GET /`) with its XML."""
    try:
        with urllib.request.urlopen(f"{endpoint}/", timeout=2) as response:
            return response.status == 200 and b"ListAllMyBucketsResult" in response.read()
    except OSError:
        return False


if __name__ == "__main__":
    with s3_server() as endpoint:
        input(f"S3 API at {endpoint} (AWS_ENDPOINT_URL={endpoint}); Enter stops it. ")
