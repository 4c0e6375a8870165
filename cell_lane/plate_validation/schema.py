"""What columns and cells may hold: the column rules and the cell-level rules.

Rules here: missing_column, extra_column, missing_value, non_numeric_readout,
non_numeric_value, out_of_range, invalid_well (see ``layout``), unknown_sample_type.
Every rule is one vectorised expression over a whole column (pyarrow.compute or
numpy); only the offending rows that will be listed are turned into messages.
"""

from __future__ import annotations

import re

import numpy as np

from .cells import Cells
from .columns import (
    ALLOWED_COLUMNS,
    ALLOWED_COLUMNS_TEXT,
    REQUIRED_COLUMNS,
    SAMPLE_TYPES,
    canonical_column,
    closest_sample_type,
)
from .text import quote
from .violations import Findings, Violation

_FILL_HINTS = {
    "plate_barcode": "(the barcode printed on the plate).",
    "sample_type": f"(one of {', '.join(SAMPLE_TYPES)}).",
    "well": "(e.g. A01 or P24).",
}


def column_violations(cells: Cells, found: Findings) -> None:
    """Required columns missing, and columns that are not part of the plate format."""
    for name in REQUIRED_COLUMNS:
        if name not in cells.columns:
            found.add(_missing_column(cells, name))
    for name in cells.columns:
        if name not in ALLOWED_COLUMNS:
            found.add(_extra_column(cells.file, name))


def cell_violations(cells: Cells, found: Findings) -> None:
    """Every cell-level rule, column by column."""
    for column in ("plate_barcode", "well", "sample_type"):
        if column in cells.text:
            found.at_rows(
                "missing_value",
                cells.text[column].empty(),
                lambda row, column=column: cells.violation(
                    "missing_value",
                    row,
                    column,
                    f"{cells.where(row)}: {column} is empty. Every row needs a {column}; fill it in {_FILL_HINTS[column]}",
                ),
            )
    if "sample_type" in cells.text:
        codes, values = (
            cells.text["sample_type"].codes,
            cells.text["sample_type"].values,
        )
        unknown = [
            code for code, value in enumerate(values) if value not in SAMPLE_TYPES
        ]
        if unknown:
            found.at_rows(
                "unknown_sample_type",
                np.isin(codes, unknown),
                lambda row: _unknown_sample_type(cells, row),
            )
    for column, number in cells.numbers.items():
        rule = "non_numeric_readout" if column == "readout" else "non_numeric_value"
        found.at_rows(
            rule,
            number.not_number,
            lambda row, column=column: _non_numeric(cells, column, row),
        )
        for check, bad in _range_checks(column, number.values):
            found.at_rows(
                "out_of_range",
                bad,
                lambda row, column=column, check=check: cells.violation(
                    "out_of_range",
                    row,
                    column,
                    _out_of_range_message(cells, row, column, check),
                ),
            )
    _missing_required_values(cells, found)


