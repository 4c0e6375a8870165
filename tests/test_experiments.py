"""Experiment tracking: runs recorded beside their checkpoints, loaded, listed, plotted, compared."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image
from typer.testing import CliRunner

from data_layer.experiments import (
    RunNotFound,
    list_runs,
    load_run,
    numeric_figures,
    record_evaluation,
    record_run,
)
from data_layer.run_comparison import compare, curve_png, image_markdown
from sinewgrid.cli_models import runs_app
from workload_runtime.storage import Storage

A = "robotics/policy/aaaa11112222"
B = "robotics/policy/bbbb33334444"
FOUNDATION = "cell/foundation_model/v1-cccc"


def _record_two(root: str) -> None:
    record_run(
        root, A,
        curves={"loss": [1.0, 0.5, 0.25, 0.2]},
        summary={"final_loss": 0.2, "frames": 400},
        config={"steps": 4, "lr": 0.003, "model": {"hidden": 64}},
        datasets=["robotics/teleop@s1", "robotics/rollouts@n1"],
        code_version="1111aaa",
        extra={"pool": "lambda-h100", "cost_usd": 0.5, "dagster_run_id": "run-a", "note": "baseline"},
    )
    record_run(
        root, B,
        curves={"loss": [(10, 0.9), (20, 0.3), (30, 0.1)], "grad_norm": [(10, 2.0), (30, 1.0)]},
        summary={"final_loss": 0.1, "frames": 500},
        config={"steps": 30, "lr": 0.003, "model": {"hidden": 128}},
        datasets=["robotics/teleop@s1", "robotics/rollouts@n2"],
        code_version="2222bbb",
    )


def test_record_and_load_a_run(root: str) -> None:
    _record_two(root)
    run = load_run(root, A)
    assert run.summary == {"final_loss": 0.2, "frames": 400.0}
    assert run.config["model"] == {"hidden": 64} and run.datasets == ["robotics/teleop@s1", "robotics/rollouts@n1"]
    assert (run.code_version, run.pool, run.cost_usd, run.dagster_run_id) == ("1111aaa", "lambda-h100", 0.5, "run-a")
    assert run.extra == {"note": "baseline"} and run.checkpoint_uri == Storage.at(root).checkpoints(A)
    assert run.folder == Storage.at(root).checkpoints(A) and run.recorded_at

    # Open formats, beside the checkpoints: json and a long-format parquet table.
    on_disk = json.loads(Path(run.run_json_uri).read_text())
    assert on_disk["lineage"] == A and on_disk["summary"]["final_loss"] == 0.2
    table = pd.read_parquet(run.metrics_uri)
    assert list(table.columns) == ["metric", "step", "value"]
    assert table["step"].tolist() == [1, 2, 3, 4] and table["value"].tolist() == [1.0, 0.5, 0.25, 0.2]
    curve = load_run(root, B).curve("grad_norm")
    assert curve["step"].tolist() == [10, 30] and curve["value"].tolist() == [2.0, 1.0]

    assert [r.lineage for r in list_runs(root)] == [A, B]
    record_run(root, FOUNDATION, curves={"loss": [1.0]}, summary={}, config={}, datasets=["cell/omics@v1"])
    assert [r.lineage for r in list_runs(root, model="cell")] == [FOUNDATION]
    assert [r.lineage for r in list_runs(root, model="robotics/policy")] == [A, B]


def test_recording_again_is_idempotent_and_keeps_evaluations(root: str) -> None:
    _record_two(root)
    run = load_run(root, A)
    first = (Path(run.run_json_uri).read_bytes(), Path(run.metrics_uri).read_bytes())
    _record_two(root)
    assert (Path(run.run_json_uri).read_bytes(), Path(run.metrics_uri).read_bytes()) == first

    evaluated = record_evaluation(root, A, "sim", {"sim_success_rate": 0.85, "trials": 20})
    assert evaluated.evaluations == {"sim": {"sim_success_rate": 0.85, "trials": 20.0}}
    _record_two(root)
    again = load_run(root, A)
    assert again.evaluations == {"sim": {"sim_success_rate": 0.85, "trials": 20.0}}
    assert again.figures()["sim.sim_success_rate"] == 0.85


def test_missing_runs_and_bad_input_are_clear_errors(root: str) -> None:
    _record_two(root)
    with pytest.raises(RunNotFound) as missing:
        load_run(root, "robotics/policy/nope")
    message = str(missing.value)
    assert "robotics/policy/nope/run.json does not exist" in message and A in message and B in message
    with pytest.raises(RunNotFound, match="No run of cell/finetuned_model is recorded yet"):
        record_evaluation(root, "cell/finetuned_model/x", "sim", {"rate": 1.0})
    with pytest.raises(ValueError, match="not a run lineage"):
        record_run(root, "../escape/me", curves={}, summary={}, config={}, datasets=[])
    with pytest.raises(ValueError, match="curve 'loss', item 1"):
        record_run(root, A, curves={"loss": [1.0, "nan-ish"]}, summary={}, config={}, datasets=[])
    with pytest.raises(ValueError, match="step 2 twice"):
        record_run(root, A, curves={"loss": [(1, 1.0), (2, 0.5), (2, 0.4)]}, summary={}, config={}, datasets=[])
    with pytest.raises(ValueError, match="summary metric 'device'"):
        record_run(root, A, curves={}, summary={"device": "cuda"}, config={}, datasets=[])
    assert load_run(root, A).summary["final_loss"] == 0.2  # nothing was overwritten by the refused calls
    assert numeric_figures({"final_loss": 0.2, "device": "cpu", "rmse": {"type": "float", "raw_value": 1.5}, "ok": True}) == {"final_loss": 0.2, "rmse": 1.5}


def test_compare_two_runs(root: str) -> None:
    _record_two(root)
    record_evaluation(root, B, "sim", {"sim_success_rate": 0.9})
    comparison = compare(load_run(root, A), load_run(root, B))
    by_name = {m.name: m for m in comparison.metrics}
    assert by_name["final_loss"].diff == pytest.approx(-0.1) and by_name["frames"].diff == 100
    assert by_name["sim.sim_success_rate"].a is None and by_name["sim.sim_success_rate"].diff is None
    assert comparison.config == [("model.hidden", 64, 128), ("steps", 4, 30)]
    assert comparison.datasets_only_a == ["robotics/rollouts@n1"] and comparison.datasets_only_b == ["robotics/rollouts@n2"]
    assert comparison.datasets_both == ["robotics/teleop@s1"] and not comparison.same_code
    text = comparison.markdown()
    assert "| final_loss | 0.2 | 0.1 | -0.1 |" in text and "| model.hidden | 64 | 128 |" in text
    assert "only in a: `robotics/rollouts@n1`" in text and "a `1111aaa`, b `2222bbb`" in text


def test_curve_png_is_a_real_image(root: str) -> None:
    _record_two(root)
    runs = [load_run(root, A), load_run(root, B)]
    image = Image.open(io.BytesIO(curve_png(runs)))
    assert image.format == "PNG" and image.width > 200 and image.height > 100
    assert len(set(image.convert("L").getdata())) > 10  # lines, labels and a legend, not a blank canvas
    markdown = image_markdown(compare(*runs).png(), "loss")
    assert markdown.startswith("![loss](data:image/png;base64,")
    Image.open(io.BytesIO(base64.b64decode(markdown.split(",", 1)[1].rstrip(")")))).verify()
    with pytest.raises(ValueError, match="recorded a 'accuracy' curve; they have: grad_norm, loss"):
        curve_png(runs, "accuracy")


# CLI ----------------------------------------------------------------------------------------


def test_cli_lists_shows_and_compares_runs(root: str, tmp_path: Path) -> None:
    _record_two(root)
    runner = CliRunner()
    listed = runner.invoke(runs_app, ["list", "--root", root, "--model", "robotics"])
    assert listed.exit_code == 0, listed.output
    assert "aaaa11112222" in listed.output and "bbbb33334444" in listed.output

    shown = runner.invoke(runs_app, ["show", A, "--root", root])
    assert shown.exit_code == 0, shown.output
    assert "final_loss" in shown.output and "lambda-h100" in shown.output and "1111aaa" in shown.output

    plot = tmp_path / "out" / "compare.png"
    compared = runner.invoke(runs_app, ["compare", A, B, "--root", root, "--plot", str(plot)])
    assert compared.exit_code == 0, compared.output
    assert "model.hidden" in compared.output and "robotics/rollouts@n2" in compared.output and "-0.1" in compared.output
    assert Image.open(plot).size[0] > 200


def test_cli_missing_run_exits_1_with_a_clear_message(root: str) -> None:
    _record_two(root)
    result = CliRunner().invoke(runs_app, ["compare", A, "robotics/policy/missing", "--root", root])
    assert result.exit_code == 1
    assert "no run recorded for robotics/policy/missing" in result.output and "Traceback" not in result.output
    assert "sinewgrid runs list" in result.output


@pytest.mark.parametrize("root", ["s3"], indirect=True)
def test_runs_on_s3(root: str) -> None:
    _record_two(root)
    record_evaluation(root, A, "sim", {"sim_success_rate": 0.85})
    run = load_run(root, A)
    assert run.run_json_uri.startswith("s3://") and run.evaluations["sim"]["sim_success_rate"] == 0.85
    assert run.curve("loss")["value"].tolist() == [1.0, 0.5, 0.25, 0.2]
    assert [r.lineage for r in list_runs(root, model="robotics/policy")] == [A, B]
    Image.open(io.BytesIO(curve_png([run]))).verify()
