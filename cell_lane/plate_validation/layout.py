"""Where wells are: well names, plate formats (96/384/1536), duplicate wells, controls and Z′.

Each rule works on whole columns: well names are parsed once per distinct name,
plates are compared through integer codes (``pyarrow.compute.dictionary_encode``)
with numpy, and only the rows that will be listed become messages.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from .cells import Cells
from .text import quote
from .violations import Findings, Violation

Z_PRIME_THRESHOLD = 0.5
"""A plate whose Z' is below this is flagged as a warning (not a violation)."""

#: plate size -> (number of rows A.., number of columns 1..)
PLATE_LAYOUTS: dict[int, tuple[int, int]] = {96: (8, 12), 384: (16, 24), 1536: (32, 48)}

# Anything that is a real position on a 96-, 384- or 1536-well plate: an
# uppercase row letter (A-Z, or AA-AF on 1536-well plates) followed by a
# two-digit column 01-48. Names like "A1", "a01" or "Z99" do not match.
WELL_SYNTAX = re.compile(r"^(?P<row>[A-Z]|A[A-F])(?P<col>0[1-9]|[1-3][0-9]|4[0-8])$")
_WELL_LOOSE = re.compile(
    r"^\s*(?P<row>[A-Za-z]{1,2})\s*[-_ ]?\s*0*(?P<col>\d{1,2})\s*$"
)


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


def invalid_well_message(where: str, written: str | None) -> str:
    """Message for an ``invalid_well``, suggesting the intended well when it is obvious."""
    suggestion = _suggest_well(written or "")
    return (
        f"{where}: well {quote(written)} is not a valid well name. Write wells as an "
        "uppercase row letter followed by a two-digit column, e.g. A01, B12, H12 "
        "(96-well), P24 (384-well) or AF48 (1536-well)"
        + (f"; did you mean '{suggestion}'?" if suggestion else ".")
    )


def _suggest_well(written: str) -> str | None:
    match = _WELL_LOOSE.match(written)
    if not match:
        return None
    candidate = f"{match['row'].upper()}{int(match['col']):02d}"
    return candidate if well_position(candidate) is not None else None


#: Size class of a well name: the smallest plate it lies on (0: 96, 1: 384, 2: 1536), or not a well.
_SIZES = (96, 384, 1536)
_NOT_A_WELL = 3


class Wells:
    """Each row's well as a size class: the smallest plate format it lies on, or ``_NOT_A_WELL``.

    Well names are parsed once per distinct name, then looked up for every row.
    """

    def __init__(self, cells: Cells) -> None:
        self.codes, self.names = cells.text["well"].codes, cells.text["well"].values
        by_name = [_size_class(well_position(name)) for name in self.names]
        classes = np.array([*by_name, _NOT_A_WELL], dtype=np.int8)
        self.size_class = classes[self.codes]  # code -1 (empty) takes the last entry
        # Whether any row is empty or not a well (else the plate rules skip their masks).
        self.all_wells = _NOT_A_WELL not in by_name and self.codes.min(initial=0) >= 0


def _size_class(position: tuple[int, int] | None) -> int:
    if position is None:
        return _NOT_A_WELL
    for size_class, size in enumerate(_SIZES):
        rows, columns = PLATE_LAYOUTS[size]
        if position[0] < rows and position[1] <= columns:
            return size_class
    return _NOT_A_WELL


def invalid_wells(cells: Cells, wells: Wells, found: Findings) -> None:
    invalid = (wells.codes >= 0) & (wells.size_class == _NOT_A_WELL)
    found.at_rows(
        "invalid_well",
        invalid,
        lambda row: cells.violation(
            "invalid_well",
            row,
            "well",
            invalid_well_message(cells.where(row), cells.cell("well", row)),
        ),
    )


# ---------------------------------------------------------------------------
# Plates
# ---------------------------------------------------------------------------


