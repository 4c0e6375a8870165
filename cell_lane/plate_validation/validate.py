"""The entry points that run every check: ``validate_plate_table`` and ``check_plate_file``."""

from __future__ import annotations

import pandas as pd

from .cells import line_numbers, prepare_cells, typed_table, unique_columns
from .layout import controls_and_z_primes, duplicate_wells, plate_formats
from .reading import empty_file, read_plate_table
from .schema import missing_required_values, non_numeric_cells, schema_violations
from .violations import PlateFileResult, Violation, cap


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
    this package adds to the typed table) are not plate columns.
    """
    if len(table) == 0:
        return PlateFileResult(
            file=file,
            table=None,
            violations=[empty_file(file, "The table has no data rows.")],
        )
    violations: list[Violation] = []
    lines = line_numbers(table, file)
    table = unique_columns(table, file, violations)
    cells = prepare_cells(table, file, lines)
    violations.extend(non_numeric_cells(cells, table))
    violations.extend(schema_violations(cells))
    violations.extend(missing_required_values(cells))
    formats = plate_formats(cells, violations)
    violations.extend(duplicate_wells(cells))
    z_primes = controls_and_z_primes(cells, violations)
    return PlateFileResult(
        file=file,
        table=typed_table(cells),
        violations=cap(violations),
        z_primes=z_primes,
        plate_formats=formats,
    )


def check_plate_file(data: bytes, file: str) -> PlateFileResult:
    """Read and validate one plate file given as raw bytes (the main entry point)."""
    table, violations = read_plate_table(data, file)
    if table is None:
        return PlateFileResult(file=file, table=None, violations=violations)
    result = validate_plate_table(table, file)
    result.violations = violations + result.violations
    return result
