"""The `hold` failpoint: a workload announces that it reached a unit of work and waits there.

A fault injected from outside (a signal, a pool taken away, a node marked unhealthy) has to
land on a run that is still going, at a known point of it. Timing it from outside ("a moment
after the checkpoint") races the machine's speed: a fast run finishes first, a slow one is hit
elsewhere. With `Failpoint(kind="hold")` in its inputs the workload itself says where it is:
it publishes `marker` and waits, so the injector fires on an event it can see. See `Failpoint`
in `inputs.py` for the contract; the torn-checkpoint failpoint lives with the checkpoint writer.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from workload_runtime.inputs import Failpoint

POLL_SECONDS = 0.01


def _publish_once(path: str, record: dict) -> bool:
    """Create `path` holding `record`, whole (a reader never sees half of it); False if it exists."""
    staging = f"{path}.{os.getpid()}.tmp"
    with open(staging, "w") as fh:
        fh.write(json.dumps(record))
    try:
        os.link(staging, path)  # fails if `path` exists: once, even between two processes
    except FileExistsError:
        return False
    finally:
        os.unlink(staging)
    return True


def hold(failpoint: Failpoint | None, step: int, *, reports: int, stop: Callable[[], bool]) -> bool:
    """Wait at `step` if an armed `hold` failpoint says so; True when it held (once).

    `reports`: the step-time reports the workload has sent; `stop`: whether SIGTERM arrived
    (the wait ends at once, and the workload goes on to its preemption checkpoint).
    """
    if failpoint is None or failpoint.kind != "hold" or step < failpoint.at_step or reports < failpoint.after_reports:
        return False
    if os.path.exists(failpoint.marker):
        return False  # held once already (an earlier attempt)
    if not _publish_once(failpoint.marker, {"step": step, "pid": os.getpid(), "at": time.time(), "reports": reports}):
        return False
    deadline = time.monotonic() + failpoint.hold_seconds
    while not stop() and not os.path.exists(failpoint.release) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    return True