def plate_formats(cells: Cells, wells: Wells, found: Findings) -> dict[str, int]:
    """Decide 96, 384 or 1536 per plate; report wells outside the plate and mixed formats.

    A plate with more than 384 rows is a 1536-well plate (A01-AF48); a smaller one
    is a 96-well plate when all its wells lie within A01-H12, else a 384-well plate,
    and a well outside A01-P24 on it is a ``well_outside_plate``.
    """
    if "plate_barcode" in cells.text:
        plate = cells.text["plate_barcode"].codes
        barcodes = cells.text["plate_barcode"].values
    else:
        plate, barcodes = np.full(cells.rows, -1, dtype=np.int32), []
    every_plate = plate.min(initial=0) >= 0  # every row names its plate
    beyond_384 = wells.size_class == 2
    outside = None
    if (
        barcodes and beyond_384.any()
    ):  # a plate with more than 384 rows is a 1536-well plate
        rows = np.bincount(
            plate if every_plate else plate[plate >= 0], minlength=len(barcodes)
        )
        if (rows <= 384).any() or not every_plate:
            small_plate = np.append(rows <= 384, True)  # plate -1 (no barcode) is small
            outside = beyond_384 & small_plate[plate]
    elif not barcodes:
        outside = beyond_384
    if outside is not None:
        found.at_rows("well_outside_plate", outside, lambda row: _outside(cells, row))
    classes = len(_SIZES)
    key = plate * classes + wells.size_class  # plate and size class in one int32
    if not (every_plate and wells.all_wells) or (outside is not None and outside.any()):
        placed = (wells.size_class != _NOT_A_WELL) & (plate >= 0)
        key = key[placed if outside is None else placed & ~outside]
    seen = np.bincount(key, minlength=len(barcodes) * classes) > 0
    seen = seen.reshape(
        len(barcodes), classes
    )  # the size classes each plate's wells have
    has_wells = seen.any(axis=1)
    largest = classes - 1 - np.argmax(seen[:, ::-1], axis=1)
    sizes = np.array(_SIZES)[largest]
    formats = {
        str(barcodes[code]): int(sizes[code]) for code in np.flatnonzero(has_wells)
    }
    if len(set(formats.values())) > 1:
        by_format = {
            size: [b for b, s in formats.items() if s == size]
            for size in sorted(set(formats.values()))
        }
        listing = "; ".join(
            f"{size}-well: {', '.join(b)}" for size, b in by_format.items()
        )
        found.add(
            Violation(
                file=cells.file,
                rule="mixed_plate_format",
                column="well",
                message=(
                    f"This file mixes plate formats ({listing}). A plate counts as 96-well "
                    "when all its wells lie within A01-H12, as 384-well when they lie within "
                    "A01-P24, and as 1536-well (A01-AF48) when it has more than 384 wells. Put "
                    "plates of different formats in separate files, and check that each "
                    "plate's wells and barcode are correct."
                ),
            )
        )
    return formats


def _outside(cells: Cells, row: int) -> Violation:
    well = cells.cell("well", row)
    return cells.violation(
        "well_outside_plate",
        row,
        "well",
        f"{cells.where(row)}: well {well} is not on a 96-well (A01-H12) or 384-well (A01-P24) "
        "plate, and its plate has at most 384 wells, so it is not a 1536-well plate (A01-AF48) "
        "either. Correct the well name (or the plate barcode, if the well belongs to another plate).",
    )


def duplicate_wells(cells: Cells, wells: Wells, found: Findings) -> None:
    """Every repeat of a (plate, well) pair after its first row."""
    if "well" not in cells.text or "plate_barcode" not in cells.text:
        return
    plate = cells.text["plate_barcode"].codes
    both = (plate >= 0) & (wells.codes >= 0)
    key = plate.astype(np.int64) * max(len(wells.names), 1) + wells.codes
    complete = bool(both.all())
    if not complete:
        key = np.where(both, key, -1)
    present = key if complete else key[both]
    dense = present.size and present.max() < 8 * cells.rows + 1024
    if dense and np.bincount(present).max() < 2:  # dense keys: counted, none twice
        return
    keys = pd.Series(key[both])
    repeated, in_group = (
        np.zeros(cells.rows, dtype=bool),
        np.zeros(cells.rows, dtype=bool),
    )
    repeated[both] = keys.duplicated(keep="first").to_numpy()
    if not repeated.any():
        return
    in_group[both] = keys.duplicated(keep=False).to_numpy()
    grouped = np.flatnonzero(in_group)
    rows_of_key = pd.Series(grouped + 1).groupby(key[grouped]).agg(list)

    def make(row: int) -> Violation:
        return cells.violation(
            "duplicate_well",
            row,
            "well",
            f"Well {cells.cell('well', row)} of plate {cells.cell('plate_barcode', row)} appears more than once: "
            f"{cells.rows_text(rows_of_key[key[row - 1]])}. Each well may appear only once per plate; "
            "remove the duplicate row or correct its well name or plate barcode.",
        )

    found.at_rows("duplicate_well", repeated, make)


