"""Read and check one assay plate file sent by a lab.

A lab drop contains one or more *plate files* (CSV or Parquet). Each row of a
plate file describes one well of one plate: which plate (``plate_barcode``),
which well (``well``, e.g. ``B03``), what was in it (``sample_type`` and
``perturbation``) and what the instrument measured (``readout``).

This module takes the raw bytes of one plate file and tells you, precisely and
in plain words, everything that is wrong with it: the file, the data row (and,
for CSV, the line in the file), the well, the column, a short rule name and a
sentence saying what to change. It never touches the file system and never
imports Dagster, so it can be used by the platform, by a lab system before it
sends a drop, or from a notebook.

Typical use::

    result = check_plate_file(Path("p1.csv").read_bytes(), "plates/p1.csv")
    for violation in result.violations:
        print(violation.describe())
    if result.ok:
        effects = normalised_effects(result.table)

Row numbers count data rows: the first row under the header is row 1. In a CSV
file that row sits on line 2, so messages for CSV files also give the line.
"""

from __future__ import annotations

import csv
import io
import math
import re
import warnings
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import pandera.pandas as pa
import pyarrow
import pyarrow.parquet as pq

__all__ = [
    "REQUIRED_COLUMNS",
    "OPTIONAL_COLUMNS",
    "ALLOWED_COLUMNS",
    "SAMPLE_TYPES",
    "Z_PRIME_THRESHOLD",
    "MAX_VIOLATIONS_PER_RULE",
    "Violation",
    "PlateFileResult",
    "read_plate_table",
    "validate_plate_table",
    "check_plate_file",
    "z_prime",
    "normalised_effects",
]

# ---------------------------------------------------------------------------
# The plate file format
# ---------------------------------------------------------------------------

REQUIRED_COLUMNS: tuple[str, ...] = (
    "plate_barcode",
    "well",
    "sample_type",
    "perturbation",
    "readout",
)
"""Columns every plate file must have (names are case-sensitive)."""

OPTIONAL_COLUMNS: tuple[str, ...] = ("concentration", "replicate")
"""Columns a plate file may have; their cells may be left empty."""

ALLOWED_COLUMNS: tuple[str, ...] = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
"""Every column a plate file may contain; any other column is a violation."""

SAMPLE_TYPES: tuple[str, ...] = ("sample", "pos_ctrl", "neg_ctrl", "empty")
"""Allowed values of ``sample_type``."""

Z_PRIME_THRESHOLD = 0.5
"""A plate whose Z' is below this is flagged as a warning (not a violation)."""

MAX_VIOLATIONS_PER_RULE = 20
"""At most this many violations of one rule are listed per file; the rest are
summarised in one final "… and N more" violation."""

TEXT_COLUMNS: tuple[str, ...] = ("plate_barcode", "well", "sample_type", "perturbation")
NUMERIC_COLUMNS: tuple[str, ...] = ("readout", "concentration", "replicate")

SUPPORTED_SUFFIXES: tuple[str, ...] = (".csv", ".parquet")

#: plate size -> (number of rows A.., number of columns 1..)
PLATE_LAYOUTS: dict[int, tuple[int, int]] = {96: (8, 12), 384: (16, 24)}

# Anything that is a real position on a 96-, 384- or 1536-well plate: an
# uppercase row letter (A-Z, or AA-AF on 1536-well plates) followed by a
# two-digit column 01-48. Names like "A1", "a01" or "Z99" do not match.
_WELL_SYNTAX = re.compile(r"^(?P<row>[A-Z]|A[A-F])(?P<col>0[1-9]|[1-3][0-9]|4[0-8])$")
_WELL_LOOSE = re.compile(r"^\s*(?P<row>[A-Za-z]{1,2})\s*[-_ ]?\s*0*(?P<col>\d{1,2})\s*$")
_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")
_MISSING_TOKENS = frozenset({"", "na", "n/a", "nan", "null", "none", "#n/a"})
_INFINITY_TOKENS = frozenset(
    {"inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"}
)
_OTHER_DELIMITERS = {";": "semicolon ';'", "\t": "tab", "|": "pipe '|'"}
_LINES_ATTR = "plate_validation_csv_lines"

