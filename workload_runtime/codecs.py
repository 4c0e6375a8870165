"""What the video encoder does to the process that runs it, undone where frames are encoded.

SVT-AV1 (the AV1 encoder in PyAV's wheel, which LeRobot records with):

- prints about twenty lines of settings to stderr each time an encoder opens, unless `SVT_LOG`
  says otherwise; in a demo or a workload's log that drowns what matters. `quiet_video_encoders()`
  keeps it to errors, unless the user has set `SVT_LOG` themselves.
- run as root (as a container often is), moves the thread that opens an encoder, and the threads
  it starts, to real-time scheduling (SCHED_FIFO at the top priority), and leaves them there. The
  process then outranks everything else on the machine, and so does every process it starts later
  (they inherit it): a Dagster run, a workload or a test worker that wrote one video would starve
  its own node. Measured here: `os.sched_getscheduler(0)` is 0 (SCHED_OTHER) before an encode and
  1 (SCHED_FIFO) after. `keep_scheduling()` puts every thread of the process back on the policy it
  had, once the encoder is open and again when it is done.
"""

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

SVT_ERRORS_ONLY = "1"
THREADS = Path("/proc/self/task")


def quiet_video_encoders() -> None:
    """Keep SVT-AV1's per-encoder banner out of stderr (errors still show); a user's SVT_LOG wins."""
    # Written, not read: the encoder's C library reads SVT_LOG from the process environment.
    os.environ.setdefault("SVT_LOG", SVT_ERRORS_ONLY)


@contextlib.contextmanager
def keep_scheduling() -> Iterator[Callable[[], None]]:
    """Around an encoder's life: yields `restore`, which puts every thread of this process back on
    the calling thread's scheduling policy and priority as they were on entry; it also runs on exit.
    A no-op where the platform has no per-thread scheduling calls (not Linux)."""
    if not hasattr(os, "sched_getscheduler") or not THREADS.is_dir():
        yield lambda: None
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)

    def restore() -> None:
        for task in THREADS.iterdir():
            with contextlib.suppress(OSError):  # a thread that has ended since the listing
                if os.sched_getscheduler(int(task.name)) != policy:
                    os.sched_setscheduler(int(task.name), policy, param)

    try:
        yield restore
    finally:
        restore()
