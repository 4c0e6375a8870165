"""Read and check one assay plate file sent by a lab.

A lab drop contains one or more *plate files* (CSV or Parquet). Each row of a
plate file describes one well of one plate: which plate (``plate_barcode``),
which well (``well``, e.g. ``B03``), what was in it (``sample_type`` and
``perturbation``) and what the instrument measured (``readout``).

This package takes the raw bytes of one plate file and tells you, precisely and
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

Everything is read once with pyarrow and checked with whole-column expressions
(pyarrow.compute, numpy); Python formats only the violations that are listed.

Modules (import from the package, not from them):

- ``violations`` — ``Violation``, ``PlateFileResult``, the rule order and per-rule cap;
- ``columns`` — the plate file's columns and sample types;
- ``reading`` — bytes to an Arrow table of raw cells: file type, CSV (pyarrow.csv), Parquet;
- ``strict_csv`` — the exact CSV reader for files pyarrow cannot vouch for (encoding,
  delimiter, ragged rows, stray quotes), with line numbers;
- ``lines`` — the CSV line of each data row, worked out only when a message needs it;
- ``text_cells`` — text columns as the checks see them: coded (barcodes, wells, sample types)
  or plain Arrow strings (perturbation);
- ``cells`` — the raw table normalised for checking (text stripped and coded, numbers parsed);
- ``schema`` — the column rules and the cell-level rules;
- ``layout`` — wells, plate formats (96, 384, 1536), duplicate wells, controls and Z′;
- ``effects`` — ``normalised_effects``;
- ``validate`` — ``validate_plate_table`` and ``check_plate_file``, which run them all.
"""

from __future__ import annotations

from .columns import ALLOWED_COLUMNS, OPTIONAL_COLUMNS, REQUIRED_COLUMNS, SAMPLE_TYPES
from .effects import normalised_effects
from .layout import Z_PRIME_THRESHOLD, z_prime
from .reading import read_plate_table
from .validate import check_plate_file, validate_plate_table
from .violations import MAX_VIOLATIONS_PER_RULE, PlateFileResult, Violation

__all__ = [
    "ALLOWED_COLUMNS",
    "MAX_VIOLATIONS_PER_RULE",
    "OPTIONAL_COLUMNS",
    "REQUIRED_COLUMNS",
    "SAMPLE_TYPES",
    "Z_PRIME_THRESHOLD",
    "PlateFileResult",
    "Violation",
    "check_plate_file",
    "normalised_effects",
    "read_plate_table",
    "validate_plate_table",
    "z_prime",
]
