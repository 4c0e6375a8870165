"""Checks a `gene-rationale` answer beyond its schema: `verify(payload, answer) -> problem | None`.

Loaded by file path by the gateway: standard library only, deterministic.

A problem is returned when:

- the answer's `gene` is not the payload's gene;
- the rationale is empty, or far longer than two sentences (over 600 characters);
- the rationale does not name the gene (as a whole symbol, any case);
- the rationale contradicts the answer's direction: a clause about viability (viability,
  survival, growth, proliferation, fitness, readout, signal) that says it goes up
  ("increase", "raise", "boost", "improve", "enhance", "rescue" ...) when the direction is
  `down`, or down ("reduce", "decrease", "lower", "drop", "impair", "kill" ...) when it is
  `up`; for `neutral`, a clause that says either without a hedge ("slightly", "little",
  "negligible", "modest" ...).

Clauses that negate their claim ("not", "no", "unlikely", "without" ...) claim nothing, and
talk of reducing the model's *uncertainty* or the gene's *expression* is not a claim about
viability. Only clear contradictions are
flagged: a rationale that says nothing about the direction passes (the direction itself is
scored against the expected answer).
"""

import re

MAX_CHARACTERS = 600
_UP = re.compile(r"\b(increas\w*|rais(e|es|ed|ing)|rises?|rising|rose|boost\w*|improv\w*|enhanc\w*|rescu\w*|more viable|higher viability)\b")
_DOWN = re.compile(
    r"\b(decreas\w*|reduc\w*|lower(s|ed|ing)?|drops?|dropp\w*|falls?|falling|fell|declin\w*|impair\w*|kill\w*|"
    r"diminish\w*|loss of (cell )?(viability|fitness|growth)|less viable|lower viability|toxic\w*|lethal\w*)\b"
)
_SUBJECT = re.compile(r"\b(viab\w*|surviv\w*|growth|grow\w*|prolifer\w*|fitness|readouts?|signal\w*)\b")
_NEGATION = re.compile(r"\b(not|no|never|unlikely|without|neither|nor|cannot)\b|n't\b")
_HEDGE = re.compile(r"\b(slight\w*|little|negligibl\w*|marginal\w*|small|weak\w*|modest\w*|minor|minimal\w*|barely|hardly|mild\w*)\b")
# Talk of reducing the model's uncertainty or the gene's expression (what CRISPRi does) is not
# a claim about viability.
_OTHER_TALK = re.compile(
    r"\b(reduc|lower|decreas|narrow|shrink|cut|resolv|drop|increas|rais|suppress|silenc|deplet)\w*\s+(\w+\W+){0,3}?"
    r"(uncertaint|confiden|expression|level|transcript|mrna)\w*"
    r"|\b(uncertaint|confiden|expression|level|transcript|mrna)\w*\s+(\w+\W+){0,3}?(reduc|lower|decreas|narrow|shrink|drop|fall|increas|rais|ris)\w*"
)
_CLAUSES = re.compile(r"[.;!?]\s|[.;!?]$|,?\s+\b(but|whereas|while|although|though|however)\b\s*")


def _claims(text):
    """(direction, hedged) for each clause that claims viability goes up or down."""
    text = _OTHER_TALK.sub(" ", text.lower())
    found = []
    for clause in _CLAUSES.split(text):
        if not clause or not _SUBJECT.search(clause) or _NEGATION.search(clause):
            continue
        up, down = bool(_UP.search(clause)), bool(_DOWN.search(clause))
        if up != down:
            found.append(("up" if up else "down", bool(_HEDGE.search(clause))))
    return found


def _names(text, gene):
    return re.search(r"(?<![A-Za-z0-9])" + re.escape(gene) + r"(?![A-Za-z0-9])", text, re.IGNORECASE) is not None


def verify(payload, answer):
    gene = str(payload.get("gene", ""))
    text = str(answer.get("rationale", "")).strip()
    direction = answer.get("direction")
    if str(answer.get("gene", "")).strip().upper() != gene.upper():
        return f"the answer is about gene {answer.get('gene')!r}, the payload about {gene!r}"
    if not text:
        return "the rationale is empty; write one or two sentences"
    if len(text) > MAX_CHARACTERS:
        return f"the rationale is {len(text)} characters; keep it to one or two sentences"
    if not _names(text, gene):
        return f"the rationale does not name the gene {gene}"
    for claim, hedged in _claims(text):
        if direction in ("up", "down") and claim != direction:
            return f"the rationale says viability goes {claim}, the answer's direction is {direction}"
        if direction == "neutral" and not hedged:
            return f"the rationale says viability goes {claim}, the answer's direction is neutral"
    return None
