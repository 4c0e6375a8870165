"""The 96-well layout used for proposed plates: controls in the edge columns, genes in duplicate."""

from __future__ import annotations

import pandas as pd

ROWS = "ABCDEFGH"
NEG_CONTROL_COLUMN = 1
POS_CONTROL_COLUMN = 12
SAMPLE_COLUMNS = range(2, 12)
REPLICATES = 2
GENES_PER_PLATE = (len(ROWS) * len(SAMPLE_COLUMNS)) // REPLICATES - 2  # 38: leaves 4 empty wells


def plate_layout(genes: list[str], barcode: str) -> pd.DataFrame:
    """A plate worklist: column 1 negative controls, column 12 positive controls,
    columns 2–11 each gene in duplicate (row-major), the remaining wells empty.
    The `readout` column is left empty for the lab to fill."""
    if len(genes) > GENES_PER_PLATE:
        raise ValueError(f"a plate holds at most {GENES_PER_PLATE} genes in duplicate, got {len(genes)}")
    rows = []
    for r in ROWS:
        rows.append((f"{r}{NEG_CONTROL_COLUMN:02d}", "neg_ctrl", "", None))
        rows.append((f"{r}{POS_CONTROL_COLUMN:02d}", "pos_ctrl", "", None))
    sample_wells = [f"{r}{c:02d}" for r in ROWS for c in SAMPLE_COLUMNS]
    slots = [(g, rep) for g in genes for rep in range(1, REPLICATES + 1)]
    for well, slot in zip(sample_wells, slots + [None] * (len(sample_wells) - len(slots)), strict=True):
        if slot is None:
            rows.append((well, "empty", "", None))
        else:
            rows.append((well, "sample", slot[0], slot[1]))
    table = pd.DataFrame(rows, columns=["well", "sample_type", "perturbation", "replicate"])
    table.insert(0, "plate_barcode", barcode)
    table["readout"] = float("nan")
    table["replicate"] = table["replicate"].astype("Int64")
    order = table["well"].str[0] + table["well"].str[1:].str.zfill(2)
    return table.assign(_order=order).sort_values("_order").drop(columns="_order").reset_index(drop=True)
