"""What a model is told about each gene of a plate proposal, to write that gene's rationale.

`next_plate_proposal` (cell_lane/defs/assets/design.py) ranks the genes not yet assayed by an
upper confidence bound, `score = predicted_effect + exploration × uncertainty`, and proposes
the best `GENES_PER_PLATE`. `rationale_payloads` turns that choice into one JSON object per
gene: the payload of the `gene-rationale` task (cell_lane/tasks/gene-rationale/).

Effects are on the plate's control scale (docs/cell-lane.md): 0 looks like the negative control,
1 like the positive control (the knockdown takes viability down as far as the positive control
does); a negative effect is a readout above the negative control. `uncertainty` is the spread
(standard deviation) of the fine-tuned model's K fold heads on the gene.

Pure: no I/O, no Dagster.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from cell_lane.plate_layout import REPLICATES

PAYLOAD_FIELDS: tuple[str, ...] = (
    "proposal_id",
    "gene",
    "rank",
    "genes_proposed",
    "picked_for",
    "predicted_effect",
    "uncertainty",
    "score",
    "exploration",
    "replicate_wells",
)
TRAINING_FIELDS: tuple[str, ...] = ("assayed_genes", "percentile_among_assayed")
OPTIONAL_COLUMNS: tuple[str, ...] = ("dose",)  # passed through when a proposal has them (none does yet: CRISPRi knockdowns)


def picked_for(predicted_effect: float, uncertainty: float, exploration: float) -> str:
    """`exploit` when the predicted effect carries at least as much of the gene's score as the
    exploration bonus (`exploration × uncertainty`) does; `explore` when the bonus carries more."""
    return "exploit" if predicted_effect >= exploration * uncertainty else "explore"


def _number(value: Any, digits: int = 3) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"a proposal's numbers must be finite, got {value}")
    return round(value, digits) + 0.0  # + 0.0: never a negative zero


def rationale_payloads(
    proposal_frame: pd.DataFrame,
    *,
    proposal_id: str = "",
    exploration: float = 1.0,
    training: pd.DataFrame | None = None,
) -> list[dict[str, Any]]:
    """One `gene-rationale` payload per proposed gene, in the proposal's order (rank 1 first).

    - `proposal_frame`: the genes proposed, best first: the asset's `chosen` (the head of
      `rank_candidates(...)`), or `pd.DataFrame(proposal["genes"])` from `proposal.json`;
      columns `gene`, `predicted_effect`, `uncertainty`, and `score` (computed from
      `exploration` when absent); a `dose` column is passed through when present.
    - `proposal_id`, `exploration`: the proposal's (`proposal.json` holds both).
    - `training`: optional, the fine-tuned model's predictions frame (`assayed`,
      `measured_effect` per gene, as the finetune workload writes it): adds `assayed_genes`
      (how many genes the model learnt from) and `percentile_among_assayed` (the share, 0–100,
      of assayed genes whose measured effect is below this gene's predicted effect).

    Each payload: `proposal_id`, `gene`, `rank` (1-based), `genes_proposed`, `picked_for`
    (`exploit` | `explore`, see `picked_for`), `predicted_effect`, `uncertainty`, `score`,
    `exploration`, `replicate_wells` (wells per gene on the plate), then the training fields;
    numbers rounded to 3 decimals.
    """
    missing = [c for c in ("gene", "predicted_effect", "uncertainty") if c not in proposal_frame.columns]
    if missing:
        raise ValueError(f"the proposal frame lacks {missing}; it needs gene, predicted_effect, uncertainty (and score)")
    frame = proposal_frame.reset_index(drop=True)
    measured = None
    if training is not None:
        if not {"assayed", "measured_effect"} <= set(training.columns):
            raise ValueError("`training` needs the predictions frame's `assayed` and `measured_effect` columns")
        measured = pd.to_numeric(training.loc[training["assayed"].astype(bool), "measured_effect"], errors="coerce").dropna().to_numpy()
    payloads = []
    for rank, row in enumerate(frame.itertuples(index=False), start=1):
        effect, uncertainty = _number(row.predicted_effect), _number(row.uncertainty)
        score = _number(getattr(row, "score", effect + exploration * uncertainty))
        payload: dict[str, Any] = {
            "proposal_id": str(proposal_id),
            "gene": str(row.gene),
            "rank": rank,
            "genes_proposed": len(frame),
            "picked_for": picked_for(float(row.predicted_effect), float(row.uncertainty), float(exploration)),
            "predicted_effect": effect,
            "uncertainty": uncertainty,
            "score": score,
            "exploration": _number(exploration),
            "replicate_wells": REPLICATES,
        }
        for column in OPTIONAL_COLUMNS:
            value = getattr(row, column, None)
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                payload[column] = value.item() if hasattr(value, "item") else value
        if measured is not None:
            payload["assayed_genes"] = int(len(measured))
            below = float((measured < float(row.predicted_effect)).mean()) if len(measured) else 0.0
            payload["percentile_among_assayed"] = int(round(100 * below))
        payloads.append(payload)
    return payloads
