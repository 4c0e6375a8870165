"""The drills' math (Daly's goodput model, Young/Daly, loss bounds), preemption traces and report."""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from drills.goodput import expected_goodput, loss_bound_steps, optimum_goodput, young_daly_interval
from drills.model import DrillResult, Timings, TraceResult, TraceRun
from drills.report import load_report, write_report
from drills.trace import (
    SPOT_BANDS,
    accelerate,
    acceleration_for,
    band_rate_per_hour,
    draw_trace,
    published_rate_of,
    rate_for,
)

# --- goodput ---------------------------------------------------------------------------------


def test_goodput_falls_as_faults_come_more_often():
    mtbfs = [1e7, 1e5, 36_000, 3_600, 600, 60]
    goodputs = [expected_goodput(300.0, 10.0, m, restart_s=5.0) for m in mtbfs]
    assert all(a > b for a, b in zip(goodputs, goodputs[1:], strict=False))
    assert all(0.0 < g < 1.0 for g in goodputs)


def test_no_faults_leaves_only_the_checkpoint_overhead():
    assert expected_goodput(300.0, 10.0, math.inf) == pytest.approx(300.0 / 310.0)
    assert expected_goodput(300.0, 0.0, math.inf) == 1.0
    # the finite model tends to the same limit as faults become rare
    assert expected_goodput(300.0, 10.0, 1e12, restart_s=30.0) == pytest.approx(300.0 / 310.0, rel=1e-6)


def test_restart_cost_scales_goodput_by_exp_minus_r_over_m():
    base = expected_goodput(300.0, 10.0, 3600.0)
    assert expected_goodput(300.0, 10.0, 3600.0, restart_s=120.0) == pytest.approx(base * math.exp(-120.0 / 3600.0))


def test_goodput_matches_a_simulated_run():
    """Daly's expected wall time per segment, M·e^{R/M}·(e^{(τ+δ)/M} − 1), against a Monte Carlo run."""
    tau, delta, mtbf, restart = 400.0, 100.0, 1000.0, 50.0
    rng = np.random.default_rng(7)
    segments, wall = 20_000, 0.0
    for _ in range(segments):
        while True:  # the segment (work + checkpoint) has to run without a fault
            fault = rng.exponential(mtbf)
            if fault >= tau + delta:
                wall += tau + delta
                break
            wall += fault
            while True:  # restarting can be interrupted too
                fault = rng.exponential(mtbf)
                if fault >= restart:
                    wall += restart
                    break
                wall += fault
    simulated = segments * tau / wall
    assert expected_goodput(tau, delta, mtbf, restart_s=restart) == pytest.approx(simulated, rel=0.02)


@pytest.mark.parametrize("ratio", [1e-4, 1e-3, 3e-3])
def test_young_daly_interval_is_near_the_numerical_optimum(ratio):
    mtbf = 36_000.0
    checkpoint = ratio * mtbf
    best = minimize_scalar(
        lambda tau: -expected_goodput(tau, checkpoint, mtbf), bounds=(checkpoint / 100, mtbf), method="bounded",
        options={"xatol": 1e-6 * mtbf},
    )
    interval, goodput = optimum_goodput(checkpoint, mtbf)
    assert interval == pytest.approx(young_daly_interval(checkpoint, mtbf))
    assert interval == pytest.approx(math.sqrt(2 * checkpoint * mtbf))
    assert abs(interval - best.x) / best.x < 0.05
    assert goodput == pytest.approx(-best.fun, rel=1e-3)
    assert goodput <= -best.fun + 1e-12


def test_young_daly_beats_other_intervals():
    checkpoint, mtbf = 20.0, 7200.0
    interval, goodput = optimum_goodput(checkpoint, mtbf, restart_s=15.0)
    for factor in (0.1, 0.3, 3.0, 10.0):
        assert expected_goodput(interval * factor, checkpoint, mtbf, restart_s=15.0) < goodput


def test_young_daly_edges():
    assert young_daly_interval(10.0, math.inf) == math.inf
    assert optimum_goodput(10.0, math.inf) == (math.inf, 1.0)
    assert young_daly_interval(500.0, 200.0) == pytest.approx(200.0)  # δ ≥ 2M: Daly's bound, τ = M
    assert optimum_goodput(0.0, 3600.0, restart_s=36.0) == (0.0, pytest.approx(math.exp(-0.01)))


