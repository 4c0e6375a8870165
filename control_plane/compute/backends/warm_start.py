"""Warm starts: a local workload forked from an interpreter that has already imported its libraries.

A cold `python -m ENTRY` spends 2-5 CPU-seconds importing torch, safetensors and anndata before
the workload's first line: more than a short step's own work, paid again by every attempt a
process launches (the qualification probe, the step, its resumes after preemptions).
`start_process` hands a launch to a forkserver (`workload_runtime/forkserver.py`) that
imports the step's `StepSpec.imports` once and forks the workload from itself; it answers with
a `WarmProcess`, which the local backend uses as it would a `subprocess.Popen`.

One forkserver serves each interpreter and *start-up environment*: the variables an
interpreter or a native library reads while it loads (`PYTHON*`, `LD_*`, `OMP_*`, `CUDA_*`, ...,
`STARTUP_ENV_PREFIXES`). A launch whose start-up variables differ gets a forkserver of its own;
every other variable is the launch's own in the child. A forkserver lives as long as this
process (it exits when this process's end of its socket closes). `SINEWGRID_WARM_START=0`
starts every workload cold.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

import psutil

from control_plane.settings import REPO_ROOT, settings
from workload_runtime.allowed_env import allowed
from workload_runtime.forkserver import MAX_MESSAGE
from workload_runtime.node_env import EXTRAS_ENV

# Read by an interpreter or a native library as it loads: a child forked after the load cannot change them.
STARTUP_ENV_PREFIXES = (
    "PYTHON", "LD_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOTO", "TORCH", "CUDA", "NCCL", "NVIDIA", "MALLOC", "ARROW_", "NUMBA_", "NUMEXPR_",
)
# What every workload imports through `workload_runtime` (s3fs: for a storage root on S3).
RUNTIME_IMPORTS = ("numpy", "pydantic", "fsspec", "dagster_pipes", "s3fs")
# Imported by a library on first use rather than with it: `torch.optim`'s first step imports torch._dynamo (1-2 s).
COMPANIONS = {"torch": ("torch._dynamo",)}
# A process whose forkserver ended before it could report the exit status (it was killed): a failure.
LOST_RETURNCODE = 1


class WarmProcess:
    """The parts of `subprocess.Popen` the local backend uses, for a process a forkserver forked."""

    def __init__(self, args: Sequence[str], pid: int, server: ForkServer, create_time: float | None = None) -> None:
        self.args = list(args)
        self.pid = pid
        self.create_time = create_time  # read by the forkserver before the process could end
        self.returncode: int | None = None
        self._server = server

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            returncode = self._server.wait(self.pid, timeout)
            if returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = returncode
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:  # never signal a pid the forkserver has reaped: it may name another process now
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


Process = subprocess.Popen | WarmProcess  # what `start_process` hands back


class ForkServer:
    """One forkserver process and this process's end of its socket."""

    def __init__(self, interpreter: str, env: Mapping[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.process = subprocess.Popen(
                [interpreter, "-m", "workload_runtime.forkserver", str(theirs.fileno())],
                pass_fds=[theirs.fileno()], cwd=str(REPO_ROOT), env=dict(env), stdin=subprocess.DEVNULL,
            )
        self.sock = ours
        self.owner = os.getpid()
        self.alive = True
        self.refusal: str | None = None  # why it stopped forking (an import started a thread)
        self._send_lock = threading.Lock()
        self._changed = threading.Condition()
        self._started: dict[int, dict[str, Any]] = {}
        self._ended: dict[int, int] = {}
        self._next_id = 0
        threading.Thread(target=self._read, name="sinewgrid-forkserver-reader", daemon=True).start()

    def _read(self) -> None:
        try:
            while data := self.sock.recv(MAX_MESSAGE):
                message = json.loads(data)
                with self._changed:
                    if "id" in message:
                        self._started[message["id"]] = message
                    else:
                        self._ended[message["pid"]] = message["returncode"]
                    self._changed.notify_all()
        except OSError:
            pass
        with self._changed:
            self.alive = False
            self._changed.notify_all()

    def start(self, entry: str, args: Sequence[str], env: Mapping[str, str], cwd: str, output: IO[bytes] | None, imports: Sequence[str]) -> tuple[int, float | None] | None:
        """Fork `python -m entry *args`; its pid and start time, or None when this forkserver cannot (the caller starts it cold)."""
        with self._send_lock:
            self._next_id += 1
            request_id = self._next_id
            request = json.dumps({"id": request_id, "entry": entry, "args": list(args), "env": dict(env), "cwd": cwd, "imports": list(imports)}).encode()
            try:
                socket.send_fds(self.sock, [request], [output.fileno()] if output is not None else [])
            except OSError:
                self.alive = False
                return None
        with self._changed:
            self._changed.wait_for(lambda: request_id in self._started or not self.alive)
            reply = self._started.pop(request_id, {})
        if "pid" not in reply:
            self.alive = False
            self.refusal = reply.get("error")  # it said why and has ended
            return None
        return int(reply["pid"]), reply.get("create_time")

    def returncode(self, pid: int) -> int | None:
        with self._changed:
            if pid in self._ended:
                return self._ended.pop(pid)
            if not self.alive and not _running(pid):
                return LOST_RETURNCODE
            return None

    def wait(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._ended or not self.alive, timeout)
        if not self.alive:  # no exit status will come: watch the process itself (a zombie has ended)
            deadline = None if timeout is None else time.monotonic() + timeout
            while _running(pid):
                if deadline is not None and time.monotonic() > deadline:
                    return None
                time.sleep(0.05)
        return self.returncode(pid)

    def close(self) -> None:
        self.alive = False
        self.sock.close()  # the forkserver sees the end of its socket and exits; running children carry on
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


_servers: dict[tuple, ForkServer] = {}
_cold: set[tuple] = set()  # interpreters and start-up environments whose forkserver refused to fork
_servers_lock = threading.Lock()


def startup_env(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables of `env` that take effect when an interpreter starts (`STARTUP_ENV_PREFIXES`)."""
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(STARTUP_ENV_PREFIXES)))


def server_env(env: Mapping[str, str]) -> dict[str, str]:
    """A forkserver's own environment, from the launch that starts it: the allowed variables
    (`workload_runtime/allowed_env.py`) and nothing of that launch alone: no storage credentials,
    inputs or Pipes session, and none of its pool's own variables. Every workload it forks
    sees this environment in /proc/self/environ, whoever's it is (its own is set after the fork)."""
    return {k: v for k, v in env.items() if allowed(k) and k != EXTRAS_ENV}


def warm_imports(imports: Sequence[str]) -> list[str]:
    """What the forkserver imports ahead for a step that needs `imports`."""
    return [*RUNTIME_IMPORTS, *imports, *(c for name in imports for c in COMPANIONS.get(name, ()))]


def _server(interpreter: str, env: Mapping[str, str]) -> ForkServer | None:
    key = (interpreter, startup_env(env))
    with _servers_lock:
        if key in _cold:
            return None
        server = _servers.get(key)
        if server is not None and server.refusal:
            _cold.add(key)
            return None
        if server is None or not server.alive or server.owner != os.getpid():
            server = _servers[key] = ForkServer(interpreter, server_env(env))
        return server


def start_process(
    command: Sequence[str], *, env: Mapping[str, str], cwd: str, output: IO[bytes] | None, imports: Sequence[str] = ()
) -> Process:
    """Start `command` (`[python, "-m", entry, *args]`) warm when warm starts are on, else (or when the
    forkserver cannot) as a plain subprocess; stdout and stderr go to `output`."""
    if settings().warm_start and len(command) >= 3 and command[1] == "-m":
        server = _server(command[0], env)
        started = server.start(command[2], command[3:], env, cwd, output, warm_imports(imports)) if server else None
        if server and started is not None:
            return WarmProcess(command, started[0], server, started[1])
    return subprocess.Popen(command, cwd=cwd, env=dict(env), stdout=output, stderr=subprocess.STDOUT if output is not None else None)


@atexit.register
def _close_all() -> None:
    with _servers_lock:
        for server in _servers.values():
            if server.owner == os.getpid():
                server.close()
        _servers.clear()


def _forget_after_fork() -> None:
    """A forked copy of this process starts forkservers of its own (and must not wait on a lock
    another thread held at the fork)."""
    global _servers_lock
    _servers_lock = threading.Lock()
    _servers.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
