"""Warm starts: a workload forked from the local backend's warm interpreter runs as `python -m` would.

The workload here is a module written to the test's folder and run with that folder as its
working directory, so `sys.path[0]`, editing it between two launches and every exit path are
the real thing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from control_plane.compute.backends import warm_start
from control_plane.compute.backends.warm_start import WarmProcess, start_process
from control_plane.settings import child_env

REPORTER = """
import json, os, sys
print(json.dumps({
    "name": __name__, "argv0": sys.argv[0], "args": sys.argv[1:], "cwd": os.getcwd(), "path0": sys.path[0], "answer": os.environ.get("ANSWER"),
    "preloaded": "wave" in sys.modules, "pid": os.getpid(), "version": VERSION, "comm": open("/proc/self/comm").read().strip(),
}))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("EXIT", "0")))
"""


def _workload(folder: Path, version: int = 1) -> str:
    path = folder / "reporter.py"
    path.write_text(f"VERSION = {version}\n" + REPORTER)
    # Python checks a module's cached bytecode against its source's mtime (in whole seconds) and
    # size: rewritten within the same second at the same size, a module whose bytecode was cached
    # (PYTHONDONTWRITEBYTECODE unset) would run its old code. An edit by hand comes seconds later.
    stamp = time.time() + 2 * version
    os.utime(path, (stamp, stamp))
    return "reporter"


def _run(folder: Path, entry: str, imports: tuple[str, ...] = ("wave",), args: tuple[str, ...] = (), **env: str) -> tuple[subprocess.Popen | WarmProcess, int, dict, str]:
    log = folder / f"log-{len(list(folder.glob('log-*')))}.txt"
    with log.open("wb") as output:
        process = start_process([sys.executable, "-m", entry, *args], env=child_env(env), cwd=str(folder), output=output, imports=imports)
        code = process.wait(timeout=120)
    text = log.read_text()
    first = text.splitlines()[0] if text.strip() else "{}"
    return process, code, json.loads(first) if first.startswith("{") else {}, text


def test_a_warm_workload_runs_as_python_dash_m_would(tmp_path: Path):
    entry = _workload(tmp_path)
    process, code, seen, log = _run(tmp_path, entry, args=("--extras", "x y.json"), ANSWER="42")
    assert isinstance(process, WarmProcess) and code == 0
    assert seen["name"] == "__main__" and seen["argv0"] == str(tmp_path / "reporter.py") and seen["args"] == ["--extras", "x y.json"]
    assert seen["cwd"] == str(tmp_path) and seen["path0"] == str(tmp_path)
    assert seen["answer"] == "42" and seen["pid"] == process.pid
    assert seen["comm"] == "reporter"  # what `top` shows for it
    assert seen["preloaded"], "the step's imports (here the standard library's `wave`) were imported ahead, in the forkserver"
    assert "to stderr" in log  # stdout and stderr both in the attempt's log


def test_exit_codes_come_back_as_popen_reports_them(tmp_path: Path):
    entry = _workload(tmp_path)
    assert _run(tmp_path, entry, EXIT="75")[1] == 75  # a preempted workload's code
    (tmp_path / "crash.py").write_text("raise RuntimeError('boom in the workload')\n")
    _, code, _, log = _run(tmp_path, "crash")
    assert code == 1 and "RuntimeError: boom in the workload" in log
    (tmp_path / "sleeper.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    with (tmp_path / "sleeper.log").open("wb") as output:
        process = start_process([sys.executable, "-m", "sleeper"], env=child_env(), cwd=str(tmp_path), output=output, imports=())
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=0.5)
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == -signal.SIGTERM
    process.kill()  # an ended process is never signalled again (its pid may name another process now)


def test_a_workload_ends_as_the_interpreter_ends(tmp_path: Path):
    """The child skips the teardown of every module, not the end of its work: a running
    non-daemon thread is joined, `atexit` handlers run, buffered output is flushed."""
    (tmp_path / "ending.py").write_text(
        "import atexit, sys, threading, time\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.5), print('thread finished'))).start()\n"
        "sys.stdout.write('buffered, no newline')\n"
        "sys.exit('a message for stderr')\n"
    )
    _, code, _, log = _run(tmp_path, "ending")
    assert code == 1  # sys.exit with a message: printed, exit 1
    for said in ("atexit ran", "thread finished", "buffered, no newline", "a message for stderr"):
        assert said in log
    (tmp_path / "interrupted.py").write_text("raise KeyboardInterrupt\n")
    _, code, _, log = _run(tmp_path, "interrupted")
    assert code == -signal.SIGINT and "KeyboardInterrupt" in log  # as a cold interpreter ends on an uncaught ^C


def test_an_edited_workload_runs_its_new_code(tmp_path: Path):
    """Only third-party libraries are imported ahead: the project's code is read at each start."""
    entry = _workload(tmp_path, version=1)
    assert _run(tmp_path, entry)[2]["version"] == 1
    _workload(tmp_path, version=2)
    assert _run(tmp_path, entry)[2]["version"] == 2


