"""The entry points that run every check: ``validate_plate_table`` and ``check_plate_file``."""

from __future__ import annotations

import pandas as pd

from .cells import arrow_from_frame, prepare_cells, typed_table, unique_columns
from .layout import (
    Wells,
    controls_and_z_primes,
    duplicate_wells,
    invalid_wells,
    plate_formats,
)
from .lines import LineLookup
from .reading import LINES_ATTR, RawTable, file_suffix, read_raw
from .schema import cell_violations, column_violations
from .strict_csv import empty_file
from .violations import Findings, PlateFileResult


def validate_plate_table(table: pd.DataFrame, file: str) -> PlateFileResult:
    """Check a table read from a plate file against the plate format.

    Checks, in order: the columns (missing, extra, duplicated), each cell
    (missing values, numbers that are not numbers, out-of-range values, well
    names, sample types), then each plate (wells outside the plate, one
    plate format per file, each well at most once per plate, at least two
    positive and two negative control readouts). Also computes Z' and the
    plate format (96, 384 or 1536) of each plate. A Z' below ``Z_PRIME_THRESHOLD``
    is *not* a violation; the caller reports it as a warning.

    Pass the table as read from the file (``read_plate_table``) or any
    DataFrame holding the plate columns; ``source_file`` and ``row`` (which
    this package adds to the typed table) are not plate columns.
    """
    if len(table) == 0:
        return PlateFileResult(
            file=file,
            table=None,
            violations=[empty_file(file, "The table has no data rows.")],
        )
    lines = table.attrs.get(LINES_ATTR)
    if isinstance(lines, list) and len(lines) == len(table):
        lookup: LineLookup | None = LineLookup(lines=lines)
    else:
        lookup = LineLookup.assumed(len(table)) if file_suffix(file) == ".csv" else None
    return _validate(RawTable(arrow_from_frame(table), lookup), file)


def check_plate_file(data: bytes, file: str) -> PlateFileResult:
    """Read and validate one plate file given as raw bytes (the main entry point).

    A CSV file is first read with its numbers parsed by pyarrow; if that finds
    anything wrong, the file is read again as text, so every message quotes the
    cells exactly as the lab wrote them.
    """
    raw, violations = read_raw(data, file, parse_numbers=True)
    if raw is None:
        return PlateFileResult(file=file, table=None, violations=violations)
    result = _validate(raw, file)
    if result.violations and raw.numbers_parsed:
        raw, violations = read_raw(data, file, parse_numbers=False)
        if raw is None:  # cannot happen: the same bytes were read a moment ago
            return PlateFileResult(file=file, table=None, violations=violations)
        result = _validate(raw, file)
    return result


def _validate(raw: RawTable, file: str) -> PlateFileResult:
    found = Findings()
    table = unique_columns(raw.table, file, found.listed)
    cells = prepare_cells(table, file, raw.lines)
    column_violations(cells, found)
    cell_violations(cells, found)
    formats: dict[str, int] = {}
    if "well" in cells.text:
        wells = Wells(cells)
        invalid_wells(cells, wells, found)
        formats = plate_formats(cells, wells, found)
        duplicate_wells(cells, wells, found)
    z_primes = controls_and_z_primes(cells, found)
    return PlateFileResult(
        file=file,
        table=typed_table(cells),
        violations=found.capped(),
        z_primes=z_primes,
        plate_formats=formats,
    )
