"""Reading a plate file's bytes into a table of raw cells, with pyarrow, in one pass.

Nothing here judges the values; it only turns bytes into an Arrow table of raw cells,
or explains why that is impossible. CSV files are parsed by ``pyarrow.csv.read_csv``
with explicit column types; a file it cannot read (or whose quoting it would accept
too loosely) goes to the exact reader in ``strict_csv``, which names the line and
the fix. Parquet files keep the types they were written with.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from .cells import PLAIN_TEXT_COLUMNS
from .columns import NUMERIC_COLUMNS
from .lines import LineLookup
from .strict_csv import byte_problem, empty_file, read_csv_strictly
from .violations import Violation, cap

SUPPORTED_SUFFIXES: tuple[str, ...] = (".csv", ".parquet")

#: Key in ``DataFrame.attrs`` under which ``read_plate_table`` keeps each CSV data row's line.
LINES_ATTR = "plate_validation_csv_lines"

# A file whose every double quote opens a field (after a comma or at a line start) and
# closes it (before a comma, a line end or the end), with "" inside: what strict CSV allows.
_WELL_QUOTED = re.compile(
    rb'(?:[^"]++|(?:(?<=[,\n\r])|(?<=\A)|(?<=\A\xef\xbb\xbf))"(?:[^"]++|"")*+"(?=[,\r\n]|\Z))*+'
)
_HEADER_PREFIX_BYTES = 1 << 16


@dataclass
class RawTable:
    """The cells of one plate file as read, before any judgement.

    ``numbers_parsed`` says the CSV reader already parsed the numeric columns as
    float64 (every cell was a finite number or empty); otherwise every CSV cell is
    text exactly as written. ``lines`` points at CSV lines (None for Parquet).
    """

    table: pa.Table
    lines: LineLookup | None
    numbers_parsed: bool = False


def read_plate_table(
    data: bytes, file: str
) -> tuple[pd.DataFrame | None, list[Violation]]:
    """Read a plate file's bytes into a pandas table of raw values, without judging them.

    CSV cells come back as text exactly as written (stripped), so that a later check
    can quote the cell that is wrong; Parquet columns keep their types. Returns
    ``(None, violations)`` when the file cannot be read at all (wrong file type, not
    UTF-8, wrong delimiter, ragged rows, corrupt Parquet, no data).
    """
    raw, violations = read_raw(data, file, parse_numbers=False)
    if raw is None:
        return None, violations
    frame = raw.table.to_pandas()
    if raw.lines is not None:
        frame.attrs[LINES_ATTR] = raw.lines.all()
    return frame, violations


def read_raw(
    data: bytes, file: str, *, parse_numbers: bool
) -> tuple[RawTable | None, list[Violation]]:
    """The raw cells of a plate file, or ``(None, violations)`` saying why it cannot be read."""
    suffix = file_suffix(file)
    if suffix == ".csv":
        raw, violations = _read_csv(data, file, parse_numbers)
    elif suffix == ".parquet":
        raw, violations = _read_parquet(data, file)
    else:
        return None, [_unsupported_file_type(file)]
    return raw, cap(violations)


def file_suffix(file: str) -> str:
    """``.csv`` or ``.parquet`` (case-insensitive), or ``""`` for any other file name."""
    name = file.replace("\\", "/").rsplit("/", 1)[-1].lower()
    for suffix in SUPPORTED_SUFFIXES:
        if name.endswith(suffix):
            return suffix
    return ""


def _unsupported_file_type(file: str) -> Violation:
    name = file.replace("\\", "/").rsplit("/", 1)[-1]
    hint = ""
    if name.lower().endswith((".xlsx", ".xls")):
        hint = " Excel workbooks are not read directly: save the sheet as 'CSV UTF-8 (comma delimited)'."
    elif name.lower().endswith((".tsv", ".txt")):
        hint = " Tab-separated or text files are not accepted: save the table as comma-separated .csv."
    return Violation(
        file=file,
        rule="unsupported_file_type",
        message=(
            f"'{name}' is not a plate file type the platform reads; only .csv "
            f"(UTF-8, comma-separated) and .parquet files are accepted.{hint} "
            "Re-export the plate in one of these formats and send a new drop."
        ),
    )


# ---------------------------------------------------------------------------
# CSV
# ---------------------------------------------------------------------------


def _read_csv(
    data: bytes, file: str, parse_numbers: bool
) -> tuple[RawTable | None, list[Violation]]:
    problem = byte_problem(data, file)
    if problem is not None:
        return None, [problem]
    table = _read_csv_with_arrow(data, parse_numbers)
    if table is None and parse_numbers:
        table = _read_csv_with_arrow(
            data, parse_numbers=False
        )  # some numeric cell is not a plain number
    if table is None:
        return _read_csv_strictly(data, file)
    return RawTable(table, LineLookup(data=data), numbers_parsed=parse_numbers), []


def _read_csv_strictly(
    data: bytes, file: str
) -> tuple[RawTable | None, list[Violation]]:
    table, lines, violations = read_csv_strictly(data, file)
    if table is None:
        return None, violations
    return RawTable(table, LineLookup(lines=lines)), []


def _read_csv_with_arrow(data: bytes, parse_numbers: bool) -> pa.Table | None:
    """The file read by pyarrow, or None when pyarrow cannot vouch for reading it as strict CSV would."""
    if b"\x00" in data:
        return None
    quoted = b'"' in data
    if quoted and not _WELL_QUOTED.fullmatch(data):
        return None
    header = _header(data)
    if header is None or len(header) < 2:
        return None  # one column: a wrong delimiter, explained by the strict reader
    numeric = NUMERIC_COLUMNS if parse_numbers else ()
    # With numbers parsed, the repetitive text columns come back coded: the parse threads code them.
    coded = pa.dictionary(pa.int32(), pa.string()) if parse_numbers else pa.string()
    types = {name: _csv_type(name.strip(), numeric, coded) for name in header}
    try:
        table = pacsv.read_csv(
            pa.BufferReader(data),
            parse_options=pacsv.ParseOptions(newlines_in_values=quoted),
            convert_options=pacsv.ConvertOptions(
                column_types=types,
                null_values=[""],
                strings_can_be_null=parse_numbers,  # the text read keeps "" as written
                quoted_strings_can_be_null=parse_numbers,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if table.column_names != header:
        return None
    table = _without_blank_rows(table)
    if table.num_rows == 0:
        return None  # header only: the strict reader says so
    if parse_numbers and not _all_finite(table, numeric):
        return None  # NaN / inf spelt some way: the text path tells them apart
    return table.rename_columns([name.strip() for name in header])


def _csv_type(name: str, numeric: tuple[str, ...], coded: pa.DataType) -> pa.DataType:
    if name in numeric:
        return pa.float64()
    return pa.string() if name in PLAIN_TEXT_COLUMNS else coded


def _header(data: bytes) -> list[str] | None:
    """The header names as written (the first non-blank record), from the file's first bytes."""
    try:
        text = data[:_HEADER_PREFIX_BYTES].decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(data[:_HEADER_PREFIX_BYTES]) - 4:
            return None
        text = data[: error.start].decode("utf-8")  # a character cut by the prefix
    for fields in csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline="")):
        if any(value.strip() for value in fields):
            return fields
        return None  # blank lines before the header: the strict reader counts lines for them
    return None


