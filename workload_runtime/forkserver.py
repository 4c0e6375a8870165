"""The warm interpreter: imports a workload's libraries once, then forks each workload from itself.

`python -m workload_runtime.forkserver FD` serves the local backend on the Unix socket
`FD` (`control_plane/compute/backends/warm_start.py` starts it and talks to it). Each request
is one JSON message, with the attempt's log file attached as a file descriptor:

    {"id": 7, "entry": "cell_lane.workloads.pretrain", "args": [], "env": {...}, "cwd": "...", "imports": ["torch", "anndata"]}

The server imports `imports` it has not imported yet (what a cold start spends its first
seconds on), forks, and answers `{"id": 7, "pid": 1234}`; when the child ends it says
`{"pid": 1234, "returncode": 75}`, negative for a signal, as `subprocess.Popen` would.

The child is the workload as `python -m ENTRY ARGS` would run it: its own environment, working
directory, `sys.argv` and `sys.path[0]`, stdout and stderr into the log, the signal handlers a
fresh interpreter has, the module run as `__main__`, and the interpreter's exit (`finish`). Only
third-party libraries are imported ahead; the project's own code (the workload, `workload_runtime`)
is read from disk by each child, so an edit takes effect at the next step as with a cold start.

The standard library's `multiprocessing.forkserver` forks from a warm process too, but it
runs a pickled function and prepares the parent's `__main__` in each child; a workload needs
`python -m` semantics. Standard library only: this runs before anything is imported.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import threading
from typing import Any, NoReturn

MAX_MESSAGE = 1 << 20


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.send(json.dumps(message).encode())


def _preload(modules: list[str], imported: set[str]) -> str | None:
    """Import `modules` here once; a module that fails is left for the child to fail on, in its
    own log. Returns why forking is no longer safe (an import started a Python thread), else None."""
    for name in modules:
        if name in imported:
            continue
        imported.add(name)
        with contextlib.suppress(Exception):  # the workload's own import reports it, in its log
            importlib.import_module(name)
    if threading.active_count() > 1:
        return f"importing {', '.join(sorted(imported))} started a thread; forking from this interpreter is not safe"
    return None


def _reap(sock: socket.socket) -> None:
    """Report every child that has ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"pid": pid, "returncode": os.waitstatus_to_exitcode(status)})


def serve(sock: socket.socket) -> tuple[dict[str, Any], int | None] | None:
    """Answer requests until the other end closes (None). In a forked child, returns its request
    and its log's descriptor instead."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wake-up fd hears it
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C in the terminal reaches the workloads, not the server
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # even if the process that started it ignored SIGTERM then
    signal.set_wakeup_fd(wake_w)
    imported: set[str] = set()
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        selector.register(wake_r, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj == wake_r:
                    _drain(wake_r)
                    _reap(sock)
                    continue
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 1)
                if not data:
                    return None  # the backend's process has ended: running children carry on
                request = json.loads(data)
                log_fd = fds[0] if fds else None
                if unsafe := _preload(list(request.get("imports", [])), imported):
                    _send(sock, {"id": request["id"], "error": unsafe})
                    return None
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    for fd in (wake_r, wake_w):
                        os.close(fd)
                    sock.close()
                    return request, log_fd
                if log_fd is not None:
                    os.close(log_fd)
                # Its start time, read before it can end and be reaped: the backend tells it from a
                # later process with the same pid by it.
                _send(sock, {"id": request["id"], "pid": pid, "create_time": create_time(pid)})


def create_time(pid: int) -> float | None:
    """When `pid` started, in seconds since the epoch, as psutil reckons it (boot time plus the
    start tick in /proc); None off Linux."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as machine:
            boot = next(int(line.split()[1]) for line in machine if line.startswith("btime"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def become_workload(request: dict[str, Any], log_fd: int | None) -> NoReturn:
    """Turn this forked child into `python -m ENTRY ARGS` as the request describes it, and run it."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # A fresh interpreter's SIGTERM, whatever the launching process had when this server started
    # (Dagster's in-process runs leave SIGTERM ignored in a process that ignores SIGINT).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if log_fd is not None:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:  # `top` names the workload
        comm.write(request["entry"].rsplit(".", 1)[-1][:15])
    os.chdir(request["cwd"])
    # The child is the workload its launcher asked for, with the launcher's environment, not this
    # server's: it is written here, before anything reads it (through node_env, as everywhere).
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = request["cwd"]  # what `python -m` puts first
    sys.argv = [request["entry"], *request.get("args", [])]
    run(request["entry"])
    finish(0)


def run(entry: str) -> None:
    """Run `entry` as `__main__` and return if it succeeds. One that ends badly (`sys.exit(75)`
    after a preemption, an exception) ends here with the exit status the interpreter would give it
    (`finish`), still inside the handler, so nothing it made is torn down first: freeing a
    preempted torch rank's DDP model destroys its Gloo process group, which was seen to wait 30 s
    on a peer that had already left."""
    try:
        runpy.run_module(entry, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or exc.code == 0:
            return
        if not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        finish(exc.code if isinstance(exc.code, int) else 1)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        finish(-signal.SIGINT)
    except BaseException:  # noqa: BLE001 - reported as an uncaught exception is, exit 1
        sys.excepthook(*sys.exc_info())
        finish(1)


def finish(code: int) -> NoReturn:
    """End as the interpreter ends (non-daemon threads joined, `atexit` handlers run, output
    flushed), without tearing down every module one by one: in a forked child that teardown
    writes to every page the child shares with the server, about 1.5 s of copying for torch.
    `multiprocessing` ends its children the same way."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if code == -signal.SIGINT:  # an uncaught ^C ends a Python process by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


if __name__ == "__main__":
    child = serve(socket.socket(fileno=int(sys.argv[1])))
    if child is None:
        sys.exit(0)
    become_workload(*child)
