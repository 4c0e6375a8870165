"""The entry points that run every check: ``validate_plate_table`` and ``check_plate_file``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pandas as pd

from .cells import Cells, arrow_from_frame, prepare_cells, typed_table, unique_columns
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

#: Files with at least this many data rows check their plate rules on a second thread.
PARALLEL_ROWS = 50_000


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
    # The plate rules and the cell rules read the same columns and write nothing shared: on a
    # big file they run side by side (numpy and Arrow release the GIL for whole-column work).
    plates = _Background(_plate_rules, cells) if cells.rows >= PARALLEL_ROWS else None
    formats, plate_found = _plate_rules(cells) if plates is None else ({}, Findings())
    cell_violations(cells, found)
    z_primes = controls_and_z_primes(cells, found)
    if plates is not None:
        formats, plate_found = plates.result()
    found.listed += plate_found.listed
    found.unlisted += plate_found.unlisted
    return PlateFileResult(
        file=file,
        violations=found.capped(),
        z_primes=z_primes,
        plate_formats=formats,
        build_table=lambda: typed_table(cells),
    )


def _plate_rules(cells: Cells) -> tuple[dict[str, int], Findings]:
    """Well names, plate formats and duplicate wells (needs the well column)."""
    found = Findings()
    if "well" not in cells.text:
        return {}, found
    wells = Wells(cells)
    invalid_wells(cells, wells, found)
    formats = plate_formats(cells, wells, found)
    duplicate_wells(cells, wells, found)
    return formats, found


class _Background:
    """Run ``work(*args)`` on a thread of its own; ``result()`` waits and returns it (or raises its error).

    A fresh thread per big file, not a pool: a pool made before a fork has no thread after it.
    """

    def __init__(self, work: Callable[..., Any], *args: Any) -> None:
        self._result: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(work, args), name="plate-rules", daemon=True
        )
        self._thread.start()

    def _run(self, work: Callable[..., Any], args: tuple) -> None:
        try:
            self._result = work(*args)
        except BaseException as error:  # noqa: BLE001 - handed to the caller by result()
            self._error = error

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result
