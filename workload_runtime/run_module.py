"""`python -u -m MODULE ARGS` inside a process that already exists: a rank that torchrun forks.

`torchrun --start-method=fork --run-path workload_runtime/run_module.py MODULE ARGS` has torch
elastic's agent fork each rank from itself and run this file in it, rather than start a new
interpreter per rank (`control_plane/compute/backends/gang.py`): a rank then inherits what the agent
imported (torch, torch._dynamo, the step's libraries: ~3 CPU-s a rank). What this file gives the
rank is what a fresh `python -u -m MODULE` has: the signal dispositions of a new interpreter (the
agent's handlers, which turn SIGTERM into an exception, are not the workload's), output written
line by line, and MODULE run as `__main__` with `sys.argv` = [its file, *ARGS], as the forkserver
runs a workload (`forkserver.run`). Its exit status is the module's: `sys.exit(75)` ends the rank
with 75, as it would a process of its own.

A forked rank's command line and starting environment (/proc/PID/cmdline, /proc/PID/environ) are
its agent's, so it names itself `rank<RANK>` (/proc/PID/comm: what `top` and `ps -o comm` show,
and how `drills/faults.py` finds it among its launcher's descendants).

Standard library only (and `forkserver` and `node_env`, which are too).
"""

from __future__ import annotations

import contextlib
import signal
import sys

from workload_runtime.forkserver import run
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


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: run_module.py MODULE [ARGS...]")
    become_fresh_interpreter()
    module, sys.argv = sys.argv[1], sys.argv[1:]
    run(module)  # a rank that ends badly ends there; one that succeeds returns to torch elastic,
    # which waits for every rank's return value
