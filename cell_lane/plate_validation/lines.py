"""Which line of a CSV file each data row came from, worked out only when a message needs it.

The fast reader (pyarrow) does not report line numbers, and a valid file never needs
them. When a violation is reported, the lines are recovered once for the whole file:
with numpy over the bytes when no field is quoted (a line is blank when it holds only
commas and white space), else with Python's ``csv`` module, which knows where a quoted
field spans several lines.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from .strict_csv import record_lines

_BLANK_BYTES = np.frombuffer(b" \t\r\n\x0b\x0c,", dtype=np.uint8)


class LineLookup:
    """The CSV line of each data row (1-based rows), known up front or computed on first use."""

    def __init__(
        self,
        *,
        lines: Sequence[int] | None = None,
        data: bytes | None = None,
    ) -> None:
        self._lines: Sequence[int] | None = lines
        self._data = data
        self._lock = threading.Lock()  # the cell and plate rules may ask at once

    @classmethod
    def assumed(cls, rows: int) -> LineLookup:
        """One header line, then one line per data row (a table that did not come from bytes)."""
        return cls(lines=range(2, rows + 2))

    def line(self, row: int) -> int | None:
        """The line of data row ``row`` (1-based), or None when it cannot be known."""
        lines = self._all()
        if 0 < row <= len(lines):
            return int(lines[row - 1])
        return None

    def all(self) -> list[int]:
        return [int(line) for line in self._all()]

    def _all(self) -> Sequence[int]:
        with self._lock:
            if self._lines is None:
                self._lines = _data_row_lines(self._data or b"")
                self._data = None
            return self._lines


def _data_row_lines(data: bytes) -> Sequence[int]:
    """The line of each non-blank line after the header line."""
    lone_cr = data.count(b"\r") != data.count(b"\r\n")
    if b'"' in data or lone_cr:
        return record_lines(
            data.decode("utf-8", errors="replace").removeprefix("\ufeff")
        )
    raw = np.frombuffer(data, dtype=np.uint8)
    starts = np.concatenate(([0], np.flatnonzero(raw == ord("\n")) + 1))
    starts = starts[starts < raw.size]
    content = (~np.isin(raw, _BLANK_BYTES)).view(np.uint8)
    per_line = np.add.reduceat(content, starts, dtype=np.int64)
    non_blank = np.flatnonzero(per_line > 0) + 1  # 1-based line numbers
    return non_blank[1:]  # the first non-blank line is the header
