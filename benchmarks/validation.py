"""Figure 1: plate validation throughput (wells per second).

The project's validator, ``cell_lane.plate_validation.check_plate_file``, is
timed against a plain ``pandas.read_csv`` of the very same bytes. Both start
from bytes in memory, so neither includes disk reads.

The plate files are valid (the happy path): 96-well plates laid out by
``cell_lane.plate_layout.plate_layout`` with readouts drawn from
neg_ctrl ~ N(1000, 40), pos_ctrl ~ N(250, 30) and sample ~ N(700, 100)
(empty wells keep no readout), and one 384-well plate in the same layout
style. The benchmark stops with an error if the validator finds any
violation in them, so a fast "rejected" path can never be measured by mistake.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from benchmarks import REPEATS, Timing, time_pair
from cell_lane.plate_layout import GENES_PER_PLATE, plate_layout
from cell_lane.plate_validation import check_plate_file

SEED = 20240601
READOUT_DISTRIBUTIONS: dict[str, tuple[float, float]] = {
    "neg_ctrl": (1000.0, 40.0),
    "pos_ctrl": (250.0, 30.0),
    "sample": (700.0, 100.0),
}
MANY_PLATES = 200


@dataclass
class PlateCase:
    name: str
    file: str  # name passed to the validator (its suffix picks the CSV reader)
    data: bytes
    wells: int
    plates: int
    plate_size: int  # 96 or 384: the format the validator should recognise


@dataclass
class ValidationResult:
    case: PlateCase
    validator: Timing
    pandas_read: Timing

    @property
    def validator_wells_per_s(self) -> float:
        return self.case.wells / self.validator.median

    @property
    def pandas_wells_per_s(self) -> float:
        return self.case.wells / self.pandas_read.median

    @property
    def cost_multiple(self) -> float:
        """Validator time as a multiple of the plain read time (1.0 = no extra cost)."""
        return self.validator.median / self.pandas_read.median

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.case.name,
            "file": self.case.file,
            "plates": self.case.plates,
            "plate_size": self.case.plate_size,
            "wells": self.case.wells,
            "file_bytes": len(self.case.data),
            "validator": {
                "function": "cell_lane.plate_validation.check_plate_file",
                "wells_per_s": self.validator_wells_per_s,
                **self.validator.to_dict(),
            },
            "baseline": {
                "function": "pandas.read_csv(io.BytesIO(data))",
                "wells_per_s": self.pandas_wells_per_s,
                **self.pandas_read.to_dict(),
            },
            "ratio_validator_over_baseline": self.cost_multiple,
        }


def _fill_readouts(table: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
    """Readouts as an instrument export would give them (2 decimals); empty wells stay blank."""
    table = table.copy()
    for sample_type, (mean, sd) in READOUT_DISTRIBUTIONS.items():
        mask = table["sample_type"] == sample_type
        values = rng.normal(mean, sd, int(mask.sum())).clip(min=0.0).round(2)
        table.loc[mask, "readout"] = values
    return table


def _gene_names(start: int, count: int) -> list[str]:
    return [f"GENE{start + i:05d}" for i in range(count)]


def plate_96(index: int, rng: np.random.Generator) -> pd.DataFrame:
    """One valid 96-well plate with barcode ``PLT<index>`` and distinct genes."""
    genes = _gene_names(index * GENES_PER_PLATE, GENES_PER_PLATE)
    return _fill_readouts(plate_layout(genes, f"PLT{index:05d}"), rng)


def plate_384(barcode: str, rng: np.random.Generator) -> pd.DataFrame:
    """One valid 384-well plate in the 96-well layout's style: column 1 negative
    controls, column 24 positive controls, columns 2-23 genes in duplicate, the
    last 4 sample wells empty."""
    rows = "ABCDEFGHIJKLMNOP"
    records = []
    for r in rows:
        records.append((f"{r}01", "neg_ctrl", "", pd.NA))
        records.append((f"{r}24", "pos_ctrl", "", pd.NA))
    sample_wells = [f"{r}{c:02d}" for r in rows for c in range(2, 24)]
    n_genes = (len(sample_wells) - 4) // 2
    slots = [(g, rep) for g in _gene_names(0, n_genes) for rep in (1, 2)]
    for well, slot in zip(sample_wells, slots + [None] * (len(sample_wells) - len(slots))):
        records.append((well, "empty", "", pd.NA) if slot is None else (well, "sample", *slot))
    table = pd.DataFrame(records, columns=["well", "sample_type", "perturbation", "replicate"])
    table.insert(0, "plate_barcode", barcode)
    table["readout"] = float("nan")
    table["replicate"] = table["replicate"].astype("Int64")
    table = table.sort_values("well", kind="stable").reset_index(drop=True)
    return _fill_readouts(table, rng)


def _csv_bytes(table: pd.DataFrame) -> bytes:
    return table.to_csv(index=False).encode("utf-8")


def build_cases() -> list[PlateCase]:
    rng = np.random.default_rng(SEED)
    one = plate_96(0, rng)
    big384 = plate_384("PLT384-00001", rng)
    many = pd.concat([plate_96(i, rng) for i in range(MANY_PLATES)], ignore_index=True)
    return [
        PlateCase("1 plate (96-well)", "plates/bench_1x96.csv", _csv_bytes(one), len(one), 1, 96),
        PlateCase(
            "1 plate (384-well)", "plates/bench_1x384.csv", _csv_bytes(big384), len(big384), 1, 384
        ),
        PlateCase(
            f"{MANY_PLATES} plates (96-well)",
            f"plates/bench_{MANY_PLATES}x96.csv",
            _csv_bytes(many),
            len(many),
            MANY_PLATES,
            96,
        ),
    ]


def _require_happy_path(case: PlateCase) -> None:
    """The generated file must pass validation and read back whole, or the figure is meaningless."""
    result = check_plate_file(case.data, case.file)
    if not result.ok:
        listing = "\n".join(v.describe() for v in result.violations[:10])
        raise RuntimeError(
            f"benchmark data for '{case.name}' is not a valid plate file; "
            f"the validator found {len(result.violations)} violation(s):\n{listing}"
        )
    rows = 0 if result.table is None else len(result.table)
    if rows != case.wells:
        raise RuntimeError(f"validator returned {rows} rows for '{case.name}', expected {case.wells}")
    formats = result.plate_formats
    if len(formats) != case.plates or set(formats.values()) != {case.plate_size}:
        raise RuntimeError(
            f"validator saw {len(formats)} plate(s) of format(s) {sorted(set(formats.values()))} "
            f"in '{case.name}', expected {case.plates} {case.plate_size}-well plate(s)"
        )
    read = pd.read_csv(io.BytesIO(case.data))
    if len(read) != case.wells:
        raise RuntimeError(f"pandas read {len(read)} rows for '{case.name}', expected {case.wells}")


def run(repeats: int = REPEATS) -> list[ValidationResult]:
    results = []
    for case in build_cases():
        _require_happy_path(case)
        data, file = case.data, case.file
        validator, pandas_read = time_pair(
            lambda: check_plate_file(data, file),
            lambda: pd.read_csv(io.BytesIO(data)),
            repeats=repeats,
        )
        results.append(ValidationResult(case, validator, pandas_read))
    return results