# Frequent alternative spellings of column names, used only to suggest a fix.
_COLUMN_ALIASES: dict[str, str] = {
    "barcode": "plate_barcode",
    "plate": "plate_barcode",
    "plate_id": "plate_barcode",
    "platebarcode": "plate_barcode",
    "well_id": "well",
    "position": "well",
    "type": "sample_type",
    "sampletype": "sample_type",
    "gene": "perturbation",
    "gene_symbol": "perturbation",
    "target": "perturbation",
    "value": "readout",
    "signal": "readout",
    "intensity": "readout",
    "conc": "concentration",
    "rep": "replicate",
}

#: Order in which rules are listed: file-level problems, then cell-level
#: problems, then plate-level problems (which are often consequences of the former).
RULE_ORDER: tuple[str, ...] = (
    "unsupported_file_type",
    "empty_file",
    "encoding",
    "delimiter",
    "malformed_csv",
    "unreadable_parquet",
    "duplicate_column",
    "missing_column",
    "extra_column",
    "missing_value",
    "non_numeric_readout",
    "non_numeric_value",
    "out_of_range",
    "invalid_well",
    "well_outside_plate",
    "unknown_sample_type",
    "duplicate_well",
    "mixed_plate_format",
    "missing_controls",
    "schema",
)

_ALLOWED_COLUMNS_TEXT = (
    f"{', '.join(REQUIRED_COLUMNS)} (required) and "
    f"{', '.join(OPTIONAL_COLUMNS)} (optional)"
)


# ---------------------------------------------------------------------------
# Result types
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    """One problem found in a plate file, with where it is and how to fix it.

    ``row`` is the 1-based data row (the first row under the header is row 1);
    it is ``None`` for problems that concern the whole file or a whole plate.
    """

    file: str
    rule: str
    message: str
    row: int | None = None
    well: str | None = None
    column: str | None = None
    plate_barcode: str | None = None

    def describe(self) -> str:
        """One line, e.g. ``plates/p1.csv row 12 (well B03, column readout): rule — message``."""
        head = self.file
        if self.row is not None:
            head += f" row {self.row}"
        parts: list[str] = []
        if self.row is None and self.plate_barcode is not None:
            parts.append(f"plate {self.plate_barcode}")
        if self.well is not None:
            parts.append(f"well {self.well}")
        if self.column is not None:
            parts.append(f"column {self.column}")
        if parts:
            head += f" ({', '.join(parts)})"
        message = " ".join(self.message.split())
        return f"{head}: {self.rule} — {message}"

    def to_dict(self) -> dict[str, Any]:
        """All fields as a plain dict (JSON-serialisable)."""
        return asdict(self)


