"""The exact CSV reader for files the fast reader will not vouch for.

pyarrow reads well-formed plate CSV files (``reading``). A file it cannot read, or
one whose quoting it would accept more loosely than the CSV standard (``"2"x``), is
read here with Python's ``csv`` module in strict mode instead, which can say
precisely what is wrong and on which line: not UTF-8, the wrong delimiter, a row
with too many or too few fields, an unclosed quote. Those are whole-file problems,
so this reader runs once per such file, never for the cells of a readable one.
"""

from __future__ import annotations

import csv
import io

import pyarrow as pa

from .columns import REQUIRED_COLUMNS
from .text import quote
from .violations import Violation

_OTHER_DELIMITERS = {";": "semicolon ';'", "\t": "tab", "|": "pipe '|'"}


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


def byte_problem(data: bytes, file: str) -> Violation | None:
    """Problems visible in the bytes alone: empty, UTF-16 byte order mark, NUL bytes."""
    if not data or data.isspace():
        what = "is empty (0 bytes)" if not data else "contains only blank space"
        return empty_file(file, f"The file {what}.")
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return Violation(
            file=file,
            rule="encoding",
            message=(
                "The file is encoded as UTF-16 (it starts with a UTF-16 byte order mark "
                f"at byte offset 0), but plate CSV files must be UTF-8. {_UTF8_FIX}"
            ),
        )
    return None


_UTF8_FIX = (
    "Export the file as UTF-8 (in Excel: 'CSV UTF-8 (comma delimited)'; in other "
    "tools choose the encoding 'UTF-8') and send a new drop."
)


def read_csv_strictly(
    data: bytes, file: str
) -> tuple[pa.Table | None, list[int], list[Violation]]:
    """Every cell as stripped text, the line of each data row, or why the file cannot be read."""
    problem = byte_problem(data, file)
    if problem is not None:
        return None, [], [problem]
    text, problem = _decode_utf8(data, file)
    if problem is not None:
        return None, [], [problem]
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
                    _ragged_row(
                        file, data_row, first_line, last_line, fields, len(header)
                    )
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
        return None, [], [empty_file(file, "The file contains only blank lines.")]
    if len(header) == 1:
        seen = [d for d in _OTHER_DELIMITERS if d in header[0]]
        if seen:
            delimiter = max(seen, key=header[0].count)
            return None, [], [_delimiter(file, delimiter)]
    if malformed:
        return None, [], malformed
    if not records:
        return (
            None,
            [],
            [empty_file(file, "The file has a header line but no data rows.")],
        )
    columns = [
        pa.array([record[i] for record in records], pa.string())
        for i in range(len(header))
    ]
    return pa.Table.from_arrays(columns, names=header), record_lines, []


def _delimiter(file: str, delimiter: str) -> Violation:
    return Violation(
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


def _decode_utf8(data: bytes, file: str) -> tuple[str | None, Violation | None]:
    """Decode as UTF-8 (a leading byte order mark is fine) or explain why not."""
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
                f"as Latin-1/Windows-1252 (for example Excel's plain 'CSV' format). {_UTF8_FIX}"
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
                f"this usually means it is UTF-16 encoded without a byte order mark. {_UTF8_FIX}"
            ),
        )
    return text.removeprefix("\ufeff"), None


def _ragged_row(
    file: str,
    row: int,
    first_line: int,
    last_line: int,
    fields: list[str],
    expected: int,
) -> Violation:
    lines = (
        f"line {first_line}"
        if first_line == last_line
        else f"lines {first_line}-{last_line}"
    )
    shown = quote(",".join(fields), limit=80)
    return Violation(
        file=file,
        rule="malformed_csv",
        row=row,
        message=(
            f"Data row {row} ({lines}) has {len(fields)} fields but the header has "
            f"{expected}: {shown}. Check for a missing or extra comma, or a value "
            'containing a comma that is not wrapped in double quotes ("..."), and '
            "make every line have exactly one value per header column."
        ),
    )


def record_lines(text: str) -> list[int]:
    """The first line of each non-blank record after the header (what ``read_csv_strictly`` counts)."""
    reader = csv.reader(io.StringIO(text, newline=""))
    lines: list[int] = []
    previous_line = 0
    seen_header = False
    for fields in reader:
        first_line, previous_line = previous_line + 1, reader.line_num
        if all(not value.strip() for value in fields):
            continue
        if seen_header:
            lines.append(first_line)
        seen_header = True
    return lines
