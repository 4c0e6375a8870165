"""Sample readouts scaled between their plate's controls."""

from __future__ import annotations

import numpy as np
import pandas as pd


def normalised_effects(table: pd.DataFrame) -> pd.DataFrame:
    """Scale each sample readout between its plate's controls.

    ``effect = (readout - mean_neg) / (mean_pos - mean_neg)`` per plate, so an
    effect of 0 looks like the negative controls and 1 like the positive
    controls. Meant for a table that passed validation (``result.table`` of
    an ``ok`` result). Returns only ``sample`` rows, with the columns
    plate_barcode, well, perturbation, replicate (if present), readout,
    effect and source_file. Raises ``ValueError`` if a plate has no usable
    control readouts or both controls have the same mean.
    """
    needed = ("plate_barcode", "well", "sample_type", "perturbation", "readout")
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise ValueError(f"normalised_effects needs column(s) {', '.join(missing)}")
    readout = pd.to_numeric(table["readout"]).astype(float)
    usable = np.isfinite(readout)
    plates = pd.unique(table["plate_barcode"])
    means = {}
    for control in ("pos_ctrl", "neg_ctrl"):  # one mean per plate, all plates at once
        rows = usable & (table["sample_type"] == control)
        means[control] = (
            readout[rows]
            .groupby(table.loc[rows, "plate_barcode"], sort=False)
            .mean()
            .reindex(plates)
        )
    for barcode in plates:
        pos, neg = means["pos_ctrl"][barcode], means["neg_ctrl"][barcode]
        if np.isnan(pos) or np.isnan(neg):
            raise ValueError(
                f"plate {barcode} has no pos_ctrl or no neg_ctrl readouts; validate the table first"
            )
        if pos == neg:
            raise ValueError(
                f"plate {barcode}: pos_ctrl and neg_ctrl readouts have the same mean"
            )
    neg_mean = table["plate_barcode"].map(means["neg_ctrl"]).astype(float)
    pos_mean = table["plate_barcode"].map(means["pos_ctrl"]).astype(float)
    effect = (readout - neg_mean) / (pos_mean - neg_mean)
    samples = table["sample_type"] == "sample"
    columns = ["plate_barcode", "well", "perturbation"]
    if "replicate" in table.columns:
        columns.append("replicate")
    result = table.loc[samples, columns].copy()
    result["readout"] = readout[samples]
    result["effect"] = effect[samples]
    result["source_file"] = (
        table.loc[samples, "source_file"] if "source_file" in table.columns else None
    )
    return result.reset_index(drop=True)