@dataclass
class PlateFileResult:
    """Everything learnt from one plate file.

    ``table`` is the typed table (the plate columns present in the file, plus
    ``source_file`` and the 1-based ``row``) or ``None`` if the file could not
    be read at all. Only rely on its values when ``ok`` is true.
    """

    file: str
    table: pd.DataFrame | None
    violations: list[Violation] = field(default_factory=list)
    z_primes: dict[str, float] = field(default_factory=dict)
    plate_formats: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the file has no violations at all."""
        return not self.violations


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


def read_plate_table(data: bytes, file: str) -> tuple[pd.DataFrame | None, list[Violation]]:
    """Read a plate file's bytes into a table of raw values, without judging them.

    CSV files are read entirely as text so that a later check can quote the
    exact cell that is wrong. Parquet files keep the types they were written
    with. Returns ``(None, violations)`` when the file cannot be read at all
    (wrong file type, not UTF-8, wrong delimiter, ragged rows, corrupt
    Parquet, no data).
    """
    suffix = _suffix(file)
    if suffix == ".csv":
        table, violations = _read_csv(data, file)
    elif suffix == ".parquet":
        table, violations = _read_parquet(data, file)
    else:
        return None, [_unsupported_file_type(file)]
    return table, _cap(violations)


def _suffix(file: str) -> str:
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


def _read_csv(data: bytes, file: str) -> tuple[pd.DataFrame | None, list[Violation]]:
    if not data.strip():
        what = "is empty (0 bytes)" if not data else "contains only blank space"
        return None, [_empty_file(file, f"The file {what}.")]
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
        return None, [_empty_file(file, "The file contains only blank lines.")]
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
        return None, [
            _empty_file(file, "The file has a header line but no data rows.")
        ]

    table = pd.DataFrame(records, columns=header, dtype=object)
    table.attrs[_LINES_ATTR] = record_lines
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
    shown = _quote(",".join(fields), limit=80)
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


def _empty_file(file: str, what: str) -> Violation:
    return Violation(
        file=file,
        rule="empty_file",
        message=(
            f"{what} A plate file needs a header line ({', '.join(REQUIRED_COLUMNS)}) "
            "followed by one row per well. Check that the export finished and send "
            "the complete file in a new drop."
        ),
    )


def _read_parquet(data: bytes, file: str) -> tuple[pd.DataFrame | None, list[Violation]]:
    if not data:
        return None, [_empty_file(file, "The file is empty (0 bytes).")]
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
        return None, [
            _empty_file(file, f"The Parquet file has no rows (columns: {columns}).")
        ]
    return table.reset_index(drop=True), []


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def _finite(values: pd.Series) -> pd.Series:
    return pd.Series(np.isfinite(values.to_numpy(dtype=float)), index=values.index)


def _when_finite(test: Callable[[pd.Series], pd.Series]) -> Callable[[pd.Series], pd.Series]:
    """Apply ``test`` to finite values only (infinity is reported by 'finite')."""

    def check(values: pd.Series) -> pd.Series:
        return ~_finite(values) | test(values)

    return check


def _build_schema() -> pa.DataFrameSchema:
    """The pandera schema: which columns, their types and allowed values.

    Text cells arrive stripped (empty -> missing) and numeric cells arrive as
    floats (non-numbers already reported and set to missing), so every check
    here maps to exactly one rule.
    """
    finite = pa.Check(_finite, name="finite")
    not_negative = pa.Check(_when_finite(lambda s: s >= 0), name="not_negative")
    return pa.DataFrameSchema(
        columns={
            "plate_barcode": pa.Column(str, nullable=False),
            "well": pa.Column(
                str,
                pa.Check(lambda s: s.str.fullmatch(_WELL_SYNTAX.pattern), name="well_syntax"),
                nullable=False,
            ),
            "sample_type": pa.Column(
                str,
                pa.Check(lambda s: s.isin(SAMPLE_TYPES), name="sample_type_allowed"),
                nullable=False,
            ),
            "perturbation": pa.Column(str, nullable=True),
            "readout": pa.Column(float, [finite, not_negative], nullable=True),
            "concentration": pa.Column(
                float, [finite, not_negative], nullable=True, required=False
            ),
            "replicate": pa.Column(
                float,
                [
                    finite,
                    pa.Check(_when_finite(lambda s: s == np.floor(s)), name="whole_number"),
                    pa.Check(_when_finite(lambda s: s >= 1), name="at_least_one"),
                ],
                nullable=True,
                required=False,
            ),
        },
        strict=True,
        ordered=False,
    )


_SCHEMA = _build_schema()


@dataclass
class _Cells:
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
        text = "rows " + _and_join([str(r) for r in rows])
        lines = [self.line(r) for r in rows]
        if all(line is not None for line in lines):
            text += " (lines " + _and_join([str(line) for line in lines]) + ")"
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


def validate_plate_table(table: pd.DataFrame, file: str) -> PlateFileResult:
    """Check a table read from a plate file against the plate format.

    Checks, in order: the columns (missing, extra, duplicated), each cell
    (missing values, numbers that are not numbers, out-of-range values, well
    names, sample types), then each plate (wells outside the plate, one
    plate format per file, each well at most once per plate, at least two
    positive and two negative control readouts). Also computes Z' and the
    plate format (96 or 384) of each plate. A Z' below ``Z_PRIME_THRESHOLD``
    is *not* a violation; the caller reports it as a warning.

    Pass the table as read from the file (``read_plate_table``) or any
    DataFrame holding the plate columns; ``source_file`` and ``row`` (which
    this module adds to the typed table) are not plate columns.
    """
    if len(table) == 0:
        return PlateFileResult(
            file=file,
            table=None,
            violations=[_empty_file(file, "The table has no data rows.")],
        )
    violations: list[Violation] = []
    lines = _line_numbers(table, file)
    table = _unique_columns(table, file, violations)
    cells = _prepare_cells(table, file, lines, violations)
    violations.extend(_schema_violations(cells))
    violations.extend(_missing_required_values(cells))
    plate_formats = _plate_formats(cells, violations)
    violations.extend(_duplicate_wells(cells))
    z_primes = _controls_and_z_primes(cells, violations)
    return PlateFileResult(
        file=file,
        table=_typed_table(cells),
        violations=_cap(violations),
        z_primes=z_primes,
        plate_formats=plate_formats,
    )


def check_plate_file(data: bytes, file: str) -> PlateFileResult:
    """Read and validate one plate file given as raw bytes (the main entry point)."""
    table, violations = read_plate_table(data, file)
    if table is None:
        return PlateFileResult(file=file, table=None, violations=violations)
    result = validate_plate_table(table, file)
    result.violations = violations + result.violations
    return result


def _line_numbers(table: pd.DataFrame, file: str) -> list[int] | None:
    lines = table.attrs.get(_LINES_ATTR)
    if isinstance(lines, list) and len(lines) == len(table):
        return [int(line) for line in lines]
    if _suffix(file) == ".csv":
        return [row + 1 for row in range(1, len(table) + 1)]
    return None


def _unique_columns(table: pd.DataFrame, file: str, violations: list[Violation]) -> pd.DataFrame:
    """Strip column names and keep the first of any duplicated column name."""
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
    result = table.iloc[:, keep].copy()
    result.columns = [names[p] for p in keep]
    return result.reset_index(drop=True)


def _prepare_cells(
    table: pd.DataFrame, file: str, lines: list[int] | None, violations: list[Violation]
) -> _Cells:
    """Normalise cells (strip text, parse numbers) and report non-numeric cells."""
    frame = pd.DataFrame(index=pd.RangeIndex(len(table)))
    raw_text: dict[str, list[str | None]] = {}
    for column in table.columns:
        values = table[column].tolist()
        if column in TEXT_COLUMNS:
            texts = [_to_text(value) for value in values]
            raw_text[column] = texts
            frame[column] = pd.Series(texts, dtype=object)
        elif column in NUMERIC_COLUMNS:
            raw_text[column] = [_to_text(value) for value in values]
            frame[column] = pd.Series([_to_number(v) for v in values], dtype=float)
        else:
            frame[column] = pd.Series(values, dtype=object)
    cells = _Cells(file=file, frame=frame, raw_text=raw_text, lines=lines)
    for column in NUMERIC_COLUMNS:
        if column in frame.columns:
            violations.extend(_non_numeric(cells, column, table[column].tolist()))
    return cells


def _to_text(value: Any) -> str | None:
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


def _to_number(value: Any) -> float:
    """A cell as a float; NaN when it is missing or not a number."""
    number, _ = _parse_number(value)
    return number


def _parse_number(value: Any) -> tuple[float, bool]:
    """Return ``(number, is_number_or_missing)`` for one cell."""
    if value is None or value is pd.NA or value is pd.NaT:
        return math.nan, True
    if isinstance(value, (bool, np.bool_)):
        return math.nan, False
    if isinstance(value, (int, float, np.integer, np.floating, Decimal)):
        return float(value), True
    text = _to_text(value)
    if text is None or text.lower() in _MISSING_TOKENS:
        return math.nan, True
    if text.lower() in _INFINITY_TOKENS:
        return (-math.inf if text.startswith("-") else math.inf), True
    if _NUMBER.match(text):
        return float(text), True
    return math.nan, False


def _non_numeric(cells: _Cells, column: str, values: list[Any]) -> list[Violation]:
    rule = "non_numeric_readout" if column == "readout" else "non_numeric_value"
    found: list[Violation] = []
    for position, value in enumerate(values):
        _, ok = _parse_number(value)
        if ok:
            continue
        row = position + 1
        written = _to_text(value) or ""
        hint = ""
        if re.fullmatch(r"[+-]?\d+,\d+", written):
            hint = f" It looks like a decimal comma: write {written.replace(',', '.')!r} instead."
        example = "a whole number such as 1 or 2" if column == "replicate" else "e.g. 1234.5"
        found.append(
            cells.violation(
                rule,
                row,
                column,
                f"{cells.where(row)}, well {cells.cell('well', row) or '?'}: {column} "
                f"{_quote(written)} is not a number.{hint} Enter a plain number ({example}) "
                "with '.' as the decimal separator and no units, thousands separators or "
                "instrument flags"
                + (
                    "; if the well could not be measured, set its sample_type to 'empty' "
                    "and leave the readout empty."
                    if column == "readout"
                    else "; leave the cell empty if the value is not known."
                ),
            )
        )
    return found


def _schema_violations(cells: _Cells) -> list[Violation]:
    """Run the pandera schema and turn each failure case into a Violation."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _SCHEMA.validate(cells.frame, lazy=True)
    except pa.errors.SchemaErrors as errors:
        cases = errors.failure_cases
    else:
        return []
    found: list[Violation] = []
    for case in cases.to_dict("records"):
        found.append(_failure_case_to_violation(cells, case))
    return found