def test_checkpoint_only_at_the_end():
    work = 4 * 3600.0
    final_only = expected_goodput(None, 10.0, 3600.0, work_s=work)
    assert final_only == pytest.approx(expected_goodput(work, 10.0, 3600.0))
    assert final_only < optimum_goodput(10.0, 3600.0)[1] / 10  # redoing hours of work is ruinous
    # an interval longer than the run is the run
    assert expected_goodput(10 * work, 10.0, 3600.0, work_s=work) == pytest.approx(final_only)
    # a longer run without checkpoints fares worse
    assert expected_goodput(None, 10.0, 3600.0, work_s=2 * work) < final_only
    # never checkpointing an endless run under faults gets nothing done
    assert expected_goodput(math.inf, 10.0, 3600.0) == 0.0


def test_long_segments_do_not_overflow():
    assert expected_goodput(1e6, 10.0, 1.0) == 0.0  # e^{1e6} would overflow; the goodput underflows to 0
    assert 0.0 < expected_goodput(300.0, 10.0, 1.0) < 1e-100
    assert expected_goodput(300.0, 10.0, 30.0) == pytest.approx(300.0 / (30.0 * math.expm1(310.0 / 30.0)))


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"interval_s": 300.0, "checkpoint_s": -1.0, "mtbf_s": 3600.0}, "checkpoint_s"),
        ({"interval_s": 300.0, "checkpoint_s": 1.0, "mtbf_s": 0.0}, "mtbf_s"),
        ({"interval_s": 300.0, "checkpoint_s": 1.0, "mtbf_s": -5.0}, "mtbf_s"),
        ({"interval_s": 300.0, "checkpoint_s": 1.0, "mtbf_s": 3600.0, "restart_s": -2.0}, "restart_s"),
        ({"interval_s": 0.0, "checkpoint_s": 1.0, "mtbf_s": 3600.0}, "interval_s"),
        ({"interval_s": -30.0, "checkpoint_s": 1.0, "mtbf_s": 3600.0}, "interval_s"),
        ({"interval_s": math.nan, "checkpoint_s": 1.0, "mtbf_s": 3600.0}, "interval_s"),
        ({"interval_s": None, "checkpoint_s": 1.0, "mtbf_s": 3600.0}, "work_s"),
        ({"interval_s": 300.0, "checkpoint_s": 1.0, "mtbf_s": 3600.0, "work_s": -1.0}, "work_s"),
    ],
)
def test_invalid_goodput_inputs_name_the_argument(kwargs, word):
    with pytest.raises(ValueError, match=word):
        expected_goodput(**kwargs)


def test_invalid_young_daly_inputs():
    with pytest.raises(ValueError, match="checkpoint_s"):
        young_daly_interval(-1.0, 3600.0)
    with pytest.raises(ValueError, match="mtbf_s"):
        optimum_goodput(1.0, 0.0)
    with pytest.raises(ValueError, match="restart_s"):
        optimum_goodput(1.0, 3600.0, restart_s=-1.0)


def test_loss_bound():
    assert loss_bound_steps(50, notice=True) == 0
    assert loss_bound_steps(50, notice=False) == 50
    assert loss_bound_steps(np.int64(7), notice=False) == 7
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="checkpoint_every_steps"):
            loss_bound_steps(bad, notice=False)


# --- traces ----------------------------------------------------------------------------------


def test_spot_bands_convert_to_rising_rates():
    assert list(SPOT_BANDS) == ["<5%", "5-10%", "10-15%", "15-20%", ">20%"]
    rates = [band_rate_per_hour(band) for band in SPOT_BANDS]
    assert all(a < b for a, b in zip(rates, rates[1:], strict=False))
    assert rates[0] == pytest.approx(-math.log(0.95) / 730.0)
    assert rates[-1] == pytest.approx(-math.log(0.75) / 730.0)
    # the Poisson reading: the chance of at least one interruption in a month is the band's edge
    for band, rate in zip(SPOT_BANDS, rates, strict=True):
        assert 1 - math.exp(-rate * 730.0) == pytest.approx(SPOT_BANDS[band])


