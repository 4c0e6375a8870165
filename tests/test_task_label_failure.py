"""The `label-failure` task folder: its files, its evaluation set (real trials of the robot-cell
stand-in, labelled by the rule), its stand-in skill, and the episode summary it labels."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from robotics_lane.episodes.lerobot_v3 import Episode
from robotics_lane.episodes.summaries import SUMMARY_FIELDS, episode_summary

FOLDER = Path(__file__).resolve().parent.parent / "robotics_lane" / "tasks" / "label-failure"
SIMPLE_TYPES = {"string", "number", "integer", "boolean"}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"test_label_failure_{name}", FOLDER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


skill = _load("standin_skill")
SPEC = yaml.safe_load((FOLDER / "task.yaml").read_text())
SCHEMA = json.loads((FOLDER / "schema.json").read_text())
ROWS = [json.loads(line) for line in (FOLDER / "eval.jsonl").read_text().splitlines() if line.strip()]


def test_task_yaml_and_the_prompts_first_line():
    assert SPEC["name"] == FOLDER.name == "label-failure"
    assert isinstance(SPEC["version"], int) and SPEC["version"] >= 1
    assert SPEC["kind"] == "labelling" and SPEC["mode"] == "batch" and SPEC["deadline_minutes"] > 0
    assert 0 < SPEC["quality_bar"] <= 1 and SPEC["score"] == ["failure_mode"]
    assert SPEC["verify"] is None and SPEC["tools"] is None and SPEC["max_output_tokens"] > 0
    prompt = (FOLDER / "prompt.md").read_text()
    assert prompt.splitlines()[0] == f"Task: {SPEC['name']} v{SPEC['version']}"
    for mode in skill.FAILURE_MODES:  # the prompt states every mode the schema allows
        assert f"`{mode}`" in prompt


def test_the_schema_is_an_object_the_gateway_can_build_a_model_of():
    assert SCHEMA["type"] == "object" and SCHEMA["additionalProperties"] is False
    assert sorted(SCHEMA["required"]) == sorted(SCHEMA["properties"])
    for prop in SCHEMA["properties"].values():
        assert "enum" in prop or prop["type"] in SIMPLE_TYPES or (prop["type"] == "array" and prop["items"]["type"] == "string")
    assert tuple(SCHEMA["properties"]["failure_mode"]["enum"]) == skill.FAILURE_MODES
    assert set(SPEC["score"]) <= set(SCHEMA["properties"])
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    validator = jsonschema.Draft202012Validator(SCHEMA)
    assert validator.is_valid({"failure_mode": "pole-fell-left"})
    assert not validator.is_valid({"failure_mode": "pole_fell"}) and not validator.is_valid({"failure_mode": "pole-fell-left", "why": "x"})


def test_every_row_is_labelled_by_the_rule_and_the_wrong_answer_differs():
    assert len(ROWS) >= 60
    assert len({row["id"] for row in ROWS}) == len(ROWS)
    for row in ROWS:
        payload = row["input"]
        assert row["id"] == payload["trial_id"] and tuple(payload) == SUMMARY_FIELDS
        assert payload["ended_by"] in ("pole_fell", "cart_out_of_bounds")  # failed trials only
        assert set(row["expected"]) == set(SPEC["score"])
        right, wrong = skill.answer(payload), skill.wrong(payload)
        assert right == row["expected"], row["id"]
        assert wrong["failure_mode"] != right["failure_mode"] and wrong["failure_mode"] in skill.FAILURE_MODES


def test_the_classes_are_balanced():
    counts = Counter(row["expected"]["failure_mode"] for row in ROWS)
    assert set(counts) == set(skill.FAILURE_MODES)
    assert min(counts.values()) >= 0.15 * len(ROWS) and max(counts.values()) <= 2 * min(counts.values()), counts


def test_the_rule():
    base = {"ended_by": "pole_fell", "seconds_survived": 3.0, "final_pole_angle_rad": -0.05, "final_pole_angular_velocity_rad_s": 0.9}
    assert skill.answer(base) == {"failure_mode": "pole-fell-right"}  # the rotation, not the (noisy) angle
    assert skill.answer({**base, "final_pole_angular_velocity_rad_s": -0.9}) == {"failure_mode": "pole-fell-left"}
    assert skill.answer({**base, "final_pole_angular_velocity_rad_s": 0.0}) == {"failure_mode": "pole-fell-left"}
    assert skill.answer({**base, "seconds_survived": 0.96}) == {"failure_mode": "pole-fell-at-start"}
    assert skill.answer({**base, "seconds_survived": 1.0})["failure_mode"] == "pole-fell-right"
    assert skill.answer({**base, "ended_by": "cart_out_of_bounds", "seconds_survived": 0.5}) == {"failure_mode": "cart-hit-track-limit"}
    with pytest.raises(ValueError, match="failed trials only"):
        skill.answer({**base, "ended_by": "completed"})


@pytest.mark.parametrize("name", ["standin_skill"])
def test_the_skill_imports_the_standard_library_only(name):
    tree = ast.parse((FOLDER / f"{name}.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_no_python_package_in_the_task_folder():
    assert not (FOLDER / "__init__.py").exists()


def test_summaries_of_real_trials_are_the_eval_rows():
    """The robot-cell stand-in runs one policy version's trials again; the summaries of its failed
    trials are exactly the rows of that version in eval.jsonl (the generator is deterministic)."""
    make_eval = _load("make_eval")
    by_version = Counter(row["input"]["policy_version"] for row in ROWS)
    version = next(v for v in make_eval.policy_versions(0, 14) if v["policy_version"] == by_version.most_common(1)[0][0])
    trials = make_eval.run_cell([version], trials_per_task=12)
    assert len(trials) == 24
    summaries = {t["summary"]["trial_id"]: t["summary"] for t in trials}
    for row in ROWS:
        if row["input"]["policy_version"] == version["policy_version"]:
            assert summaries[row["id"]] == row["input"]
    for t in trials:
        summary, record = t["summary"], t["record"]
        assert tuple(summary) == SUMMARY_FIELDS
        assert summary["steps_survived"] == record["length"] and summary["seconds_survived"] == round(record["length"] / 25, 2)
        assert summary["ended_by"] == ("completed" if record["success"] else record["failure_mode"])
        assert summary["max_abs_pole_angle_rad"] >= abs(summary["final_pole_angle_rad"])
        assert summary["max_abs_cart_position_m"] >= abs(summary["final_cart_position_m"])
        assert 0 <= summary["force_saturated_fraction"] <= 1
        assert summary["max_steps"] == (200 if record["task_id"] == "balance-nominal" else 300)


def _episode(length: int) -> Episode:
    states = np.zeros((length, 4), dtype=np.float32)
    states[:, 0] = np.linspace(0.0, -0.5, length)
    states[:, 1] = np.linspace(0.0, 0.18, length)
    states[-1, 3] = -0.00001  # rounds to a zero, never a negative one
    actions = np.full((length, 1), 0.5, dtype=np.float32)
    actions[-10:] = 1.0
    return Episode(task="balance-nominal", observation_state=states, action=actions, success=False)


def test_episode_summary_from_a_trials_frame_row():
    """What the asset has: trials.jsonl parsed into a frame (numpy scalars, None failure modes)."""
    records = [
        {"trial": 3, "task_id": "balance-nominal", "seed": 7_000_003, "success": False, "return": 39.0, "length": 40, "failure_mode": "pole_fell", "episode_index": 3},
        {"trial": 4, "task_id": "balance-nominal", "seed": 7_000_004, "success": True, "return": 200.0, "length": 40, "failure_mode": None, "episode_index": 4},
    ]
    rows = pd.DataFrame(records).to_dict("records")
    failed = episode_summary(rows[0], _episode(40), eval_id="eval-v7", policy_version="v7", max_steps=200, fps=25)
    assert failed == episode_summary(records[0], _episode(40), eval_id="eval-v7", policy_version="v7", max_steps=200, fps=25)
    assert failed["trial_id"] == "eval-v7/trial-003" and failed["ended_by"] == "pole_fell" and failed["seconds_survived"] == 1.6
    assert failed["final_pole_angle_rad"] == 0.18 and failed["final_cart_position_m"] == -0.5 and failed["max_abs_cart_position_m"] == 0.5
    assert failed["final_pole_angular_velocity_rad_s"] == 0.0 and str(failed["final_pole_angular_velocity_rad_s"]) == "0.0"
    assert failed["force_saturated_fraction"] == 0.25
    json.dumps(failed)  # plain JSON types only
    assert all(type(v) in (str, int, float) for v in failed.values())
    done = episode_summary(rows[1], _episode(40), eval_id="eval-v7", policy_version="v7", max_steps=200, fps=25)
    assert done["ended_by"] == "completed"


def test_episode_summary_refuses_a_record_that_is_not_its_episode():
    record = {"trial": 0, "task_id": "balance-nominal", "success": False, "length": 41, "failure_mode": "pole_fell"}
    with pytest.raises(ValueError, match="episode_index"):
        episode_summary(record, _episode(40), eval_id="e", policy_version="v", max_steps=200, fps=25)
