"""Signal handling for processes that run Dagster jobs in process (`sinewgrid tick`, `demo`, `drill`).

Dagster's in-process execution points SIGINT and SIGTERM at its own handler while a run executes
and, after it, sets both back to SIGINT's original handler (`dagster/_utils/interrupts.py`). In
a process that ignores SIGINT (started in the background by a script), SIGTERM is then ignored
too: `kill` no longer stops it, and every process it starts afterwards (an engine, a plain
child) inherits the ignored SIGTERM across exec. `sigterm_kept` puts SIGTERM back after a run.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def sigterm_kept() -> Iterator[None]:
    """Run the body (an in-process Dagster run), then put SIGTERM back as it was."""
    if threading.current_thread() is not threading.main_thread():
        yield  # Dagster changes no handler off the main thread either
        return
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)