def _range_checks(column: str, values: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """(check, rows that fail it) for one numeric column; NaN (missing) fails none.

    The smallest and largest value (NaN skipped, one pass each) rule most checks out
    for the whole column before any row is looked at.
    """
    low = np.fmin.reduce(values) if values.size else np.nan
    high = np.fmax.reduce(values) if values.size else np.nan
    floor = 1 if column == "replicate" else 0
    checks: list[tuple[str, np.ndarray]] = []
    with np.errstate(invalid="ignore"):
        if np.isinf(low) or np.isinf(high):
            checks.append(("finite", np.isinf(values)))
        finite = np.isfinite(values) if checks else ~np.isnan(values)
        if column == "replicate":
            whole = values == np.floor(values)
            if not whole[finite].all():
                checks.append(("whole_number", finite & ~whole))
        if low < floor:
            checks.append(
                (
                    "at_least_one" if column == "replicate" else "not_negative",
                    finite & (values < floor),
                )
            )
    return checks


def _unknown_sample_type(cells: Cells, row: int) -> Violation:
    written = cells.cell("sample_type", row)
    suggestion = closest_sample_type(written or "")
    return cells.violation(
        "unknown_sample_type",
        row,
        "sample_type",
        f"{cells.where(row)}, well {cells.cell('well', row) or '?'}: sample_type {quote(written)} "
        f"is not allowed. Use exactly one of {', '.join(SAMPLE_TYPES)} (lower case)"
        + (f"; did you mean '{suggestion}'?" if suggestion else "."),
    )


def _out_of_range_message(cells: Cells, row: int, column: str, check: str) -> str:
    lead = f"{cells.where(row)}, well {cells.cell('well', row) or '?'}: {column} {quote(cells.cell(column, row))}"
    if check == "finite":
        return f"{lead} is not a finite number. Replace it with the measured value" + (
            ", or set sample_type to 'empty' if the well was not measured."
            if column == "readout"
            else "."
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


def _missing_column(cells: Cells, name: str) -> Violation:
    lookalike = next(
        (c for c in cells.columns if canonical_column(c) == name and c != name), None
    )
    hint = (
        f" The file has a column '{lookalike}': rename it to '{name}'."
        if lookalike
        else ""
    )
    return Violation(
        file=cells.file,
        rule="missing_column",
        column=name,
        message=(
            f"Required column '{name}' is missing.{hint} The header must contain "
            f"{ALLOWED_COLUMNS_TEXT}; names are lower case and spelled exactly as shown."
        ),
    )


def _extra_column(file: str, name: str) -> Violation:
    canonical = canonical_column(name)
    shown = (
        f"'{name}'"
        if name
        else "with an empty name (often a trailing comma at the end of each line)"
    )
    hint = (
        f" If it holds {canonical} values, rename it to '{canonical}'."
        if canonical
        else ""
    )
    return Violation(
        file=file,
        rule="extra_column",
        column=name,
        message=(
            f"Column {shown} is not part of the plate format.{hint} Remove it (keep notes "
            f"outside the plate file); the allowed columns are {ALLOWED_COLUMNS_TEXT}."
        ),
    )


def _non_numeric(cells: Cells, column: str, row: int) -> Violation:
    written = cells.cell(column, row) or ""
    hint = ""
    if re.fullmatch(r"[+-]?\d+,\d+", written):
        hint = f" It looks like a decimal comma: write {written.replace(',', '.')!r} instead."
    example = (
        "a whole number such as 1 or 2" if column == "replicate" else "e.g. 1234.5"
    )
    rule = "non_numeric_readout" if column == "readout" else "non_numeric_value"
    return cells.violation(
        rule,
        row,
        column,
        f"{cells.where(row)}, well {cells.cell('well', row) or '?'}: {column} "
        f"{quote(written)} is not a number.{hint} Enter a plain number ({example}) "
        "with '.' as the decimal separator and no units, thousands separators or "
        "instrument flags"
        + (
            "; if the well could not be measured, set its sample_type to 'empty' "
            "and leave the readout empty."
            if column == "readout"
            else "; leave the cell empty if the value is not known."
        ),
    )


def _missing_required_values(cells: Cells, found: Findings) -> None:
    """Readouts are required except for 'empty' wells; perturbation for 'sample' wells."""
    if "sample_type" not in cells.text:
        return
    if "readout" in cells.numbers:
        readout = cells.numbers["readout"]
        missing = (
            np.isnan(readout.values)
            & ~readout.not_number
            & ~cells.equals("sample_type", "empty")
        )
        found.at_rows(
            "missing_value", missing, lambda row: _missing_readout(cells, row)
        )
    if "perturbation" in cells.text:
        missing = (
            cells.equals("sample_type", "sample") & cells.text["perturbation"].empty()
        )
        found.at_rows(
            "missing_value",
            missing,
            lambda row: cells.violation(
                "missing_value",
                row,
                "perturbation",
                f"{cells.where(row)}, well {cells.cell('well', row) or '?'}: perturbation "
                "is empty, but 'sample' wells need the gene symbol that was perturbed "
                "(e.g. CD3E). Fill it in, or set sample_type to pos_ctrl, neg_ctrl or "
                "empty if this well is not a sample.",
            ),
        )


def _missing_readout(cells: Cells, row: int) -> Violation:
    written = cells.cell("readout", row)
    said = "" if written is None else f" (the cell says {quote(written)})"
    return cells.violation(
        "missing_value",
        row,
        "readout",
        f"{cells.where(row)}, well {cells.cell('well', row) or '?'}: readout is "
        f"missing{said}. Every well except 'empty' wells needs a readout; enter "
        "the measured value, or set sample_type to 'empty' if the well holds "
        "nothing or was not measured.",
    )
