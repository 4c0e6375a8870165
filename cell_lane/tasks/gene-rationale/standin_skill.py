"""What a competent research assistant answers for `gene-rationale`, and a plausible mistake.

Loaded by file path by the stand-in model server: standard library only, deterministic.

The rules (the ones prompt.md states, and the ones eval.jsonl's expected answers come from).
Effects are on the plate's control scale: 0 = like the negative control, 1 = like the positive
control (viability down as far as the positive control takes it).

- direction, of the viability readout when the gene is knocked down:
  `predicted_effect` > 0.1 -> `down`; < -0.1 -> `up`; otherwise (|effect| <= 0.1) `neutral`.
  0.1 is what one plate can tell from the negative control: a gene's duplicate wells measure
  its effect with a standard deviation of about 0.08 / sqrt(2) = 0.057.
- confidence, in that call: the margin between the effect and the 0.1 threshold that would
  change it (|effect| - 0.1 for up/down, 0.1 - |effect| for neutral), in units of the model's
  `uncertainty`: margin >= 2 x uncertainty -> `high`; >= 1 x -> `medium`; otherwise `low`.
"""

import hashlib

NEUTRAL_EFFECT = 0.1
HIGH_MARGIN, MEDIUM_MARGIN = 2.0, 1.0  # in units of the uncertainty
DIRECTIONS = ("up", "down", "neutral")
CONFIDENCES = ("low", "medium", "high")
_WHAT = {
    "down": "reduce viability towards the positive control",
    "up": "increase viability above the negative control",
    "neutral": "leave viability close to the negative control",
}


def direction_of(effect):
    if effect > NEUTRAL_EFFECT:
        return "down"
    if effect < -NEUTRAL_EFFECT:
        return "up"
    return "neutral"


def margin_of(effect, direction):
    """How far the effect sits from the threshold that would change the direction called."""
    return NEUTRAL_EFFECT - abs(effect) if direction == "neutral" else abs(effect) - NEUTRAL_EFFECT


def confidence_of(effect, uncertainty, direction):
    margin = margin_of(effect, direction)
    if margin >= HIGH_MARGIN * uncertainty:
        return "high"
    if margin >= MEDIUM_MARGIN * uncertainty:
        return "medium"
    return "low"


def rationale(payload, direction, confidence):
    """One or two sentences: the gene, the direction in words, the numbers, why it was picked."""
    gene, effect, uncertainty = payload["gene"], float(payload["predicted_effect"]), float(payload["uncertainty"])
    why = "to exploit a strong predicted effect" if payload.get("picked_for") == "exploit" else "to explore a gene the model is unsure about"
    where = f", ranked {payload['rank']} of {payload['genes_proposed']}" if "rank" in payload and "genes_proposed" in payload else ""
    return (
        f"Knocking down {gene} is predicted to {_WHAT[direction]} (effect {effect:+.2f}, uncertainty {uncertainty:.2f}; "
        f"{confidence} confidence). It was picked {why}{where}."
    )


def _answer(payload, direction, confidence):
    return {"gene": payload["gene"], "direction": direction, "confidence": confidence, "rationale": rationale(payload, direction, confidence)}


def answer(payload):
    effect, uncertainty = float(payload["predicted_effect"]), float(payload["uncertainty"])
    direction = direction_of(effect)
    return _answer(payload, direction, confidence_of(effect, uncertainty, direction))


def wrong(payload):
    """A plausible mistake, the same for the same payload: reading the control scale's sign the
    wrong way round (a positive effect as "up"), misjudging the uncertainty by one level, or
    misplacing the neutrality threshold. Its rationale agrees with its own (wrong) direction."""
    right = answer(payload)
    effect = float(payload["predicted_effect"])
    kind = int(hashlib.sha256(f"{payload.get('proposal_id', '')}/{payload['gene']}".encode()).hexdigest()[:8], 16) % 3
    direction, confidence = right["direction"], right["confidence"]
    if kind == 0:  # the scale read as a fold change: positive is up
        direction = {"down": "up", "up": "down", "neutral": "up" if effect >= 0 else "down"}[direction]
    elif kind == 1:  # the uncertainty misjudged
        confidence = {"high": "medium", "medium": "high", "low": "medium"}[confidence]
    else:  # the threshold misplaced: any nonzero effect is a direction, or a small one is neutral
        direction = ("down" if effect >= 0 else "up") if direction == "neutral" else "neutral"
    return _answer(payload, direction, confidence)
