"""Figure 1: plate validation throughput (wells per second).

The project's validator, ``cell_lane.plate_validation.check_plate_file`` (read, every check,
the verdict), is timed against a plain ``pyarrow.csv.read_csv`` of the very same bytes (the
baseline: parsing the file is the least any validator must do), with ``pandas.read_csv`` of
the same bytes as a second reference; a fourth column also takes the typed pandas table
(``result.table``, built when first asked for), as the ingest asset does. All start from bytes
in memory, so none includes disk reads.

The plate files are valid (the happy path): 96-well plates laid out by
``cell_lane.plate_layout.plate_layout`` with readouts drawn from neg_ctrl ~ N(1000, 40),
pos_ctrl ~ N(250, 30) and sample ~ N(700, 100) (empty wells keep no readout), and 384- and
1536-well plates in the same layout style. The benchmark stops with an error if the
validator finds any violation in them, so a fast "rejected" path can never be measured by
mistake.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from benchmarks import REPEATS, Timing, time_group
from cell_lane.plate_layout import GENES_PER_PLATE, plate_layout
from cell_lane.plate_validation import check_plate_file

SEED = 20240601
READOUT_DISTRIBUTIONS: dict[str, tuple[float, float]] = {
    "neg_ctrl": (1000.0, 40.0),
    "pos_ctrl": (250.0, 30.0),
    "sample": (700.0, 100.0),
}
MANY_PLATES = 200
SCREEN_PLATES = 1000  # a genome-wide screen on 1536-well plates
GENOME_GENES = 20_000  # genes of the screen's library, cycled over its plates
PLATE_ROWS = {
    96: "ABCDEFGH",
    384: "ABCDEFGHIJKLMNOP",
    1536: [*"ABCDEFGHIJKLMNOPQRSTUVWXYZ", *(f"A{c}" for c in "ABCDEF")],
}
PLATE_COLUMNS = {96: 12, 384: 24, 1536: 48}


@dataclass
class PlateCase:
    name: str
    file: str  # name passed to the validator (its suffix picks the CSV reader)
    data: bytes
    wells: int
    plates: int
    plate_size: int  # 96, 384 or 1536: the format the validator should recognise


@dataclass
class ValidationResult:
    case: PlateCase
    validator: Timing
    with_table: Timing
    arrow_read: Timing
    pandas_read: Timing

    @property
    def validator_wells_per_s(self) -> float:
        return self.case.wells / self.validator.median

    @property
    def arrow_wells_per_s(self) -> float:
        return self.case.wells / self.arrow_read.median

    @property
    def pandas_wells_per_s(self) -> float:
        return self.case.wells / self.pandas_read.median

    @property
    def with_table_ratio(self) -> float:
        """The same ratio when the caller also takes the typed pandas table (``result.table``)."""
        return self.arrow_read.median / self.with_table.median

    @property
    def throughput_ratio(self) -> float:
        """Validator wells/s ÷ plain pyarrow read wells/s (1.0 = validating costs nothing beyond the parse)."""
        return self.arrow_read.median / self.validator.median

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
            "validator_and_pandas_table": {
                "function": "cell_lane.plate_validation.check_plate_file(data, file).table",
                "wells_per_s": self.case.wells / self.with_table.median,
                "throughput_ratio_over_baseline": self.with_table_ratio,
                **self.with_table.to_dict(),
            },
            "baseline": {
                "function": "pyarrow.csv.read_csv(pyarrow.BufferReader(data))",
                "wells_per_s": self.arrow_wells_per_s,
                **self.arrow_read.to_dict(),
            },
            "reference": {
                "function": "pandas.read_csv(io.BytesIO(data))",
                "wells_per_s": self.pandas_wells_per_s,
                **self.pandas_read.to_dict(),
            },
            "throughput_ratio_validator_over_baseline": self.throughput_ratio,
            "time_ratio_validator_over_baseline": 1.0 / self.throughput_ratio,
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
    return [f"GENE{(start + i) % GENOME_GENES:05d}" for i in range(count)]


def plate_96(index: int, rng: np.random.Generator) -> pd.DataFrame:
    """One valid 96-well plate with barcode ``PLT<index>`` and distinct genes."""
    genes = _gene_names(index * GENES_PER_PLATE, GENES_PER_PLATE)
    return _fill_readouts(plate_layout(genes, f"PLT{index:05d}"), rng)


def plate_layout_large(size: int) -> pd.DataFrame:
    """A 384- or 1536-well plate in the 96-well layout's style, without barcode and genes:
    column 1 negative controls, the last column positive controls, the columns between
    them samples in duplicate (``slot`` numbers the genes), the last 4 sample wells empty."""
    rows, last = PLATE_ROWS[size], PLATE_COLUMNS[size]
    records = [(f"{r}01", "neg_ctrl", -1, pd.NA) for r in rows] + [
        (f"{r}{last:02d}", "pos_ctrl", -1, pd.NA) for r in rows
    ]
    sample_wells = [f"{r}{c:02d}" for r in rows for c in range(2, last)]
    genes = (len(sample_wells) - 4) // 2
    for position, well in enumerate(sample_wells):
        slot = position // 2
        records.append(
            (well, "empty", -1, pd.NA)
            if slot >= genes
            else (well, "sample", slot, position % 2 + 1)
        )
    table = pd.DataFrame(records, columns=["well", "sample_type", "slot", "replicate"])
    table["replicate"] = table["replicate"].astype("Int64")
    return table.sort_values(
        "well", key=lambda w: w.str.len() * 1000 + w.rank(method="dense"), kind="stable"
    ).reset_index(drop=True)


def large_plates(size: int, count: int, rng: np.random.Generator) -> pd.DataFrame:
    """``count`` valid plates of ``size`` wells, barcodes ``PLT<size>-<index>``; the genes run
    through a genome-wide library of ``GENOME_GENES`` genes, plate after plate."""
    layout = plate_layout_large(size)
    genes_per_plate = int(layout["slot"].max()) + 1
    plate = np.repeat(np.arange(count), len(layout))
    slot = np.tile(layout["slot"].to_numpy(), count)
    gene = (plate * genes_per_plate + slot) % GENOME_GENES
    names = np.array([f"GENE{g:05d}" for g in range(GENOME_GENES)], dtype=object)
    table = pd.DataFrame(
        {
            "plate_barcode": np.array(
                [f"PLT{size}-{i:05d}" for i in range(count)], dtype=object
            )[plate],
            "well": np.tile(layout["well"].to_numpy(), count),
            "sample_type": np.tile(layout["sample_type"].to_numpy(), count),
            "perturbation": np.where(slot >= 0, names[gene], ""),
            "replicate": pd.array(
                np.tile(layout["replicate"].to_numpy(), count), dtype="Int64"
            ),
            "readout": np.nan,
        }
    )
    return _fill_readouts(table, rng)


def _csv_bytes(table: pd.DataFrame) -> bytes:
    return table.to_csv(index=False).encode("utf-8")


def build_cases() -> list[PlateCase]:
    rng = np.random.default_rng(SEED)
    one = plate_96(0, rng)
    big384 = large_plates(384, 1, rng)
    one1536 = large_plates(1536, 1, rng)
    many = pd.concat([plate_96(i, rng) for i in range(MANY_PLATES)], ignore_index=True)
    screen = large_plates(1536, SCREEN_PLATES, rng)
    return [
        PlateCase(
            "1 plate (96-well)",
            "plates/bench_1x96.csv",
            _csv_bytes(one),
            len(one),
            1,
            96,
        ),
        PlateCase(
            "1 plate (384-well)",
            "plates/bench_1x384.csv",
            _csv_bytes(big384),
            len(big384),
            1,
            384,
        ),
        PlateCase(
            "1 plate (1536-well)",
            "plates/bench_1x1536.csv",
            _csv_bytes(one1536),
            len(one1536),
            1,
            1536,
        ),
        PlateCase(
            f"{MANY_PLATES} plates (96-well), one file",
            f"plates/bench_{MANY_PLATES}x96.csv",
            _csv_bytes(many),
            len(many),
            MANY_PLATES,
            96,
        ),
        PlateCase(
            f"{SCREEN_PLATES:,} plates (1536-well), one file",
            f"plates/bench_{SCREEN_PLATES}x1536.csv",
            _csv_bytes(screen),
            len(screen),
            SCREEN_PLATES,
            1536,
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
        raise RuntimeError(
            f"validator returned {rows} rows for '{case.name}', expected {case.wells}"
        )
    formats = result.plate_formats
    if len(formats) != case.plates or set(formats.values()) != {case.plate_size}:
        raise RuntimeError(
            f"validator saw {len(formats)} plate(s) of format(s) {sorted(set(formats.values()))} "
            f"in '{case.name}', expected {case.plates} {case.plate_size}-well plate(s)"
        )
    for reader, read in (("pyarrow", _arrow_read), ("pandas", _pandas_read)):
        count = len(read(case.data))
        if count != case.wells:
            raise RuntimeError(
                f"{reader} read {count} rows for '{case.name}', expected {case.wells}"
            )


def _arrow_read(data: bytes) -> pa.Table:
    return pacsv.read_csv(pa.BufferReader(data))


def _pandas_read(data: bytes) -> pd.DataFrame:
    return pd.read_csv(io.BytesIO(data))


def run(repeats: int = REPEATS) -> list[ValidationResult]:
    results = []
    for case in build_cases():
        _require_happy_path(case)
        data, file = case.data, case.file
        validator, with_table, arrow_read, pandas_read = time_group(
            [
                lambda data=data, file=file: check_plate_file(data, file),
                lambda data=data, file=file: check_plate_file(data, file).table,
                lambda data=data: _arrow_read(data),
                lambda data=data: _pandas_read(data),
            ],
            repeats=repeats,
        )
        results.append(
            ValidationResult(case, validator, with_table, arrow_read, pandas_read)
        )
    return results