def controls_and_z_primes(cells: Cells, found: Findings) -> dict[str, float]:
    """Require >=2 positive and >=2 negative control readouts per plate; compute Z'.

    The usable control readouts (finite, >= 0) are counted, averaged and spread per
    plate with ``numpy.bincount`` over the plate codes, all plates at once.
    """
    if (
        "plate_barcode" not in cells.text
        or "sample_type" not in cells.text
        or "readout" not in cells.numbers
    ):
        return {}
    plate, barcodes = (
        cells.text["plate_barcode"].codes,
        cells.text["plate_barcode"].values,
    )
    readout = cells.numbers["readout"].values
    with np.errstate(invalid="ignore"):
        usable = np.isfinite(readout) & (readout >= 0) & (plate >= 0)
    stats = {
        name: _per_plate(
            plate, readout, usable & cells.equals("sample_type", name), len(barcodes)
        )
        for name in ("pos_ctrl", "neg_ctrl")
    }
    z_primes: dict[str, float] = {}
    for code, barcode in enumerate(barcodes):
        counts = {name: int(stats[name][0][code]) for name in stats}
        for name, label in (("pos_ctrl", "positive"), ("neg_ctrl", "negative")):
            if counts[name] < 2:
                found.add(
                    _missing_controls(
                        cells.file, str(barcode), name, label, counts[name]
                    )
                )
        if min(counts.values()) >= 2:
            (_, pos_mean, pos_sd), (_, neg_mean, neg_sd) = (
                (s[0][code], s[1][code], s[2][code]) for s in stats.values()
            )
            window = abs(pos_mean - neg_mean)
            z_primes[str(barcode)] = (
                -math.inf
                if window == 0
                else float(1.0 - 3.0 * (pos_sd + neg_sd) / window)
            )
    return z_primes


def _per_plate(
    plate: np.ndarray, values: np.ndarray, rows: np.ndarray, plates: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Count, mean and sample standard deviation (n - 1) of ``values[rows]`` per plate code."""
    codes, picked = plate[rows], values[rows]
    count = np.bincount(codes, minlength=plates)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.bincount(codes, weights=picked, minlength=plates) / count
        squares = np.bincount(
            codes, weights=(picked - mean[codes]) ** 2, minlength=plates
        )
        sd = np.sqrt(squares / (count - 1))
    return count, mean, sd


def _missing_controls(
    file: str, barcode: str, name: str, label: str, count: int
) -> Violation:
    other = "neg_ctrl" if name == "pos_ctrl" else "pos_ctrl"
    return Violation(
        file=file,
        rule="missing_controls",
        column="sample_type",
        plate_barcode=barcode,
        message=(
            f"Plate {barcode} has {count} {name} well(s) with a usable "
            f"readout; every plate needs at least 2 {name} and 2 {other} wells with "
            "readouts so that Z' and normalised effects can be computed. Add "
            f"the {label} control wells (sample_type '{name}', spelled exactly) "
            "or fix their readouts."
        ),
    )


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
            raise ValueError(
                f"z_prime needs at least 2 {name} control readouts, got {values.size}"
            )
        if not np.all(np.isfinite(values)):
            raise ValueError(f"z_prime needs finite {name} control readouts")
    spread = float(np.std(pos_values, ddof=1) + np.std(neg_values, ddof=1))
    window = abs(float(pos_values.mean() - neg_values.mean()))
    if window == 0:
        return -math.inf
    return 1.0 - 3.0 * spread / window
