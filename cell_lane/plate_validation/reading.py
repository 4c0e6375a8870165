"""Reading a plate file's bytes: file type, CSV (encoding, delimiter, ragged rows) and Parquet.

Nothing here judges the values; it only turns bytes into a table of raw cells, or
explains why that is impossible.
"""

from __future__ import annotations

import csv
import io

import pandas as pd
import pyarrow
import pyarrow.parquet as pq

from .columns import REQUIRED_COLUMNS
from .text import quote
from .violations import Violation, cap

SUPPORTED_SUFFIXES: tuple[str, ...] = (".csv", ".parquet")

#: Key in ``DataFrame.attrs`` under which the CSV reader keeps each data row's line.
LINES_ATTR = "plate_validation_csv_lines"

_OTHER_DELIMITERS = {";": "semicolon ';'", "\t": "tab", "|": "pipe '|'"}


def read_plate_table(data: bytes, file: str) -> tuple[pd.DataFrame | None, list[Violation]]:
    """Read a plate file's bytes into a table of raw values, without judging them.

    CSV files are read entirely as text so that a later check can quote the
    exact cell that is wrong. Parquet files keep the types they were written
    with. Returns ``(None, violations)`` when the file cannot be read at all
    (wrong file type, not UTF-8, wrong delimiter, ragged rows, corrupt
    Parquet, no data).
    """
    suffix = file_suffix(file)
    if suffix == ".csv":
        table, violations = _read_csv(data, file)
    elif suffix == ".parquet":
        table, violations = _read_parquet(data, file)
    else:
        return None, [_unsupported_file_type(file)]
    return table, cap(violations)


def file_suffix(file: str) -> str:
    """``.csv`` or ``.parquet`` (case-insensitive), or ``""`` for any other file name."""
    name = file.replace("\\", "/").rsplit("/", 1)[-1].lower()
    for suffix in SUPPORTED_SUFFIXES:
        if name.endswith(suffix):
            return suffix
    return ""


def empty_file(file: str, what: str) -> Violation:
    """An ``empty_file`` violation; ``what`` says what the file holds instead."""
    return Violation(
        file=file,
        rule="empty_file",
        message=(
            f"{what} A plate file needs a header line ({', '.join(REQUIRED_COLUMNS)}) "
            "followed by one row per well. Check that the export finished and send "
            "the complete file in a new drop."
        ),
    )


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


def _read_csv(data: bytes, file: str) -> tuple[pd.DataFrame | None, list[Violation]]:
    if not data.strip():
        what = "is empty (0 bytes)" if not data else "contains only blank space"
        return None, [empty_file(file, f"The file {what}.")]
    text, problem = _decode_utf8(data, file)
    if problem is not None:
        return None, [problem]
    assert text is not None

    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header: list[str] | None = None
    records: list[list[str]] = []
    record_lines: list[int] = []
    malformed: list[Violation] = []
    data_row = 0
    previous_line = 0
    try:
        for fields in reader:
            first_line, last_line = previous_line + 1, reader.line_num
            previous_line = last_line
            if all(not value.strip() for value in fields):
                continue  # blank line, or a line of only commas (Excel leftovers)
            if header is None:
                header = [name.strip() for name in fields]
                continue
            data_row += 1
            if len(fields) != len(header):
                malformed.append(
                    _ragged_row(file, data_row, first_line, last_line, fields, len(header))
                )
                continue
            records.append([value.strip() for value in fields])
            record_lines.append(first_line)
    except csv.Error as error:
        malformed.append(
            Violation(
                file=file,
                rule="malformed_csv",
                row=data_row + 1 if header is not None else None,
                message=(
                    f"Line {reader.line_num} cannot be parsed as CSV ({error}). This is "
                    "usually a double quote that is opened but not closed, or text right "
                    "after a closing quote. Remove stray quote characters, or wrap the "
                    "whole value in double quotes and double any quote inside it."
                ),
            )
        )

    if header is None:
        return None, [empty_file(file, "The file contains only blank lines.")]
    if len(header) == 1:
        seen = [d for d in _OTHER_DELIMITERS if d in header[0]]
        if seen:
            delimiter = max(seen, key=header[0].count)
            return None, [
                Violation(
                    file=file,
                    rule="delimiter",
                    row=None,
                    message=(
                        f"The header line is separated by {_OTHER_DELIMITERS[delimiter]} "
                        "characters, not commas. Plate CSV files must be comma-separated; "
                        "re-export with ',' as the separator (in Excel choose 'CSV UTF-8 "
                        "(comma delimited)'; Excel in many European locales uses ';' by default)."
                    ),
                )
            ]
    if malformed:
        return None, malformed
    if not records:
        return None, [empty_file(file, "The file has a header line but no data rows.")]

    table = pd.DataFrame(records, columns=header, dtype=object)
    table.attrs[LINES_ATTR] = record_lines
    return table, []


