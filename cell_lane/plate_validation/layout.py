"""Where wells are: well names, plate formats (96/384), duplicate wells, controls and Z′."""

from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np
import pandas as pd

from .cells import Cells
from .text import quote
from .violations import Violation

Z_PRIME_THRESHOLD = 0.5
"""A plate whose Z' is below this is flagged as a warning (not a violation)."""

#: plate size -> (number of rows A.., number of columns 1..)
PLATE_LAYOUTS: dict[int, tuple[int, int]] = {96: (8, 12), 384: (16, 24)}

# Anything that is a real position on a 96-, 384- or 1536-well plate: an
# uppercase row letter (A-Z, or AA-AF on 1536-well plates) followed by a
# two-digit column 01-48. Names like "A1", "a01" or "Z99" do not match.
WELL_SYNTAX = re.compile(r"^(?P<row>[A-Z]|A[A-F])(?P<col>0[1-9]|[1-3][0-9]|4[0-8])$")
_WELL_LOOSE = re.compile(r"^\s*(?P<row>[A-Za-z]{1,2})\s*[-_ ]?\s*0*(?P<col>\d{1,2})\s*$")


# ---------------------------------------------------------------------------
# Wells
# ---------------------------------------------------------------------------


def well_position(well: str | None) -> tuple[int, int] | None:
    """(0-based row index, 1-based column) for a syntactically valid well name."""
    if well is None:
        return None
    match = WELL_SYNTAX.match(well)
    if not match:
        return None
    letters = match["row"]
    row_index = ord(letters[-1]) - ord("A") + (26 if len(letters) == 2 else 0)
    return row_index, int(match["col"])


def _fits(position: tuple[int, int], plate_size: int) -> bool:
    rows, columns = PLATE_LAYOUTS[plate_size]
    return position[0] < rows and position[1] <= columns


def invalid_well_message(where: str, written: str | None) -> str:
    """Message for an ``invalid_well``, suggesting the intended well when it is obvious."""
    suggestion = _suggest_well(written or "")
    return (
        f"{where}: well {quote(written)} is not a valid well name. Write wells as an "
        "uppercase row letter followed by a two-digit column, e.g. A01, B12, H12 "
        "(96-well) or P24 (384-well)"
        + (f"; did you mean '{suggestion}'?" if suggestion else ".")
    )


def _suggest_well(written: str) -> str | None:
    match = _WELL_LOOSE.match(written)
    if not match:
        return None
    candidate = f"{match['row'].upper()}{int(match['col']):02d}"
    return candidate if well_position(candidate) is not None else None


# ---------------------------------------------------------------------------
# Plates
# ---------------------------------------------------------------------------


def plate_formats(cells: Cells, violations: list[Violation]) -> dict[str, int]:
    """Decide 96 or 384 per plate; report wells outside a 384-well plate and mixed formats."""
    frame = cells.frame
    if "well" not in frame.columns:
        return {}
    barcodes = (
        frame["plate_barcode"].tolist() if "plate_barcode" in frame.columns else [None] * len(frame)
    )
    fits_96: dict[str, bool] = {}
    for position, (barcode, well) in enumerate(zip(barcodes, frame["well"].tolist())):
        where = well_position(well)
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


def duplicate_wells(cells: Cells) -> list[Violation]:
    """Every repeat of a (plate, well) pair after its first row."""
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


def controls_and_z_primes(cells: Cells, violations: list[Violation]) -> dict[str, float]:
    """Require >=2 positive and >=2 negative control readouts per plate; compute Z'.

    One pass over the table: the usable control readouts (finite, >= 0) are grouped
    by (plate, sample type) once, in row order, instead of filtering the whole table
    for every plate.
    """
    frame = cells.frame
    if not {"plate_barcode", "sample_type", "readout"} <= set(frame.columns):
        return {}
    readout = frame["readout"]
    usable = np.isfinite(readout) & (readout >= 0) & frame["sample_type"].isin(("pos_ctrl", "neg_ctrl"))
    controls = frame.loc[usable, ["plate_barcode", "sample_type", "readout"]]
    readouts: dict[tuple[str, str], list[float]] = {
        key: values.tolist()
        for key, values in controls.groupby(["plate_barcode", "sample_type"], sort=False)["readout"]
    }
    z_primes: dict[str, float] = {}
    for barcode in pd.unique(frame["plate_barcode"].dropna()):
        pos = readouts.get((barcode, "pos_ctrl"), [])
        neg = readouts.get((barcode, "neg_ctrl"), [])
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
