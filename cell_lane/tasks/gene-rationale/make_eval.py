"""Build `eval.jsonl` for `gene-rationale` from plate proposals over the lab stand-in's genes.

    .venv/bin/python cell_lane/tasks/gene-rationale/make_eval.py [--seed 0] [--per-direction 30]

What it does, deterministically for a seed:

1. Takes the lab stand-in's genes and their hidden knockdown effects (`LabStandIn.truth`: the
   748 genes of the PBMC matrix, effects on the control scale).
2. Runs a few design campaigns (`--labs` labs × the exploration weights in `EXPLORATIONS` ×
   `--rounds` rounds). A lab starts with two random seed plates (76 genes, measured with the
   stand-in's well noise); each round a stand-in for the fine-tuned model predicts every gene
   as the finetune workload does, K = 5 fold heads whose mean is `predicted_effect` and whose
   standard deviation is `uncertainty` (each fold = the truth + the model's shared error + the
   fold's own error, both shrinking as more genes are assayed; the fold error's scale varies
   from gene to gene); the design asset's own `rank_candidates` picks the plate's 38 genes;
   `rationale_payloads` builds their payloads; the lab then measures them for the next round.
3. Labels every payload with the task's rules (`standin_skill.answer`), leaves out the genes
   whose rounded numbers sit within 0.002 of a threshold (where rounding would decide), and
   keeps `--per-direction` genes of each direction, in a seeded shuffled order, taking them in
   turn from its confidence levels (high, medium, low) while each has genes left. Real
   proposals are mostly strong "down" hits; "up" and "neutral" genes come from the plates that
   explore (a high exploration weight picks the genes the model is least sure of), and those are
   seldom confident (a neutral one never: a gene is picked for its uncertainty only). Rows are
   written sorted by id.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
EVAL_PATH = HERE / "eval.jsonl"
EXPLORATIONS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)  # 16: a plate that mostly explores
SEED_GENES = 76  # two seed plates of 38 genes
FOLDS = 5
WELL_NOISE = 0.08  # the lab stand-in's per-well noise, in effect units
TIE = 0.002  # numbers this close to a threshold are left out


def load_skill() -> Any:
    """This folder's `standin_skill.py`, imported by path (as the stand-in server does)."""
    spec = importlib.util.spec_from_file_location("gene_rationale_standin_skill", HERE / "standin_skill.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lab_truth() -> pd.Series:
    """The lab stand-in's hidden effect per gene (reads the bundled PBMC matrix; writes nothing)."""
    from cell_lane.standins.lab import LabStandIn
    from workload_runtime.storage import Storage

    return LabStandIn(Storage.at("memory://sinewgrid-gene-rationale-eval")).truth


def predictions(truth: pd.Series, measured: dict[str, float], rng: np.random.Generator) -> pd.DataFrame:
    """The fine-tuned model's predictions frame (the finetune workload's columns), simulated."""
    n_assayed = len(measured)
    shrink = np.sqrt(SEED_GENES / n_assayed)
    shared = rng.normal(0.0, 0.15 * shrink, len(truth))
    scale = 0.06 * shrink * np.exp(rng.normal(0.0, 0.7, len(truth)))
    folds = truth.to_numpy() + shared + rng.normal(0.0, 1.0, (FOLDS, len(truth))) * scale
    return pd.DataFrame(
        {
            "gene": truth.index.to_numpy(),
            "predicted_effect": folds.mean(axis=0),
            "uncertainty": folds.std(axis=0, ddof=1),
            "assayed": truth.index.isin(list(measured)),
            "measured_effect": [measured.get(g, np.nan) for g in truth.index],
        }
    )


def campaign(truth: pd.Series, seed: int, lab: int, exploration: float, rounds: int) -> list[dict[str, Any]]:
    """Every payload of one lab's `rounds` proposals at one exploration weight."""
    from cell_lane.defs.assets.design import rank_candidates
    from cell_lane.plate_design_rationale import rationale_payloads
    from cell_lane.plate_layout import GENES_PER_PLATE

    rng = np.random.default_rng([seed, lab, int(exploration * 100)])
    noise = WELL_NOISE / np.sqrt(2)  # a gene's duplicate wells
    measured = {str(g): float(truth[g] + rng.normal(0.0, noise)) for g in rng.choice(truth.index.to_numpy(), SEED_GENES, replace=False)}
    payloads = []
    for round_ in range(rounds):
        frame = predictions(truth, measured, rng)
        chosen = rank_candidates(frame, exploration).head(GENES_PER_PLATE)
        proposal_id = "plate-" + hashlib.sha256(f"{seed}/{lab}/{exploration}/{round_}".encode()).hexdigest()[:12]
        payloads += rationale_payloads(chosen, proposal_id=proposal_id, exploration=exploration, training=frame)
        measured.update({str(g): float(truth[g] + rng.normal(0.0, noise)) for g in chosen["gene"]})
    return payloads


def near_a_threshold(payload: dict[str, Any], skill: Any) -> bool:
    effect, uncertainty = payload["predicted_effect"], payload["uncertainty"]
    if abs(abs(effect) - skill.NEUTRAL_EFFECT) < TIE:
        return True
    margin = skill.margin_of(effect, skill.direction_of(effect))
    return any(abs(margin - k * uncertainty) < TIE for k in (skill.HIGH_MARGIN, skill.MEDIUM_MARGIN))


def build_rows(seed: int = 0, labs: int = 6, rounds: int = 3, per_direction: int = 30) -> list[dict[str, Any]]:
    """The evaluation rows: up to `per_direction` genes of each direction, taken in turn from its
    confidence levels (so those are as even as the proposals allow), sorted by id."""
    skill = load_skill()
    truth = lab_truth()
    payloads = [p for lab in range(labs) for e in EXPLORATIONS for p in campaign(truth, seed, lab, e, rounds)]
    random.Random(seed).shuffle(payloads)
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {(d, c): [] for d in skill.DIRECTIONS for c in skill.CONFIDENCES}
    for payload in payloads:
        if near_a_threshold(payload, skill):
            continue
        answer = skill.answer(payload)
        expected = {k: answer[k] for k in ("gene", "direction", "confidence")}
        cells[(answer["direction"], answer["confidence"])].append({"id": f"{payload['proposal_id']}/{payload['gene']}", "input": payload, "expected": expected})
    rows = []
    for direction in skill.DIRECTIONS:
        queues = [cells[(direction, confidence)] for confidence in reversed(skill.CONFIDENCES)]
        taken, turn = 0, 0
        while taken < per_direction and any(queues):
            queue = queues[turn % len(queues)]
            turn += 1
            if queue:
                rows.append(queue.pop(0))
                taken += 1
    if len(rows) < 60:
        raise SystemExit(f"only {len(rows)} rows; run more --labs or --rounds")
    return sorted(rows, key=lambda row: row["id"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--labs", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-direction", type=int, default=30, help="rows kept per direction")
    parser.add_argument("--out", type=Path, default=EVAL_PATH)
    args = parser.parse_args(argv)
    rows = build_rows(args.seed, args.labs, args.rounds, args.per_direction)
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    counts = Counter((row["expected"]["direction"], row["expected"]["confidence"]) for row in rows)
    print(f"{len(rows)} rows -> {args.out}: {dict(sorted(counts.items()))}", file=sys.stderr)


if __name__ == "__main__":
    main()