def _failure_case_to_violation(cells: _Cells, case: dict[str, Any]) -> Violation:
    check = str(case.get("check"))
    column = case.get("column")
    value = case.get("failure_case")
    index = case.get("index")
    file = cells.file
    if check == "column_in_dataframe":
        return _missing_column(cells, str(value))
    if check == "column_in_schema":
        return _extra_column(file, str(value))
    row = None if index is None or pd.isna(index) else int(index) + 1
    if row is None:  # whole-column failure; should not happen with prepared cells
        return Violation(
            file=file,
            rule="schema",
            column=None if column is None else str(column),
            message=(
                f"Column '{column}' failed the check {check} ({value}). Check that the "
                "column holds the kind of values described in the drop protocol."
            ),
        )
    column = str(column)
    written = cells.cell(column, row)
    where = cells.where(row)
    if check == "not_nullable":
        return cells.violation(
            "missing_value",
            row,
            column,
            f"{where}: {column} is empty. Every row needs a {column}; fill it in "
            + (
                "(the barcode printed on the plate)."
                if column == "plate_barcode"
                else f"(one of {', '.join(SAMPLE_TYPES)})."
                if column == "sample_type"
                else "(e.g. A01 or P24)."
            ),
        )
    if check == "well_syntax":
        return cells.violation("invalid_well", row, column, _invalid_well_message(where, written))
    if check == "sample_type_allowed":
        suggestion = _closest_sample_type(written or "")
        return cells.violation(
            "unknown_sample_type",
            row,
            column,
            f"{where}, well {cells.cell('well', row) or '?'}: sample_type {_quote(written)} "
            f"is not allowed. Use exactly one of {', '.join(SAMPLE_TYPES)} (lower case)"
            + (f"; did you mean '{suggestion}'?" if suggestion else "."),
        )
    return cells.violation(
        "out_of_range", row, column, _out_of_range_message(cells, row, column, check, written)
    )


