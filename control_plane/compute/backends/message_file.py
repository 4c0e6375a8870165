"""Reading a workload's Pipes messages from a file, one whole line at a time.

Dagster's `PipesFileMessageReader` parses each line as soon as `readline()` returns it, and
at the end of a file that a workload is still writing, `readline()` returns the part of the
line written so far. On a busy machine the writer's line is sometimes split between two
writes; the reader then fails on half a message ("Unterminated string"), stops reading, and
the step loses every later message, its result among them. `WholeLineMessageReader` waits
for the newline before it parses; `WholeLineTempFileMessageReader` does the same in a file
of its own in a temporary folder (what the local backend's subprocess client uses).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from threading import Event

import dagster as dg

# A line is read within POLL_SECONDS of its writing while messages flow; an idle file is looked
# at every MAX_POLL_SECONDS (a reader per running step, so idle polling is CPU the machine loses).
POLL_SECONDS = 0.01
MAX_POLL_SECONDS = 0.1


def whole_lines(path: str, should_stop: Callable[[], bool]) -> Iterator[str]:
    """The lines of the file at `path` as it grows, each once its newline is written, until
    `should_stop()` and nothing more is there (a last line with no newline is given then)."""
    partial = ""
    pause = POLL_SECONDS
    with open(path, encoding="utf-8") as stream:
        while True:
            partial += stream.readline()
            if partial.endswith("\n"):
                yield partial
                partial = ""
                pause = POLL_SECONDS
            elif should_stop():
                if partial.strip():
                    yield partial
                return
            else:
                time.sleep(pause)
                pause = min(2 * pause, MAX_POLL_SECONDS)


class WholeLineMessageReader(dg.PipesFileMessageReader):
    """`PipesFileMessageReader` that parses a message only once its whole line is written."""

    def _reader_thread(self, handler, is_resource_complete: Event) -> None:
        try:
            for line in whole_lines(self._path, is_resource_complete.is_set):
                handler.handle_message(json.loads(line))
        except:  # noqa: E722 - reported to Dagster as the base class does, then raised
            handler.report_pipes_framework_exception(f"{self.__class__.__name__} reader thread", sys.exc_info())
            raise


class WholeLineTempFileMessageReader(dg.PipesTempFileMessageReader):
    """Dagster's `PipesTempFileMessageReader` (a messages file in a temporary folder, removed
    with it), read with `WholeLineMessageReader`."""

    @contextmanager
    def read_messages(self, handler) -> Iterator[dg.PipesParams]:
        with tempfile.TemporaryDirectory(prefix="sinewgrid-pipes-") as folder:
            reader = WholeLineMessageReader(os.path.join(folder, "messages"), include_stdio_in_messages=self._include_stdio_in_messages)
            with reader.read_messages(handler) as params:
                yield params