def _without_blank_rows(table: pa.Table) -> pa.Table:
    """Drop rows whose every cell is empty or white space (Excel leaves lines of only commas).

    Numbers go first (an empty number is a null: a bitmap), then coded text, then plain
    text; a file without such rows is ruled out as soon as no candidate is left.
    """
    order = sorted(
        table.columns,
        key=lambda c: (
            0
            if pa.types.is_floating(c.type)
            else 1
            if pa.types.is_dictionary(c.type)
            else 2
        ),
    )
    blank: pa.ChunkedArray | None = None
    for column in order:
        empty = pc.is_null(column)
        if not pa.types.is_floating(column.type):
            text = (
                column.cast(column.type.value_type)
                if pa.types.is_dictionary(column.type)
                else column
            )
            if pa.types.is_string(text.type):
                empty = pc.or_(
                    empty,
                    pc.fill_null(
                        pc.or_(pc.equal(text, ""), pc.utf8_is_space(text)), False
                    ),
                )
        blank = empty if blank is None else pc.and_(blank, empty)
        if not pc.any(blank).as_py():
            return table
    return table.filter(pc.invert(blank)) if blank is not None else table


def _all_finite(table: pa.Table, numeric: tuple[str, ...]) -> bool:
    for name, values in zip(table.column_names, table.columns):
        if name.strip() in numeric and not math.isfinite(pc.sum(values).as_py() or 0.0):
            return False  # a NaN or an infinity (or a sum beyond float range) somewhere: the text path decides
    return True


# ---------------------------------------------------------------------------
# Parquet
# ---------------------------------------------------------------------------


def _read_parquet(data: bytes, file: str) -> tuple[RawTable | None, list[Violation]]:
    if not data:
        return None, [empty_file(file, "The file is empty (0 bytes).")]
    try:
        table = pq.ParquetFile(pa.BufferReader(data)).read()
        table.to_batches()  # decoding problems surface here, not later
    except Exception as error:  # noqa: BLE001 - any pyarrow failure means the bytes are unusable
        reason = " ".join(str(error).split()) or type(error).__name__
        return None, [
            Violation(
                file=file,
                rule="unreadable_parquet",
                message=(
                    f"The Parquet file cannot be read: {reason}. The file is probably "
                    "truncated (an interrupted copy) or not really a Parquet file. Write "
                    "it again, check its size and sha256 against the manifest, and send "
                    "a new drop."
                ),
            )
        ]
    if table.num_rows == 0:
        columns = ", ".join(table.column_names) or "none"
        return None, [
            empty_file(file, f"The Parquet file has no rows (columns: {columns}).")
        ]
    return RawTable(table, None), []