def _out_of_range_message(
    cells: _Cells, row: int, column: str, check: str, written: str | None
) -> str:
    lead = f"{cells.where(row)}, well {cells.cell('well', row) or '?'}: {column} {_quote(written)}"
    if check == "finite":
        return (
            f"{lead} is not a finite number. Replace it with the measured value"
            + (
                ", or set sample_type to 'empty' if the well was not measured."
                if column == "readout"
                else "."
            )
        )
    if column == "readout":
        return (
            f"{lead} is negative; readouts must be 0 or more. Send the raw instrument "
            "readout (if a background subtraction made it negative, send the value "
            "before subtraction)."
        )
    if column == "concentration":
        return f"{lead} is negative; concentrations must be 0 or more. Correct the value or leave the cell empty."
    if check == "whole_number":
        return f"{lead} is not a whole number; replicates are counted 1, 2, 3, … Correct the value or leave the cell empty."
    return f"{lead} is below 1; replicates are counted from 1 (1, 2, 3, …). Correct the value or leave the cell empty."


def _missing_column(cells: _Cells, name: str) -> Violation:
    lookalike = next(
        (c for c in cells.frame.columns if _canonical_column(str(c)) == name and str(c) != name),
        None,
    )
    hint = f" The file has a column '{lookalike}': rename it to '{name}'." if lookalike else ""
    return Violation(
        file=cells.file,
        rule="missing_column",
        column=name,
        message=(
            f"Required column '{name}' is missing.{hint} The header must contain "
            f"{_ALLOWED_COLUMNS_TEXT}; names are lower case and spelled exactly as shown."
        ),
    )


def _extra_column(file: str, name: str) -> Violation:
    canonical = _canonical_column(name)
    shown = f"'{name}'" if name else "with an empty name (often a trailing comma at the end of each line)"
    hint = f" If it holds {canonical} values, rename it to '{canonical}'." if canonical else ""
    return Violation(
        file=file,
        rule="extra_column",
        column=name,
        message=(
            f"Column {shown} is not part of the plate format.{hint} Remove it (keep notes "
            f"outside the plate file); the allowed columns are {_ALLOWED_COLUMNS_TEXT}."
        ),
    )


