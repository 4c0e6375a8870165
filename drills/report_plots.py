"""The drill report's figures, drawn with matplotlib and returned as PNG bytes.

- recovery.png  seconds from the fault to detect / contain / replace / resume, per scenario;
- goodput.png   each faulted run's goodput next to the Young/Daly optimum for it;
- trace-N.png   per preemption trace: goodput per checkpoint cadence, measured and
                predicted, and when the interruptions landed.

`render_figures` draws every figure there is data for; `write_figures` puts them in a folder.
The page that links them is written by `drills.report`.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from drills.model import DrillResult, TraceResult

RECOVERY_PNG = "recovery.png"
GOODPUT_PNG = "goodput.png"
MILESTONES = ("detect", "contain", "replace", "resume")
_MILESTONE_COLOURS = {"detect": "tab:blue", "contain": "tab:orange", "replace": "tab:purple", "resume": "tab:green"}


def render_figures(results: list[DrillResult], traces: list[TraceResult]) -> dict[str, bytes]:
    """File name → PNG bytes for every figure there is data for (none for empty lists)."""
    figures: dict[str, bytes] = {}
    if results:
        figures[RECOVERY_PNG] = recovery_png(results)
        figures[GOODPUT_PNG] = goodput_png(results)
    for number, trace in enumerate(traces, start=1):
        if trace.runs:
            figures[f"trace-{number}.png"] = trace_png(trace)
    return figures


def write_figures(figures: dict[str, bytes], folder: Path) -> list[Path]:
    """Write the figures into folder and remove figures an earlier report left there."""
    folder.mkdir(parents=True, exist_ok=True)
    stale = [folder / RECOVERY_PNG, folder / GOODPUT_PNG, *folder.glob("trace-*.png")]
    for path in stale:
        if path.name not in figures and path.is_file():
            path.unlink()
    written = []
    for name, data in figures.items():
        path = folder / name
        path.write_bytes(data)
        written.append(path)
    return written


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return buffer.getvalue()


def _label(result: DrillResult) -> str:
    return f"{result.scenario} · {result.backend} · {result.workload}"


def _rows_figure(count: int, title: str) -> tuple[Figure, Any]:
    figure = Figure(figsize=(10, 1.2 + 0.28 * max(count, 1)))
    axes = figure.add_subplot()
    axes.set_title(title, fontsize=10)
    return figure, axes


def recovery_png(results: list[DrillResult]) -> bytes:
    """One row per drill: the time from the fault to each milestone, as consecutive segments
    (fault → detect → contain → replace → resume)."""
    figure, axes = _rows_figure(len(results), "Recovery: seconds from the fault to each milestone (— did not happen)")
    for row, result in enumerate(results):
        start = 0.0
        for milestone in MILESTONES:
            value = getattr(result.timings, milestone)
            if value is None:
                axes.annotate("—", (start, row), ha="left", va="center", fontsize=8, color="grey")
                break
            axes.barh(row, max(value - start, 0.0), left=start, height=0.6, color=_MILESTONE_COLOURS[milestone],
                      label=milestone if row == 0 else None)
            start = max(start, value)
        else:
            axes.annotate(f"{start:.1f}s", (start, row), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    axes.set_yticks(range(len(results)), [_label(r) for r in results], fontsize=7)
    axes.set_ylim(len(results) - 0.5, -0.5)  # first drill on top
    axes.set_xlabel("seconds after the fault")
    handles = [Patch(color=_MILESTONE_COLOURS[m], label=m) for m in MILESTONES]
    axes.legend(handles=handles, fontsize=8, loc="lower right")
    return _png(figure)


def goodput_png(results: list[DrillResult]) -> bytes:
    """One row per drill: the faulted run's measured goodput, and the Young/Daly optimum for it."""
    figure, axes = _rows_figure(len(results), "Goodput of each faulted run (bar) against the Young/Daly optimum for it (|)")
    for row, result in enumerate(results):
        measured, optimum = _nan(result.goodput), _nan(result.optimum_goodput)
        axes.barh(row, measured, height=0.6, color="tab:blue")
        if not math.isnan(optimum):
            axes.plot([optimum, optimum], [row - 0.35, row + 0.35], color="black", linewidth=2)
        if not math.isnan(measured):
            axes.annotate(f"{measured:.0%}", (measured, row), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    axes.set_yticks(range(len(results)), [_label(r) for r in results], fontsize=7)
    axes.set_ylim(len(results) - 0.5, -0.5)
    axes.set_xlim(0, 1.05)
    axes.set_xlabel("goodput (productive ÷ allocated)")
    return _png(figure)


def trace_png(trace: TraceResult) -> bytes:
    """Left: goodput per cadence, measured and predicted. Right: each cadence's run, its faults marked."""
    figure = Figure(figsize=(11, 3.8))
    bars, timeline = figure.subplots(1, 2)
    runs = trace.runs
    positions = np.arange(len(runs))
    bars.bar(positions - 0.2, [_nan(r.goodput) for r in runs], 0.4, label="measured", color="tab:blue")
    bars.bar(positions + 0.2, [_nan(r.predicted_goodput) for r in runs], 0.4, label="predicted (Daly)", color="tab:gray", alpha=0.6)
    bars.set_xticks(positions, [r.cadence for r in runs], fontsize=8)
    bars.set_ylim(0, 1.25)
    bars.set_yticks(np.linspace(0, 1, 6))
    bars.set_ylabel("goodput (work ÷ wall)")
    bars.set_title(f"Goodput per checkpoint cadence, {trace.rate_per_hour:.3g} interruptions/h", fontsize=10)
    bars.legend(fontsize=8, loc="upper center", ncols=2)
    for row, run in enumerate(runs):
        colour = "tab:green" if run.finished else "tab:red"
        timeline.barh(row, run.wall_seconds, height=0.5, color=colour, alpha=0.35)
        if run.faults_at:
            timeline.plot(run.faults_at, [row] * len(run.faults_at), "x", color="tab:red", markersize=9)
    timeline.set_yticks(range(len(runs)), [r.cadence for r in runs], fontsize=8)
    timeline.invert_yaxis()  # first cadence on top
    timeline.set_xlabel("seconds since the run started (× interruption; bar: wall time, red if unfinished)", fontsize=8)
    timeline.set_title("When the interruptions landed", fontsize=10)
    return _png(figure)


def _nan(value: float | None) -> float:
    """A bar height: NaN (no bar) for a missing or infinite value."""
    return float("nan") if value is None or not math.isfinite(value) else float(value)
