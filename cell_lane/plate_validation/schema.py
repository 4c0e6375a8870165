"""What cells may hold: the pandera schema and the cell-level rules.

Rules here: missing_column, extra_column, missing_value, non_numeric_readout,
non_numeric_value, out_of_range, invalid_well, unknown_sample_type (and ``schema``
for a failure no rule describes).
"""

from __future__ import annotations

import math
import re
import warnings
from typing import Any, Callable

import numpy as np
import pandas as pd
import pandera.pandas as pa

from .cells import Cells, parse_number, to_text
from .columns import ALLOWED_COLUMNS_TEXT, NUMERIC_COLUMNS, SAMPLE_TYPES, canonical_column, closest_sample_type
from .layout import WELL_SYNTAX, invalid_well_message
from .text import quote
from .violations import Violation

# ---------------------------------------------------------------------------
# The pandera schema
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
                pa.Check(lambda s: s.str.fullmatch(WELL_SYNTAX.pattern), name="well_syntax"),
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


SCHEMA = _build_schema()


def schema_violations(cells: Cells) -> list[Violation]:
    """Run the pandera schema and turn each failure case into a Violation."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            SCHEMA.validate(cells.frame, lazy=True)
    except pa.errors.SchemaErrors as errors:
        cases = errors.failure_cases
    else:
        return []
    return [_failure_case_to_violation(cells, case) for case in cases.to_dict("records")]


def _failure_case_to_violation(cells: Cells, case: dict[str, Any]) -> Violation:
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
        return cells.violation("invalid_well", row, column, invalid_well_message(where, written))
    if check == "sample_type_allowed":
        suggestion = closest_sample_type(written or "")
        return cells.violation(
            "unknown_sample_type",
            row,
            column,
            f"{where}, well {cells.cell('well', row) or '?'}: sample_type {quote(written)} "
            f"is not allowed. Use exactly one of {', '.join(SAMPLE_TYPES)} (lower case)"
            + (f"; did you mean '{suggestion}'?" if suggestion else "."),
        )
    return cells.violation(
        "out_of_range", row, column, _out_of_range_message(cells, row, column, check, written)
    )


def _out_of_range_message(
    cells: Cells, row: int, column: str, check: str, written: str | None
) -> str:
    lead = f"{cells.where(row)}, well {cells.cell('well', row) or '?'}: {column} {quote(written)}"
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


def _missing_column(cells: Cells, name: str) -> Violation:
    lookalike = next(
        (c for c in cells.frame.columns if canonical_column(str(c)) == name and str(c) != name),
        None,
    )
    hint = f" The file has a column '{lookalike}': rename it to '{name}'." if lookalike else ""
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
    shown = f"'{name}'" if name else "with an empty name (often a trailing comma at the end of each line)"
    hint = f" If it holds {canonical} values, rename it to '{canonical}'." if canonical else ""
    return Violation(
        file=file,
        rule="extra_column",
        column=name,
        message=(
            f"Column {shown} is not part of the plate format.{hint} Remove it (keep notes "
            f"outside the plate file); the allowed columns are {ALLOWED_COLUMNS_TEXT}."
        ),
    )


# ---------------------------------------------------------------------------
# Cell-level rules the schema cannot express
# ---------------------------------------------------------------------------


def non_numeric_cells(cells: Cells, table: pd.DataFrame) -> list[Violation]:
    """Cells of the numeric columns that are neither a number nor missing (``table`` holds them as written)."""
    found: list[Violation] = []
    for column in NUMERIC_COLUMNS:
        if column in cells.frame.columns:
            found.extend(_non_numeric(cells, column, table[column].tolist()))
    return found


def _non_numeric(cells: Cells, column: str, values: list[Any]) -> list[Violation]:
    rule = "non_numeric_readout" if column == "readout" else "non_numeric_value"
    found: list[Violation] = []
    for position, value in enumerate(values):
        _, ok = parse_number(value)
        if ok:
            continue
        row = position + 1
        written = to_text(value) or ""
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
        )
    return found


def missing_required_values(cells: Cells) -> list[Violation]:
    """Readouts are required except for 'empty' wells; perturbation for 'sample' wells."""
    frame = cells.frame
    found: list[Violation] = []
    if "sample_type" not in frame.columns:
        return found
    sample_types = frame["sample_type"].tolist()
    if "readout" in frame.columns:
        readouts = frame["readout"].tolist()
        for position, (sample_type, written) in enumerate(
            zip(sample_types, cells.raw_text["readout"])
        ):
            row = position + 1
            if sample_type == "empty" or not parse_number(written)[1]:
                continue  # empty wells may lack a readout; non-numbers already reported
            if not math.isnan(readouts[position]):
                continue
            said = "" if written is None else f" (the cell says {quote(written)})"
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