def _canonical_column(name: str) -> str | None:
    """The allowed column a misspelt header most likely means, if any."""
    key = re.sub(r"[\s\-]+", "_", name.strip().lower())
    if key in ALLOWED_COLUMNS:
        return key
    return _COLUMN_ALIASES.get(key)


def _closest_sample_type(value: str) -> str | None:
    key = re.sub(r"[\s\-]+", "_", value.strip().lower())
    if key in SAMPLE_TYPES:
        return key
    aliases = {
        "positive": "pos_ctrl",
        "positive_control": "pos_ctrl",
        "pos": "pos_ctrl",
        "posctrl": "pos_ctrl",
        "negative": "neg_ctrl",
        "negative_control": "neg_ctrl",
        "neg": "neg_ctrl",
        "negctrl": "neg_ctrl",
        "blank": "empty",
        "samples": "sample",
    }
    return aliases.get(key)


def _invalid_well_message(where: str, written: str | None) -> str:
    suggestion = _suggest_well(written or "")
    return (
        f"{where}: well {_quote(written)} is not a valid well name. Write wells as an "
        "uppercase row letter followed by a two-digit column, e.g. A01, B12, H12 "
        "(96-well) or P24 (384-well)"
        + (f"; did you mean '{suggestion}'?" if suggestion else ".")
    )


def _suggest_well(written: str) -> str | None:
    match = _WELL_LOOSE.match(written)
    if not match:
        return None
    candidate = f"{match['row'].upper()}{int(match['col']):02d}"
    return candidate if _well_position(candidate) is not None else None


def _well_position(well: str | None) -> tuple[int, int] | None:
    """(0-based row index, 1-based column) for a syntactically valid well name."""
    if well is None:
        return None
    match = _WELL_SYNTAX.match(well)
    if not match:
        return None
    letters = match["row"]
    row_index = ord(letters[-1]) - ord("A") + (26 if len(letters) == 2 else 0)
    return row_index, int(match["col"])


def _fits(position: tuple[int, int], plate_size: int) -> bool:
    rows, columns = PLATE_LAYOUTS[plate_size]
    return position[0] < rows and position[1] <= columns


def _missing_required_values(cells: _Cells) -> list[Violation]:
    """Readouts are required except for 'empty' wells; perturbation for 'sample' wells."""
    frame = cells.frame
    found: list[Violation] = []
    if "sample_type" not in frame.columns:
        return found
    sample_types = frame["sample_type"].tolist()
    if "readout" in frame.columns:
        for position, (sample_type, written) in enumerate(
            zip(sample_types, cells.raw_text["readout"])
        ):
            row = position + 1
            if sample_type == "empty" or not _parse_number(written)[1]:
                continue  # empty wells may lack a readout; non-numbers already reported
            if not math.isnan(frame["readout"].iat[position]):
                continue
            said = "" if written is None else f" (the cell says {_quote(written)})"
            found.append(
                cells.violation(
                    "missing_value",
                    row,
                    "readout",
                    f"{cells.where(row)}, well {cells.cell('well', row) or '?'}: readout is "
                    f"missing{said}. Every well except 'empty' wells needs a readout; enter "
                    "the measured value, or set sample_type to 'empty' if the well holds "
                    "nothing or was not measured.",
                )
            )
    if "perturbation" in frame.columns:
        for position, (sample_type, perturbation) in enumerate(
            zip(sample_types, frame["perturbation"].tolist())
        ):
            if sample_type != "sample" or perturbation is not None:
                continue
            row = position + 1
            found.append(
                cells.violation(
                    "missing_value",
                    row,
                    "perturbation",
                    f"{cells.where(row)}, well {cells.cell('well', row) or '?'}: perturbation "
                    "is empty, but 'sample' wells need the gene symbol that was perturbed "
                    "(e.g. CD3E). Fill it in, or set sample_type to pos_ctrl, neg_ctrl or "
                    "empty if this well is not a sample.",
                )
            )
    return found


