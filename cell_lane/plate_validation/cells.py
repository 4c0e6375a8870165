"""The table as the checks see it: unique column names, stripped text, parsed numbers.

``Cells`` also knows how to point at a cell (data row, CSV line, well) in a message.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Sequence

import numpy as np
import pandas as pd

from .columns import ALLOWED_COLUMNS, NUMERIC_COLUMNS, TEXT_COLUMNS
from .reading import LINES_ATTR, file_suffix
from .text import and_join
from .violations import Violation

_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")
_MISSING_TOKENS = frozenset({"", "na", "n/a", "nan", "null", "none", "#n/a"})
_INFINITY_TOKENS = frozenset({"inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"})


@dataclass
class Cells:
    """The table as the checks see it, plus what is needed to point at a cell."""

    file: str
    frame: pd.DataFrame  # stripped text / float columns, extras untouched, RangeIndex
    raw_text: dict[str, list[str | None]]  # column -> each cell as written (stripped)
    lines: list[int] | None  # CSV line of each data row, if known

    def line(self, row: int) -> int | None:
        if self.lines is not None and 0 < row <= len(self.lines):
            return self.lines[row - 1]
        return None

    def where(self, row: int) -> str:
        line = self.line(row)
        return f"Row {row}" + (f" (line {line})" if line is not None else "")

    def rows_text(self, rows: Sequence[int]) -> str:
        text = "rows " + and_join([str(r) for r in rows])
        lines = [self.line(r) for r in rows]
        if all(line is not None for line in lines):
            text += " (lines " + and_join([str(line) for line in lines]) + ")"
        return text

    def cell(self, column: str, row: int) -> str | None:
        values = self.raw_text.get(column)
        return values[row - 1] if values is not None else None

    def violation(self, rule: str, row: int, column: str | None, message: str) -> Violation:
        return Violation(
            file=self.file,
            rule=rule,
            row=row,
            well=self.cell("well", row),
            column=column,
            plate_barcode=self.cell("plate_barcode", row),
            message=message,
        )


def line_numbers(table: pd.DataFrame, file: str) -> list[int] | None:
    """The CSV line of each data row: as the reader recorded it, else assumed (no blank lines)."""
    lines = table.attrs.get(LINES_ATTR)
    if isinstance(lines, list) and len(lines) == len(table):
        return [int(line) for line in lines]
    if file_suffix(file) == ".csv":
        return [row + 1 for row in range(1, len(table) + 1)]
    return None


def unique_columns(table: pd.DataFrame, file: str, violations: list[Violation]) -> pd.DataFrame:
    """Strip column names and keep the first of any duplicated column name (without ``attrs``)."""
    names = [str(name).strip() for name in table.columns]
    keep: list[int] = []
    first_seen: dict[str, int] = {}
    for position, name in enumerate(names):
        if name in first_seen:
            violations.append(
                Violation(
                    file=file,
                    rule="duplicate_column",
                    column=name,
                    message=(
                        f"Column '{name}' appears more than once in the header (columns "
                        f"{first_seen[name] + 1} and {position + 1}). Keep one column with "
                        "this name and remove or rename the other."
                    ),
                )
            )
            continue
        first_seen[name] = position
        keep.append(position)
    # pd.DataFrame(table) drops table.attrs: the CSV line numbers kept there have been read
    # already, and pandas would otherwise deep-copy them on every column access.
    result = pd.DataFrame(table).iloc[:, keep].copy()
    result.columns = [names[p] for p in keep]
    return result.reset_index(drop=True)


def prepare_cells(table: pd.DataFrame, file: str, lines: list[int] | None) -> Cells:
    """Normalise cells: strip text (empty -> missing), parse numbers (not a number -> NaN)."""
    frame = pd.DataFrame(index=pd.RangeIndex(len(table)))
    raw_text: dict[str, list[str | None]] = {}
    for column in table.columns:
        values = table[column].tolist()
        if column in TEXT_COLUMNS:
            texts = [to_text(value) for value in values]
            raw_text[column] = texts
            frame[column] = pd.Series(texts, dtype=object)
        elif column in NUMERIC_COLUMNS:
            raw_text[column] = [to_text(value) for value in values]
            frame[column] = pd.Series([parse_number(v)[0] for v in values], dtype=float)
        else:
            frame[column] = pd.Series(values, dtype=object)
    return Cells(file=file, frame=frame, raw_text=raw_text, lines=lines)


def to_text(value: Any) -> str | None:
    """A cell as stripped text; ``None`` for an empty or missing cell."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if math.isnan(value):
            return None
        if value.is_integer():
            return str(int(value))
    text = str(value).strip()
    return text or None


def parse_number(value: Any) -> tuple[float, bool]:
    """Return ``(number, is_number_or_missing)`` for one cell; the number is NaN when missing or not a number."""
    if value is None or value is pd.NA or value is pd.NaT:
        return math.nan, True
    if isinstance(value, (bool, np.bool_)):
        return math.nan, False
    if isinstance(value, (int, float, np.integer, np.floating, Decimal)):
        return float(value), True
    text = to_text(value)
    if text is None or text.lower() in _MISSING_TOKENS:
        return math.nan, True
    if text.lower() in _INFINITY_TOKENS:
        return (-math.inf if text.startswith("-") else math.inf), True
    if _NUMBER.match(text):
        return float(text), True
    return math.nan, False


def typed_table(cells: Cells) -> pd.DataFrame:
    """The plate columns present, with proper types, plus source_file and row."""
    frame = cells.frame
    typed = pd.DataFrame(index=frame.index)
    for column in ALLOWED_COLUMNS:
        if column not in frame.columns:
            continue
        if column == "replicate":
            values = frame[column]
            whole = values.where(np.isfinite(values) & (values == np.floor(values)))
            typed[column] = whole.astype("Int64")
        else:
            typed[column] = frame[column]
    typed["source_file"] = cells.file
    typed["row"] = np.arange(1, len(frame) + 1, dtype="int64")
    return typed