def test_rate_for_bands_and_numbers():
    rate, words = rate_for("10-15%")
    assert rate == pytest.approx(band_rate_per_hour("10-15%"))
    assert "10-15%" in words and "per month" in words
    assert rate_for(" >20% ")[0] == pytest.approx(band_rate_per_hour(">20%"))
    assert rate_for(0.5)[0] == 0.5
    assert rate_for(2)[0] == 2.0
    assert rate_for("0.25")[0] == 0.25
    assert rate_for(0.0)[0] == 0.0
    assert published_rate_of(words) == pytest.approx(rate)
    assert published_rate_of("<5%") == pytest.approx(band_rate_per_hour("<5%"))
    assert published_rate_of("3") == 3.0
    assert published_rate_of("a made-up source") is None


@pytest.mark.parametrize("bad", ["30-40%", "often", -1.0, math.inf, math.nan, None, True])
def test_rate_for_refuses_what_it_cannot_read(bad):
    with pytest.raises(ValueError) as raised:
        rate_for(bad)
    if isinstance(bad, str):
        assert all(band in str(raised.value) for band in SPOT_BANDS)


def test_trace_is_deterministic_and_well_formed():
    trace = draw_trace(30.0, 600.0, seed=3)
    assert trace == draw_trace(30.0, 600.0, seed=3)
    assert trace != draw_trace(30.0, 600.0, seed=4)
    assert trace == sorted(trace)
    assert all(0.0 < t < 600.0 for t in trace)
    assert all(isinstance(t, float) for t in trace)
    # a longer horizon extends the trace; max_faults keeps its beginning
    longer = draw_trace(30.0, 6000.0, seed=3)
    assert longer[: len(trace)] == trace and len(longer) > len(trace)
    assert draw_trace(30.0, 6000.0, seed=3, max_faults=2) == longer[:2]
    assert draw_trace(30.0, 6000.0, seed=3, max_faults=0) == []
    assert draw_trace(0.0, 6000.0, seed=3) == []
    assert draw_trace(30.0, 0.0, seed=3) == []


def test_trace_counts_follow_the_rate():
    rate, horizon, seeds = 30.0, 600.0, range(400)  # 5 interruptions expected per trace
    traces = [draw_trace(rate, horizon, seed) for seed in seeds]
    counts = np.array([len(t) for t in traces])
    assert counts.mean() == pytest.approx(rate * horizon / 3600.0, abs=0.5)  # sd of the mean ≈ 0.11
    assert counts.var() == pytest.approx(counts.mean(), rel=0.3)  # Poisson: variance = mean
    long = draw_trace(rate, 100 * 3600.0, seed=1)  # ~3000 gaps, none cut short by the horizon but the last
    gaps = np.diff([0.0, *long])
    assert gaps.mean() == pytest.approx(3600.0 / rate, rel=0.06)  # sd of the mean ≈ 2%
    assert np.median(gaps) == pytest.approx(math.log(2) * 3600.0 / rate, rel=0.1)  # exponential gaps


def test_invalid_trace_arguments():
    with pytest.raises(ValueError, match="rate_per_hour"):
        draw_trace(-1.0, 600.0, seed=0)
    with pytest.raises(ValueError, match="horizon_s"):
        draw_trace(1.0, -600.0, seed=0)
    with pytest.raises(ValueError, match="max_faults"):
        draw_trace(1.0, 600.0, seed=0, max_faults=-1)
    with pytest.raises(ValueError, match="units"):
        draw_trace(1e9, 1e9, seed=0)


def test_acceleration():
    published = band_rate_per_hour("5-10%")
    factor = acceleration_for(published, horizon_s=120.0, expected_faults=4)
    replayed = accelerate(published, factor)
    assert replayed * 120.0 / 3600.0 == pytest.approx(4.0)
    assert factor > 1e4  # months compressed into minutes
    with pytest.raises(ValueError, match="factor"):
        accelerate(published, 0.0)
    with pytest.raises(ValueError, match="rate_per_hour"):
        acceleration_for(0.0, 120.0, 4)


# --- report ----------------------------------------------------------------------------------

