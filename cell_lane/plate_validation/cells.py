"""The table as the checks see it: unique column names, stripped text, parsed numbers.

Everything here works on whole Arrow columns (pyarrow.compute, numpy); Python touches
a single cell only to quote it in a message. ``Cells`` also knows how to point at a
cell (data row, CSV line, well) in a message.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .columns import ALLOWED_COLUMNS, NUMERIC_COLUMNS, TEXT_COLUMNS
from .lines import LineLookup
from .text import and_join
from .text_cells import PlainText, Text, coded_text, plain_strings, stripped, to_text
from .violations import Violation

# A plain decimal number: digits with an optional '.', sign and exponent (ASCII digits only).
NUMBER_PATTERN = r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$"
MISSING_TOKENS = ("", "na", "n/a", "nan", "null", "none", "#n/a")
INFINITY_TOKENS = ("inf", "+inf", "-inf", "infinity", "+infinity", "-infinity")
#: Text columns with (nearly) one value per row: kept as strings, not coded. The others
#: (barcodes, wells, sample types) repeat a few values and are coded for the plate rules.
PLAIN_TEXT_COLUMNS = ("perturbation",)


@dataclass
class Number:
    """One numeric column: its values (NaN when missing or not a number) and where they are not numbers."""

    values: np.ndarray  # float64
    not_number: np.ndarray  # bool
    written: pa.Array | None  # the cells as written (stripped), when the file held text


@dataclass
class Cells:
    """The table as the checks see it, plus what is needed to point at a cell."""

    file: str
    rows: int
    columns: list[str]  # unique, stripped, in file order
    text: dict[str, Text | PlainText] = field(default_factory=dict)
    numbers: dict[str, Number] = field(default_factory=dict)
    lines: LineLookup | None = None

    def line(self, row: int) -> int | None:
        return self.lines.line(row) if self.lines is not None else None

    def where(self, row: int) -> str:
        line = self.line(row)
        return f"Row {row}" + (f" (line {line})" if line is not None else "")

    def rows_text(self, rows: Sequence[int]) -> str:
        text = "rows " + and_join([str(r) for r in rows])
        lines = [self.line(r) for r in rows]
        if all(line is not None for line in lines):
            text += " (lines " + and_join([str(line) for line in lines]) + ")"
        return text

    def equals(self, column: str, value: str) -> np.ndarray:
        """Rows whose text ``column`` is exactly ``value`` (all false without the column)."""
        if column not in self.text:
            return np.zeros(self.rows, dtype=bool)
        return self.text[column].equals(value)

    def cell(self, column: str, row: int) -> str | None:
        """Cell ``row`` (1-based) of ``column`` as written (stripped); None when empty."""
        if column in self.text:
            return self.text[column].at(row)
        number = self.numbers.get(column)
        if number is None:
            return None
        if number.written is not None:
            return number.written[row - 1].as_py()
        return to_text(number.values[row - 1])

    def violation(
        self, rule: str, row: int, column: str | None, message: str
    ) -> Violation:
        return Violation(
            file=self.file,
            rule=rule,
            row=row,
            well=self.cell("well", row),
            column=column,
            plate_barcode=self.cell("plate_barcode", row),
            message=message,
        )


def prepare_cells(table: pa.Table, file: str, lines: LineLookup | None) -> Cells:
    """Normalise a table of unique columns: strip text (empty -> missing), parse numbers (not a number -> NaN)."""
    cells = Cells(
        file=file, rows=table.num_rows, columns=list(table.column_names), lines=lines
    )
    for name, column in zip(table.column_names, table.columns):
        if name in TEXT_COLUMNS:
            plain = name in PLAIN_TEXT_COLUMNS and (
                pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
            )
            cells.text[name] = PlainText(column) if plain else coded_text(column)
        elif name in NUMERIC_COLUMNS:
            cells.numbers[name] = _number(column)
    return cells


def _number(column: pa.ChunkedArray) -> Number:
    if pa.types.is_float64(
        column.type
    ):  # parsed by the reader: one copy into numpy, nulls as NaN
        return Number(column.to_numpy(), np.zeros(len(column), dtype=bool), None)
    array = column.combine_chunks()
    kind = array.type
    if pa.types.is_dictionary(kind):
        array, kind = array.cast(kind.value_type), kind.value_type
    rows = len(array)
    if (
        pa.types.is_floating(kind)
        or pa.types.is_integer(kind)
        or pa.types.is_decimal(kind)
    ):
        values = pc.cast(array, pa.float64()).to_numpy(zero_copy_only=False)
        return Number(
            values.astype(np.float64, copy=False), np.zeros(rows, dtype=bool), None
        )
    if pa.types.is_null(kind):
        return Number(np.full(rows, np.nan), np.zeros(rows, dtype=bool), None)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return parse_numbers(stripped(plain_strings(column)))
    parsed = [
        parse_number(value) for value in array.to_pylist()
    ]  # booleans, dates, …: rare
    written = pa.array([to_text(value) for value in array.to_pylist()], pa.string())
    values = np.array([number for number, _ in parsed], dtype=np.float64)
    return Number(values, np.array([not ok for _, ok in parsed], dtype=bool), written)


def parse_numbers(written: pa.Array) -> Number:
    """Parse stripped text cells (null = empty) as numbers, all at once.

    Missing: empty or one of ``MISSING_TOKENS`` (any case) -> NaN. Infinity spelt
    ``inf``/``infinity`` with a sign -> ±inf (the range check reports it). Anything
    else that is not a plain decimal number is flagged as not a number.
    """
    lower = pc.utf8_lower(written)
    missing = pc.or_(
        pc.is_null(written),
        pc.fill_null(pc.is_in(lower, value_set=pa.array(MISSING_TOKENS[1:])), False),
    )
    infinite = pc.fill_null(pc.is_in(lower, value_set=pa.array(INFINITY_TOKENS)), False)
    plain = pc.fill_null(pc.match_substring_regex(written, NUMBER_PATTERN), False)
    values = pc.cast(
        pc.if_else(plain, written, pa.scalar(None, pa.string())), pa.float64()
    )
    numbers = values.to_numpy(zero_copy_only=False).astype(np.float64, copy=True)
    infinite_at = np.asarray(infinite.to_numpy(zero_copy_only=False), dtype=bool)
    if infinite_at.any():
        negative = np.asarray(
            pc.fill_null(pc.starts_with(written, "-"), False).to_numpy(
                zero_copy_only=False
            ),
            dtype=bool,
        )
        numbers[infinite_at] = np.where(negative[infinite_at], -math.inf, math.inf)
    ok = pc.or_(pc.or_(missing, infinite), plain)
    not_number = ~np.asarray(ok.to_numpy(zero_copy_only=False), dtype=bool)
    return Number(numbers, not_number, written)


def unique_columns(table: pa.Table, file: str, violations: list[Violation]) -> pa.Table:
    """Strip column names and keep the first of any duplicated column name."""
    names = [str(name).strip() for name in table.column_names]
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
    return pa.Table.from_arrays(
        [table.column(p) for p in keep], names=[names[p] for p in keep]
    )


def arrow_from_frame(frame: pd.DataFrame) -> pa.Table:
    """A pandas table as Arrow, column by column; a column of mixed Python values becomes text."""
    columns = []
    for position in range(frame.shape[1]):
        values = frame.iloc[:, position]
        try:
            columns.append(pa.array(values, from_pandas=True))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            columns.append(
                pa.array([to_text(value) for value in values.tolist()], pa.string())
            )
    return pa.Table.from_arrays(columns, names=[str(name) for name in frame.columns])


def parse_number(value: Any) -> tuple[float, bool]:
    """``(number, is_number_or_missing)`` for one cell of an unusual type (the number is NaN when missing or not a number)."""
    if value is None or value is pd.NA or value is pd.NaT:
        return math.nan, True
    if isinstance(value, (bool, np.bool_)):
        return math.nan, False
    if isinstance(value, (int, float, np.integer, np.floating, Decimal)):
        return float(value), True
    number = parse_numbers(pa.array([to_text(value)], pa.string()))
    return float(number.values[0]), not bool(number.not_number[0])


def typed_table(cells: Cells) -> pd.DataFrame:
    """The plate columns present, with proper types, plus source_file and row."""
    columns: dict[str, Any] = {}
    for column in ALLOWED_COLUMNS:
        if column in cells.text:
            columns[column] = cells.text[column].objects()
        elif column == "replicate" and column in cells.numbers:
            values = cells.numbers[column].values
            whole = np.isfinite(values) & (values == np.floor(values))
            columns[column] = pd.arrays.IntegerArray(
                np.where(whole, values, 0).astype(np.int64), ~whole
            )
        elif column in cells.numbers:
            columns[column] = cells.numbers[column].values
    columns["source_file"] = np.empty(cells.rows, dtype=object)
    columns["source_file"].fill(cells.file)  # np.full is many times slower for objects
    columns["row"] = np.arange(1, cells.rows + 1, dtype="int64")
    index = pd.RangeIndex(cells.rows)
    # One block per column (no copy into 2-D blocks): concat of Series, not the dict constructor.
    series = [
        pd.Series(values, index=index, name=name, copy=False)
        for name, values in columns.items()
    ]
    return pd.concat(series, axis=1, copy=False)
