"""`python -u -m MODULE ARGS` inside a process that already exists: a rank that torchrun forks.

`torchrun --start-method=fork --run-path workload_runtime/run_module.py MODULE ARGS` has torch
elastic's agent fork each rank from itself and run this file in it, rather than start a new
interpreter per rank (`control_plane/compute/backends/gang.py`): a rank then inherits what the agent
imported (torch, torch._dynamo, the step's libraries: ~3 CPU-s a rank). What this file gives the
rank is what a fresh `python -u -m MODULE` has: the signal dispositions of a new interpreter (the
agent's handlers, which turn SIGTERM into an exception, are not the workload's), output written
line by line, and MODULE run as `__main__` with `sys.argv` = [its file, *ARGS]. Its exit status is
the module's: `sys.exit(75)` ends the rank with 75, as it would a process of its own.

A forked rank's command line and starting environment (/proc/PID/cmdline, /proc/PID/environ) are
its agent's, so it names itself `rank<RANK>` (/proc/PID/comm: what `top` and `ps -o comm` show,
and how `drills/faults.py` finds it among its launcher's descendants).

Standard library only (and `forkserver` and `node_env`, which are too).
"""

from __future__ import annotations

import contextlib
import runpy
import signal
import sys

from workload_runtime.forkserver import finish
from workload_runtime.node_env import node_env


def become_fresh_interpreter() -> None:
    """A new interpreter's signal handlers, `-u`'s line-at-once output and the rank's name, in a forked process."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    for name, fd in (("stdout", 1), ("stderr", 2)):
        getattr(sys, name).flush()
        setattr(sys, name, open(fd, "w", buffering=1, closefd=False, errors="backslashreplace"))  # noqa: SIM115 - the process's own streams
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(f"rank{node_env().gang.get('RANK', '')}"[:15])


def run_rank(module: str) -> None:
    """Run `module` as `__main__`. A rank that ends badly (`sys.exit(75)` after a preemption, an
    exception) ends here as an interpreter ends (threads joined, `atexit` run, output flushed,
    `forkserver.finish`), still inside the handler, so nothing the module made is torn down: freeing
    a preempted rank's DDP model destroys its Gloo process group, which was seen to wait 30 s on a
    peer that had already left, until the agent killed it. A rank that succeeds returns to torch
    elastic, which waits for every rank's return value."""
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
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


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: run_module.py MODULE [ARGS...]")
    become_fresh_interpreter()
    module, sys.argv = sys.argv[1], sys.argv[1:]
    run_rank(module)