_WHEN = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def _results() -> list[DrillResult]:
    notice = DrillResult(
        scenario="preempt-notice", title="Preemption with notice", backend="local", workload="pretrain",
        fault="SIGTERM to the training process", fault_at=1_735_787_045.5,
        timings=Timings(detect=0.123, contain=0.5, replace=2.25, resume=3.0),
        recovered=True, identical=True, digest="a" * 64, baseline_digest="a" * 64, unit="steps",
        work_lost=0, loss_bound=0, goodput=0.8123, optimum_goodput=0.9456, checkpoint_seconds=0.4,
        fault_rate_per_hour=60.0, action="retried on the same pool | resumed from step 40",
        attempts=[
            {"attempt": 1, "pool": "local", "outcome": "preempted", "started_at": 1_735_787_040.0, "seconds": 5.5},
            {"attempt": 2, "pool": "local", "outcome": "succeeded", "cause": None, "resumed_from": 40},
        ],
        ledger_causes={"preemption": 0.25}, run_id="run-123",
    )
    straggler = DrillResult(
        scenario="straggler", title="A straggler", backend="slurm", workload="rollouts",
        fault="one worker slowed tenfold", fault_at=1_735_787_100.0,
        timings=Timings(detect=4.0, contain=None, replace=None, resume=None),
        recovered=False, identical=False, digest="b" * 64, baseline_digest="c" * 64, unit="episodes",
        work_lost=7, loss_bound=5, goodput=0.5, optimum_goodput=0.9, checkpoint_seconds=1.0,
        fault_rate_per_hour=30.0, action="flagged the straggler",
    )
    return [notice, straggler]


def _trace() -> TraceResult:
    words = rate_for("5-10%")[1]
    published = band_rate_per_hour("5-10%")
    faults = [12.5, 40.0]
    return TraceResult(
        backend="local", workload="pretrain", rate_per_hour=accelerate(published, 1e5), band=words, seed=11,
        checkpoint_seconds=0.5, work_seconds=60.0,
        runs=[
            TraceRun("none", None, faults, 115.0, 60.0, 60.0 / 115.0, 0.55, 1, 52.5, True, True),
            TraceRun("fixed", 20.0, faults, 75.0, 60.0, 0.8, 0.78, 3, 12.0, True, True),
            TraceRun("young-daly", 8.5, faults, 70.0, 60.0, 60.0 / 70.0, 0.85, 7, 6.0, True, False),
        ],
    )


def test_report_writes_json_figures_and_markdown(tmp_path: Path):
    results, trace = _results(), _trace()
    out, docs = tmp_path / "out", tmp_path / "docs" / "drills.md"
    written = write_report(
        results, [trace], out, docs, command="sinewgrid drill --all", environment="2 cores, slurm 23.11",
        generated_at=_WHEN,
    )

    assert written["json"] == out / "drills.json" and written["markdown"] == out / "drills.md"
    assert written["docs"] == docs
    assert sorted(p.name for p in written["plots"]) == ["goodput.png", "recovery.png", "trace-1.png"]
    for path in [*written["plots"], *written["docs_images"]]:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.relative_to(docs.parent).as_posix() for p in written["docs_images"]) == [
        "drills/goodput.png", "drills/recovery.png", "drills/trace-1.png",
    ]

    document = json.loads((out / "drills.json").read_text())
    assert document["command"] == "sinewgrid drill --all"
    assert document["environment"] == "2 cores, slurm 23.11"
    assert document["generated_at"] == _WHEN.isoformat()
    assert [s["within_bound"] for s in document["scenarios"]] == [True, False]
    again, traces_again, about = load_report(out / "drills.json")
    assert again == results and traces_again == [trace]
    assert about["command"] == "sinewgrid drill --all"

    page = docs.read_text()
    local = (out / "drills.md").read_text()
    assert page.startswith("# Failure drills\n")
    assert "Generated 2025-01-02 03:04:05 UTC by `sinewgrid drill --all`" in page
    assert "2 cores, slurm 23.11" in page
    for section in ("## How to read this", "## Method", "## Scenarios", "## Preemption trace", "## Scenario details"):
        assert section in page
    assert (
        "| preempt-notice | local | pretrain | 0.12 | 0.50 | 2.25 | 3.00 | 0 / 0 steps | 81.2% vs 94.6% | ✓ | ✓ | "
        "retried on the same pool \\| resumed from step 40 |"
    ) in page
    assert (
        "| straggler | slurm | rollouts | 4.00 | — | — | — | 7 / 5 episodes (over bound) | 50.0% vs 90.0% | ✗ | ✗ (no reaction) | "
        "flagged the straggler |"
    ) in page
    for image in ("recovery.png", "goodput.png", "trace-1.png"):
        assert f"](drills/{image})" in page
        assert f"]({image})" in local
        assert (docs.parent / "drills" / image).is_file()

    # trace section: rates and one row per cadence
    assert "Published rate: 0.000144 interruptions per hour" in page
    assert "Replayed rate: 14.4 per hour" in page and "×100,000" in page
    assert "| none | final only | 2 | 115.00 | 52.2% vs 55.0% | 1 | 52.50 | ✓ | ✓ |" in page
    assert "| young-daly | 8.50 | 2 | 70.00 | 85.7% vs 85.0% | 7 | 6.00 | ✓ | ✗ |" in page

    # details: the attempts table has every key any attempt had
    assert "| attempt | pool | outcome | started_at | seconds | cause | resumed_from |" in page
    assert "| 1 | local | preempted | 2025-01-02T03:04:00.000Z | 5.50 | — | — |" in page
    assert "| 2 | local | succeeded | — | — | — | 40 |" in page
    assert "SIGTERM to the training process" in page
    assert "No attempt was recorded." in page  # the straggler has none