def _plate_formats(cells: _Cells, violations: list[Violation]) -> dict[str, int]:
    """Decide 96 or 384 per plate; report wells outside a 384-well plate and mixed formats."""
    frame = cells.frame
    if "well" not in frame.columns:
        return {}
    barcodes = (
        frame["plate_barcode"].tolist() if "plate_barcode" in frame.columns else [None] * len(frame)
    )
    fits_96: dict[str, bool] = {}
    for position, (barcode, well) in enumerate(zip(barcodes, frame["well"].tolist())):
        where = _well_position(well)
        if where is None:
            continue  # missing or invalid wells are reported by the schema
        if not _fits(where, 384):
            row = position + 1
            violations.append(
                cells.violation(
                    "well_outside_plate",
                    row,
                    "well",
                    f"{cells.where(row)}: well {well} is not on a 96-well (A01-H12) or "
                    "384-well (A01-P24) plate, the only plate formats accepted. Correct "
                    "the well name.",
                )
            )
            continue
        if barcode is not None:
            fits_96[barcode] = fits_96.get(barcode, True) and _fits(where, 96)
    formats = {barcode: 96 if small else 384 for barcode, small in fits_96.items()}
    if len(set(formats.values())) > 1:
        by_format = {
            size: [b for b, s in formats.items() if s == size] for size in sorted(set(formats.values()))
        }
        listing = "; ".join(f"{size}-well: {', '.join(b)}" for size, b in by_format.items())
        violations.append(
            Violation(
                file=cells.file,
                rule="mixed_plate_format",
                column="well",
                message=(
                    f"This file mixes plate formats ({listing}). A plate counts as 96-well "
                    "when all its wells lie within A01-H12, otherwise as 384-well. Put "
                    "96-well and 384-well plates in separate files, and check that each "
                    "plate's wells and barcode are correct."
                ),
            )
        )
    return formats


def _duplicate_wells(cells: _Cells) -> list[Violation]:
    frame = cells.frame
    if "well" not in frame.columns or "plate_barcode" not in frame.columns:
        return []
    rows_by_well: dict[tuple[str, str], list[int]] = {}
    for position, key in enumerate(zip(frame["plate_barcode"].tolist(), frame["well"].tolist())):
        if key[0] is not None and key[1] is not None:
            rows_by_well.setdefault(key, []).append(position + 1)
    found: list[Violation] = []
    for (barcode, well), rows in rows_by_well.items():
        for row in rows[1:]:
            found.append(
                cells.violation(
                    "duplicate_well",
                    row,
                    "well",
                    f"Well {well} of plate {barcode} appears more than once: "
                    f"{cells.rows_text(rows)}. Each well may appear only once per plate; "
                    "remove the duplicate row or correct its well name or plate barcode.",
                )
            )
    return found


def _controls_and_z_primes(cells: _Cells, violations: list[Violation]) -> dict[str, float]:
    """Require >=2 positive and >=2 negative control readouts per plate; compute Z'."""
    frame = cells.frame
    if not {"plate_barcode", "sample_type", "readout"} <= set(frame.columns):
        return {}
    usable = frame["readout"].map(lambda v: math.isfinite(v) and v >= 0)
    z_primes: dict[str, float] = {}
    for barcode in pd.unique(frame["plate_barcode"].dropna()):
        plate = frame[(frame["plate_barcode"] == barcode) & usable]
        pos = plate.loc[plate["sample_type"] == "pos_ctrl", "readout"].tolist()
        neg = plate.loc[plate["sample_type"] == "neg_ctrl", "readout"].tolist()
        for name, values, label in (("pos_ctrl", pos, "positive"), ("neg_ctrl", neg, "negative")):
            if len(values) < 2:
                violations.append(
                    Violation(
                        file=cells.file,
                        rule="missing_controls",
                        column="sample_type",
                        plate_barcode=str(barcode),
                        message=(
                            f"Plate {barcode} has {len(values)} {name} well(s) with a usable "
                            f"readout; every plate needs at least 2 {name} and 2 "
                            f"{'neg_ctrl' if name == 'pos_ctrl' else 'pos_ctrl'} wells with "
                            "readouts so that Z' and normalised effects can be computed. Add "
                            f"the {label} control wells (sample_type '{name}', spelled exactly) "
                            "or fix their readouts."
                        ),
                    )
                )
        if len(pos) >= 2 and len(neg) >= 2:
            z_primes[str(barcode)] = z_prime(pos, neg)
    return z_primes


def _typed_table(cells: _Cells) -> pd.DataFrame:
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


