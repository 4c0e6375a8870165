"""The plate file's columns, the allowed sample types, and guesses at what a misspelling meant."""

from __future__ import annotations

import re

REQUIRED_COLUMNS: tuple[str, ...] = (
    "plate_barcode",
    "well",
    "sample_type",
    "perturbation",
    "readout",
)
"""Columns every plate file must have (names are case-sensitive)."""

OPTIONAL_COLUMNS: tuple[str, ...] = ("concentration", "replicate")
"""Columns a plate file may have; their cells may be left empty."""

ALLOWED_COLUMNS: tuple[str, ...] = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
"""Every column a plate file may contain; any other column is a violation."""

SAMPLE_TYPES: tuple[str, ...] = ("sample", "pos_ctrl", "neg_ctrl", "empty")
"""Allowed values of ``sample_type``."""

TEXT_COLUMNS: tuple[str, ...] = ("plate_barcode", "well", "sample_type", "perturbation")
NUMERIC_COLUMNS: tuple[str, ...] = ("readout", "concentration", "replicate")

ALLOWED_COLUMNS_TEXT = (
    f"{', '.join(REQUIRED_COLUMNS)} (required) and "
    f"{', '.join(OPTIONAL_COLUMNS)} (optional)"
)

# Frequent alternative spellings of column names, used only to suggest a fix.
COLUMN_ALIASES: dict[str, str] = {
    "barcode": "plate_barcode",
    "plate": "plate_barcode",
    "plate_id": "plate_barcode",
    "platebarcode": "plate_barcode",
    "well_id": "well",
    "position": "well",
    "type": "sample_type",
    "sampletype": "sample_type",
    "gene": "perturbation",
    "gene_symbol": "perturbation",
    "target": "perturbation",
    "value": "readout",
    "signal": "readout",
    "intensity": "readout",
    "conc": "concentration",
    "rep": "replicate",
}

# Frequent alternative spellings of sample types, used only to suggest a fix.
SAMPLE_TYPE_ALIASES: dict[str, str] = {
    "positive": "pos_ctrl",
    "positive_control": "pos_ctrl",
    "pos": "pos_ctrl",
    "posctrl": "pos_ctrl",
    "negative": "neg_ctrl",
    "negative_control": "neg_ctrl",
    "neg": "neg_ctrl",
    "negctrl": "neg_ctrl",
    "blank": "empty",
    "samples": "sample",
}


def _key(name: str) -> str:
    return re.sub(r"[\s\-]+", "_", name.strip().lower())


def canonical_column(name: str) -> str | None:
    """The allowed column a misspelt header most likely means, if any."""
    key = _key(name)
    if key in ALLOWED_COLUMNS:
        return key
    return COLUMN_ALIASES.get(key)


def closest_sample_type(value: str) -> str | None:
    """The sample type a misspelt value most likely means, if any."""
    key = _key(value)
    if key in SAMPLE_TYPES:
        return key
    return SAMPLE_TYPE_ALIASES.get(key)