def test_report_with_nothing_run(tmp_path: Path):
    out, docs = tmp_path / "out", tmp_path / "docs" / "drills.md"
    written = write_report([], [], out, docs, command="sinewgrid drill", environment="laptop", generated_at=_WHEN)
    assert written["plots"] == [] and written["docs_images"] == []
    document = json.loads((out / "drills.json").read_text())
    assert document["scenarios"] == [] and document["traces"] == []
    page = docs.read_text()
    assert "no scenario was run" in page.lower()
    assert "No preemption trace was run." in page
    assert "![" not in page
    assert load_report(out / "drills.json")[:2] == ([], [])


def test_report_without_docs_and_with_odd_numbers(tmp_path: Path):
    result = _results()[1]
    result.goodput = math.nan
    result.optimum_goodput = math.inf
    out = tmp_path / "out"
    written = write_report([result], [], out, None, command="c", environment="e", generated_at=_WHEN)
    assert written["docs"] is None and written["docs_images"] == []
    document = json.loads((out / "drills.json").read_text())  # strict JSON: no NaN or Infinity
    assert document["scenarios"][0]["goodput"] is None
    assert "| — vs — |" in (out / "drills.md").read_text()


def test_report_removes_figures_of_an_earlier_report(tmp_path: Path):
    out, docs = tmp_path / "out", tmp_path / "docs" / "drills.md"
    write_report(_results(), [_trace()], out, docs, command="c", environment="e", generated_at=_WHEN)
    assert (out / "trace-1.png").is_file() and (docs.parent / "drills" / "trace-1.png").is_file()
    write_report(_results(), [], out, docs, command="c", environment="e", generated_at=_WHEN)
    assert not (out / "trace-1.png").exists() and not (docs.parent / "drills" / "trace-1.png").exists()
    assert (out / "recovery.png").is_file()


def test_several_traces_are_summarised_per_cadence(tmp_path: Path):
    first, second = _trace(), _trace()
    second.seed = 2
    written = write_report([], [first, second], tmp_path / "out", None, command="sinewgrid drill", environment="test")
    page = written["markdown"].read_text()
    assert "Over 2 traces" in page and "### Trace 2:" in page
    for run in first.runs:
        # The mean of two identical traces is the trace's own figure.
        assert f"| {run.cadence} | 2 | {2 * len(run.faults_at)} | {run.goodput:.1%} |" in page


def test_a_start_up_the_engine_saw_late_counts_as_none_not_as_negative_time():
    """Slurm may list a job running after its workload already reported it resumed."""
    from drills.runner import best_goodput

    timeline = [{"running_at": 10.3, "resumed_at": 10.0}, {"running_at": 20.4, "resumed_at": 20.2}]
    assert 0 < best_goodput(work_s=30.0, checkpoint_s=0.1, wall_s=40.0, timeline=timeline) <= 1