def _server_for(**env: str) -> warm_start.ForkServer:
    return warm_start._servers[(sys.executable, warm_start.startup_env(child_env(env)))]


def test_one_forkserver_per_startup_environment(tmp_path: Path):
    entry = _workload(tmp_path)
    _run(tmp_path, entry, ANSWER="1")
    first = _server_for(ANSWER="1")
    _run(tmp_path, entry, ANSWER="2")
    assert _server_for(ANSWER="2") is first  # an ordinary variable: the same forkserver
    _run(tmp_path, entry, PYTHONHASHSEED="7")
    assert _server_for(PYTHONHASHSEED="7").process.pid != first.process.pid  # read as the interpreter starts: its own
    assert warm_start.startup_env({"PYTHONHASHSEED": "7", "ANSWER": "1"}) == (("PYTHONHASHSEED", "7"),)


def test_cold_starts_when_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SINEWGRID_WARM_START", "0")
    process, code, seen, _ = _run(tmp_path, _workload(tmp_path))
    assert isinstance(process, subprocess.Popen) and code == 0 and not seen["preloaded"]


def test_a_workload_outlives_a_lost_forkserver_and_reads_as_failed(tmp_path: Path):
    """A forkserver killed under a running workload cannot report its exit status: once the
    workload has ended it reads as a failure, never as a success."""
    (tmp_path / "waiter.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(2)\n")
    with (tmp_path / "waiter.log").open("wb") as output:
        env = child_env({"PYTHONHASHSEED": "11"})  # a forkserver of this test's own
        process = start_process([sys.executable, "-m", "waiter"], env=env, cwd=str(tmp_path), output=output, imports=())
        assert isinstance(process, WarmProcess)
        server = _server_for(PYTHONHASHSEED="11")
        server.process.kill()
        assert process.wait(timeout=60) == warm_start.LOST_RETURNCODE
    assert not server.alive
    again, code, _, _ = _run(tmp_path, _workload(tmp_path), PYTHONHASHSEED="11")  # a new forkserver takes over
    assert isinstance(again, WarmProcess) and code == 0


def test_a_workload_has_a_fresh_interpreters_sigterm(tmp_path: Path):
    """A forkserver started while this process ignored SIGTERM (what Dagster's in-process runs
    leave behind where SIGINT is ignored) still forks workloads that SIGTERM stops."""
    (tmp_path / "sleeper.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with (tmp_path / "sleeper.log").open("wb") as output:
            process = start_process([sys.executable, "-m", "sleeper"], env=child_env({"PYTHONHASHSEED": "13"}), cwd=str(tmp_path), output=output, imports=())
    finally:
        signal.signal(signal.SIGTERM, before)
    assert isinstance(process, WarmProcess)
    process.terminate()
    assert process.wait(timeout=60) == -signal.SIGTERM


def test_a_workload_that_ends_at_once_still_has_its_handle(tmp_path: Path):
    """The forkserver reaps a child the moment it ends, so its start time (what tells it from a
    later process with the same pid) comes with its pid, not from a later look in /proc."""
    import psutil

    from control_plane.catalog.pools import Pool
    from control_plane.compute.backends.base import JobState
    from control_plane.compute.backends.local import LocalBackend

    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(300)\n")
    with (tmp_path / "sleeper.log").open("wb") as output:
        sleeper = start_process([sys.executable, "-m", "sleeper"], env=child_env(), cwd=str(tmp_path), output=output, imports=())
    assert sleeper.create_time == psutil.Process(sleeper.pid).create_time()  # as psutil reckons it
    sleeper.kill()
    (tmp_path / "quick.py").write_text("")
    with (tmp_path / "quick.log").open("wb") as output:
        quick = start_process([sys.executable, "-m", "quick"], env=child_env(), cwd=str(tmp_path), output=output, imports=())
    assert quick.wait(timeout=60) == 0 and not psutil.pid_exists(quick.pid)  # ended and reaped
    pool = Pool.model_validate({"name": "here", "provider": "local", "region": "local", "backend": "local", "purchasing": "on_demand", "accelerator": "local", "gpus_per_node": 1, "price_per_gpu_hour": 0})
    handle = LocalBackend.handle_for(pool, quick.pid, quick.create_time)
    assert LocalBackend().status(handle).state is JobState.gone
