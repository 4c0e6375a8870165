"""The `gene-rationale` task folder: its files, its evaluation set (plate proposals over the lab
stand-in's genes, answered by the rules), its stand-in skill, its verify(), and the payload
builder the design asset calls."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cell_lane.defs.assets.design import rank_candidates
from cell_lane.plate_design_rationale import PAYLOAD_FIELDS, TRAINING_FIELDS, picked_for, rationale_payloads

FOLDER = Path(__file__).resolve().parent.parent / "cell_lane" / "tasks" / "gene-rationale"
SIMPLE_TYPES = {"string", "number", "integer", "boolean"}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"test_gene_rationale_{name}", FOLDER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


skill = _load("standin_skill")
verify = _load("verify").verify
SPEC = yaml.safe_load((FOLDER / "task.yaml").read_text())
SCHEMA = json.loads((FOLDER / "schema.json").read_text())
ROWS = [json.loads(line) for line in (FOLDER / "eval.jsonl").read_text().splitlines() if line.strip()]


def test_task_yaml_and_the_prompts_first_line():
    assert SPEC["name"] == FOLDER.name == "gene-rationale"
    assert isinstance(SPEC["version"], int) and SPEC["version"] >= 1
    assert SPEC["kind"] == "research-assistant" and SPEC["mode"] == "online"
    assert 0 < SPEC["quality_bar"] <= 1 and SPEC["score"] == ["gene", "direction", "confidence"]
    assert SPEC["verify"] == "verify.py" and (FOLDER / SPEC["verify"]).is_file()
    assert SPEC["tools"] is None and SPEC["max_output_tokens"] > 0
    prompt = (FOLDER / "prompt.md").read_text()
    assert prompt.splitlines()[0] == f"Task: {SPEC['name']} v{SPEC['version']}"
    assert "0.1" in prompt and "2 × `uncertainty`" in prompt and "1 × `uncertainty`" in prompt  # the thresholds are stated


def test_the_schema_is_an_object_the_gateway_can_build_a_model_of():
    assert SCHEMA["type"] == "object" and SCHEMA["additionalProperties"] is False
    assert sorted(SCHEMA["required"]) == sorted(SCHEMA["properties"]) == ["confidence", "direction", "gene", "rationale"]
    for prop in SCHEMA["properties"].values():
        assert "enum" in prop or prop["type"] in SIMPLE_TYPES or (prop["type"] == "array" and prop["items"]["type"] == "string")
    assert sorted(SCHEMA["properties"]["direction"]["enum"]) == sorted(skill.DIRECTIONS)
    assert sorted(SCHEMA["properties"]["confidence"]["enum"]) == sorted(skill.CONFIDENCES)
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    validator = jsonschema.Draft202012Validator(SCHEMA)
    assert validator.is_valid(skill.answer(ROWS[0]["input"]))
    assert not validator.is_valid({**skill.answer(ROWS[0]["input"]), "direction": "increase"})
    assert not validator.is_valid({**skill.answer(ROWS[0]["input"]), "extra": 1})


def test_every_row_is_answered_by_the_rules_and_the_wrong_answer_differs():
    assert len(ROWS) >= 60
    assert len({row["id"] for row in ROWS}) == len(ROWS)
    for row in ROWS:
        payload = row["input"]
        assert row["id"] == f"{payload['proposal_id']}/{payload['gene']}"
        assert tuple(payload) == PAYLOAD_FIELDS + TRAINING_FIELDS
        assert set(row["expected"]) == set(SPEC["score"])
        right, wrong = skill.answer(payload), skill.wrong(payload)
        assert {k: right[k] for k in SPEC["score"]} == row["expected"], row["id"]
        assert any(wrong[k] != right[k] for k in SPEC["score"])
        assert wrong["direction"] in skill.DIRECTIONS and wrong["confidence"] in skill.CONFIDENCES
        # Both rationales pass verify: the right one, and the wrong one (it agrees with its own
        # wrong direction, so only scoring catches it).
        assert verify(payload, right) is None, (row["id"], right)
        assert verify(payload, wrong) is None, (row["id"], wrong)


def test_directions_and_confidences_are_balanced_enough():
    directions = Counter(row["expected"]["direction"] for row in ROWS)
    confidences = Counter(row["expected"]["confidence"] for row in ROWS)
    assert set(directions) == set(skill.DIRECTIONS) and min(directions.values()) >= 0.25 * len(ROWS), directions
    assert set(confidences) == set(skill.CONFIDENCES) and min(confidences.values()) >= 0.1 * len(ROWS), confidences


def test_the_rules():
    def call(effect, uncertainty):
        answer = skill.answer({"gene": "CD74", "predicted_effect": effect, "uncertainty": uncertainty, "picked_for": "exploit"})
        return answer["direction"], answer["confidence"]

    assert call(0.5, 0.1) == ("down", "high")  # positive effect: viability falls; margin 0.4 >= 2 × 0.1
    assert call(0.5, 0.3) == ("down", "medium") and call(0.5, 0.5) == ("down", "low")
    assert call(-0.4, 0.1) == ("up", "high") and call(-0.4, 0.2) == ("up", "medium") and call(-0.15, 0.2) == ("up", "low")
    assert call(0.1, 0.0) == ("neutral", "high") and call(-0.1, 0.01) == ("neutral", "low")  # the threshold is neutral
    assert call(0.02, 0.03) == ("neutral", "high") and call(0.02, 0.06) == ("neutral", "medium") and call(0.02, 0.2) == ("neutral", "low")


GOOD = [
    ("down", "Knocking down CD74 should reduce viability towards the positive control (effect +0.61 ± 0.08)."),
    ("down", "CD74 knockdown is predicted to kill cells; picked to exploit a strong hit, and assaying it will reduce the model's uncertainty."),
    ("up", "Knockdown of cd74 is predicted to increase viability above the negative control; it is not expected to reduce growth."),
    ("up", "Lowering CD74 expression is predicted to raise the readout; picked to explore."),
    ("neutral", "CD74 knockdown is predicted to leave viability close to the negative control; picked to explore."),
    ("neutral", "Reducing CD74 expression should have little effect on viability, perhaps a slight reduction in growth."),
]
BAD = [
    ("down", "Knocking down CD74 is predicted to increase viability.", "viability goes up"),
    ("up", "CD74 knockdown lowers viability towards the positive control.", "viability goes down"),
    ("up", "CD74 knockdown should cause a loss of viability.", "viability goes down"),
    ("neutral", "CD74 knockdown strongly reduces cell growth.", "viability goes down"),
    ("down", "The knockdown is predicted to reduce viability.", "does not name the gene CD74"),
    ("down", "Knocking down CD740 is predicted to reduce viability.", "does not name the gene CD74"),
    ("down", "", "empty"),
    ("down", "CD74 reduces viability. " * 40, "one or two sentences"),
]


@pytest.mark.parametrize(("direction", "text"), GOOD)
def test_verify_passes_a_consistent_rationale(direction, text):
    payload = {"gene": "CD74", "predicted_effect": 0.61, "uncertainty": 0.08}
    assert verify(payload, {"gene": "CD74", "direction": direction, "confidence": "high", "rationale": text}) is None


@pytest.mark.parametrize(("direction", "text", "problem"), BAD)
def test_verify_names_the_problem(direction, text, problem):
    payload = {"gene": "CD74", "predicted_effect": 0.61, "uncertainty": 0.08}
    found = verify(payload, {"gene": "CD74", "direction": direction, "confidence": "high", "rationale": text})
    assert found is not None and problem in found


def test_verify_wants_the_payloads_gene():
    payload = {"gene": "CD74", "predicted_effect": 0.61, "uncertainty": 0.08}
    found = verify(payload, {"gene": "LYZ", "direction": "down", "confidence": "high", "rationale": "LYZ reduces viability."})
    assert found is not None and "'LYZ'" in found


@pytest.mark.parametrize("name", ["standin_skill", "verify"])
def test_the_loaded_files_import_the_standard_library_only(name):
    tree = ast.parse((FOLDER / f"{name}.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
    assert not (FOLDER / "__init__.py").exists()


def _predictions() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "gene": ["A1", "B2", "C3", "D4", "E5", "F6"],
            "predicted_effect": [0.8, 0.05, -0.3, 0.5, 0.9, 0.2],
            "uncertainty": [0.05, 0.4, 0.3, 0.1, 0.02, 0.01],
            "assayed": [False, False, False, False, True, True],
            "measured_effect": [float("nan")] * 4 + [0.85, 0.25],
        }
    )


def test_rationale_payloads_of_a_proposal():
    predictions = _predictions()
    chosen = rank_candidates(predictions, exploration=1.0).head(3)  # as the design asset does
    payloads = rationale_payloads(chosen, proposal_id="plate-abc", exploration=1.0, training=predictions)
    assert [p["gene"] for p in payloads] == ["A1", "D4", "B2"] and [p["rank"] for p in payloads] == [1, 2, 3]
    first = payloads[0]
    assert tuple(first) == PAYLOAD_FIELDS + TRAINING_FIELDS
    assert first == {
        "proposal_id": "plate-abc", "gene": "A1", "rank": 1, "genes_proposed": 3, "picked_for": "exploit",
        "predicted_effect": 0.8, "uncertainty": 0.05, "score": 0.85, "exploration": 1.0, "replicate_wells": 2,
        "assayed_genes": 2, "percentile_among_assayed": 50,
    }
    assert payloads[2]["picked_for"] == "explore"  # B2: 0.05 of effect, 0.4 of uncertainty bonus
    json.dumps(payloads)
    # From proposal.json's genes (no training frame): the same payloads less the training fields.
    records = pd.DataFrame(chosen[["gene", "predicted_effect", "uncertainty", "score"]].to_dict(orient="records"))
    plain = rationale_payloads(records, proposal_id="plate-abc", exploration=1.0)
    assert plain == [{k: v for k, v in p.items() if k not in TRAINING_FIELDS} for p in payloads]
    assert [skill.answer(p)["direction"] for p in payloads] == ["down", "down", "neutral"]


def test_rationale_payloads_pass_a_dose_through_and_refuse_a_frame_without_effects():
    frame = pd.DataFrame({"gene": ["A1"], "predicted_effect": [-0.2], "uncertainty": [0.1], "dose": [2.5]})
    (payload,) = rationale_payloads(frame, exploration=2.0)
    assert payload["dose"] == 2.5 and payload["score"] == 0.0 and payload["picked_for"] == "explore"
    assert picked_for(0.3, 0.1, 2.0) == "exploit" and picked_for(0.1, 0.1, 2.0) == "explore"
    with pytest.raises(ValueError, match="uncertainty"):
        rationale_payloads(pd.DataFrame({"gene": ["A1"], "predicted_effect": [0.2]}))


def test_the_generator_reproduces_eval_jsonl():
    make_eval = _load("make_eval")
    assert "".join(json.dumps(row) + "\n" for row in make_eval.build_rows()) == (FOLDER / "eval.jsonl").read_text()