def _cap(violations: list[Violation], limit: int = MAX_VIOLATIONS_PER_RULE) -> list[Violation]:
    """Group by rule (in ``RULE_ORDER``), sort by row, keep ``limit`` per rule."""
    groups: dict[str, list[Violation]] = {}
    for violation in violations:
        groups.setdefault(violation.rule, []).append(violation)
    rank = {rule: position for position, rule in enumerate(RULE_ORDER)}
    ordered = sorted(groups.items(), key=lambda item: rank.get(item[0], len(rank)))
    capped: list[Violation] = []
    for rule, group in ordered:
        group = sorted(group, key=lambda v: (v.row is None, v.row or 0))
        capped.extend(group[:limit])
        hidden = len(group) - limit
        if hidden > 0:
            capped.append(
                Violation(
                    file=group[0].file,
                    rule=rule,
                    message=(
                        f"… and {hidden} more {rule} violations in this file "
                        f"({len(group)} in total) are not listed. Fix the ones above (the "
                        "same cause is likely behind the rest), then check the file again."
                    ),
                )
            )
    return capped


# ---------------------------------------------------------------------------
# Plate statistics
# ---------------------------------------------------------------------------


def z_prime(pos: Sequence[float], neg: Sequence[float]) -> float:
    """Z' factor of a plate from its positive and negative control readouts.

    ``Z' = 1 - 3 * (sd_pos + sd_neg) / |mean_pos - mean_neg|`` with sample
    standard deviations (n - 1). 1 is perfect separation of the controls,
    values of 0.5 or more mean an excellent assay window, and values below
    0 mean the control distributions overlap. Returns ``-inf`` if both
    controls have the same mean. Needs at least two finite values for each.
    """
    pos_values = np.asarray(pos, dtype=float)
    neg_values = np.asarray(neg, dtype=float)
    for name, values in (("pos", pos_values), ("neg", neg_values)):
        if values.size < 2:
            raise ValueError(f"z_prime needs at least 2 {name} control readouts, got {values.size}")
        if not np.all(np.isfinite(values)):
            raise ValueError(f"z_prime needs finite {name} control readouts")
    spread = float(np.std(pos_values, ddof=1) + np.std(neg_values, ddof=1))
    window = abs(float(pos_values.mean() - neg_values.mean()))
    if window == 0:
        return -math.inf
    return 1.0 - 3.0 * spread / window


def normalised_effects(table: pd.DataFrame) -> pd.DataFrame:
    """Scale each sample readout between its plate's controls.

    ``effect = (readout - mean_neg) / (mean_pos - mean_neg)`` per plate, so an
    effect of 0 looks like the negative controls and 1 like the positive
    controls. Meant for a table that passed validation (``result.table`` of
    an ``ok`` result). Returns only ``sample`` rows, with the columns
    plate_barcode, well, perturbation, replicate (if present), readout,
    effect and source_file. Raises ``ValueError`` if a plate has no usable
    control readouts or both controls have the same mean.
    """
    needed = ("plate_barcode", "well", "sample_type", "perturbation", "readout")
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise ValueError(f"normalised_effects needs column(s) {', '.join(missing)}")
    readout = pd.to_numeric(table["readout"]).astype(float)
    usable = np.isfinite(readout)
    effect = pd.Series(np.nan, index=table.index, dtype=float)
    for barcode in pd.unique(table["plate_barcode"]):
        on_plate = table["plate_barcode"] == barcode
        pos = readout[on_plate & usable & (table["sample_type"] == "pos_ctrl")]
        neg = readout[on_plate & usable & (table["sample_type"] == "neg_ctrl")]
        if pos.empty or neg.empty:
            raise ValueError(
                f"plate {barcode} has no pos_ctrl or no neg_ctrl readouts; validate the table first"
            )
        span = pos.mean() - neg.mean()
        if span == 0:
            raise ValueError(f"plate {barcode}: pos_ctrl and neg_ctrl readouts have the same mean")
        effect[on_plate] = (readout[on_plate] - neg.mean()) / span
    samples = table["sample_type"] == "sample"
    columns = ["plate_barcode", "well", "perturbation"]
    if "replicate" in table.columns:
        columns.append("replicate")
    result = table.loc[samples, columns].copy()
    result["readout"] = readout[samples]
    result["effect"] = effect[samples]
    result["source_file"] = table.loc[samples, "source_file"] if "source_file" in table.columns else None
    return result.reset_index(drop=True)


# ---------------------------------------------------------------------------
# Small text helpers
# ---------------------------------------------------------------------------


def _quote(value: str | None, limit: int = 60) -> str:
    if value is None:
        return "(empty)"
    text = value if len(value) <= limit else value[: limit - 1] + "…"
    return repr(text)


def _and_join(items: Sequence[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]