def _decode_utf8(data: bytes, file: str) -> tuple[str | None, Violation | None]:
    """Decode as UTF-8 (a leading byte order mark is fine) or explain why not."""
    fix = (
        "Export the file as UTF-8 (in Excel: 'CSV UTF-8 (comma delimited)'; in other "
        "tools choose the encoding 'UTF-8') and send a new drop."
    )
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return None, Violation(
            file=file,
            rule="encoding",
            message=(
                "The file is encoded as UTF-16 (it starts with a UTF-16 byte order mark "
                f"at byte offset 0), but plate CSV files must be UTF-8. {fix}"
            ),
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        offset = error.start
        line = data.count(b"\n", 0, offset) + 1
        return None, Violation(
            file=file,
            rule="encoding",
            message=(
                f"The file is not valid UTF-8: byte 0x{data[offset]:02X} at byte offset "
                f"{offset} (line {line}) cannot be decoded. The file was probably saved "
                f"as Latin-1/Windows-1252 (for example Excel's plain 'CSV' format). {fix}"
            ),
        )
    if "\x00" in text:
        offset = data.index(b"\x00")
        line = data.count(b"\n", 0, offset) + 1
        return None, Violation(
            file=file,
            rule="encoding",
            message=(
                f"The file contains a NUL (zero) byte at byte offset {offset} (line {line}); "
                f"this usually means it is UTF-16 encoded without a byte order mark. {fix}"
            ),
        )
    return text.removeprefix("\ufeff"), None


def _ragged_row(
    file: str, row: int, first_line: int, last_line: int, fields: list[str], expected: int
) -> Violation:
    lines = f"line {first_line}" if first_line == last_line else f"lines {first_line}-{last_line}"
    shown = quote(",".join(fields), limit=80)
    return Violation(
        file=file,
        rule="malformed_csv",
        row=row,
        message=(
            f"Data row {row} ({lines}) has {len(fields)} fields but the header has "
            f"{expected}: {shown}. Check for a missing or extra comma, or a value "
            "containing a comma that is not wrapped in double quotes (\"...\"), and "
            "make every line have exactly one value per header column."
        ),
    )


# ---------------------------------------------------------------------------
# Parquet
# ---------------------------------------------------------------------------


def _read_parquet(data: bytes, file: str) -> tuple[pd.DataFrame | None, list[Violation]]:
    if not data:
        return None, [empty_file(file, "The file is empty (0 bytes).")]
    try:
        arrow_table = pq.ParquetFile(pyarrow.BufferReader(data)).read()
        table = arrow_table.to_pandas()
    except Exception as error:  # any pyarrow failure means the bytes are unusable
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
    if arrow_table.num_rows == 0:
        columns = ", ".join(arrow_table.column_names) or "none"
        return None, [empty_file(file, f"The Parquet file has no rows (columns: {columns}).")]
    return table.reset_index(drop=True), []
