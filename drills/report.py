"""Publishing the drills: drills.json, PNG figures and a Markdown page (docs/drills.md).

`write_report` takes what the runner measured (`DrillResult` per scenario, `TraceResult` per
preemption trace) and writes, into one folder:

- drills.json   every result (`to_json`), with when, by which command and where it ran;
- recovery.png  seconds from the fault to detect / contain / replace / resume, per scenario;
- goodput.png   each faulted run's goodput next to the Young/Daly optimum for it;
- trace-N.png   per trace: goodput per checkpoint cadence, measured and predicted, and when
                the interruptions landed;
- drills.md     the page, with the figures linked next to it.

Given `docs_path`, the page is written there too, its figures copied into a `drills/` folder
beside it and linked relatively. `load_report` reads drills.json back into the records.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from drills.goodput import young_daly_interval
from drills.model import DrillResult, Timings, TraceResult, TraceRun
from drills.trace import format_hours, published_rate_of

JSON_NAME = "drills.json"
MARKDOWN_NAME = "drills.md"
RECOVERY_PNG = "recovery.png"
GOODPUT_PNG = "goodput.png"
IMAGES_FOLDER = "drills"  # beside docs_path
MILESTONES = ("detect", "contain", "replace", "resume")
_MILESTONE_COLOURS = {"detect": "tab:blue", "contain": "tab:orange", "replace": "tab:purple", "resume": "tab:green"}


def write_report(
    results: list[DrillResult],
    traces: list[TraceResult],
    out_dir: Path,
    docs_path: Path | None,
    *,
    command: str,
    environment: str,
    generated_at: dt.datetime | None = None,
) -> dict[str, Any]:
    """Write drills.json, the figures and drills.md into out_dir (and the page to docs_path).

    command and environment are printed on the page as they are given (the command line that
    ran the drills, and where: host, backends, versions). generated_at defaults to now (UTC).
    Returns the paths written: {"json", "markdown", "plots", "docs", "docs_images"} ("docs" is
    None and "docs_images" empty without docs_path).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    when = (generated_at or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)

    json_path = out_dir / JSON_NAME
    payload = report_json(results, traces, command=command, environment=environment, generated_at=when)
    json_path.write_text(json.dumps(payload, indent=2, ensure_ascii=False, allow_nan=False) + "\n")

    figures = render_figures(results, traces)
    plots = _write_figures(figures, out_dir)
    markdown_path = out_dir / MARKDOWN_NAME
    markdown_path.write_text(
        render_markdown(results, traces, command=command, environment=environment, generated_at=when, images=list(figures))
    )

    docs_written: Path | None = None
    docs_images: list[Path] = []
    if docs_path is not None:
        docs_path = Path(docs_path)
        docs_path.parent.mkdir(parents=True, exist_ok=True)
        docs_images = _write_figures(figures, docs_path.parent / IMAGES_FOLDER)
        docs_path.write_text(
            render_markdown(
                results, traces, command=command, environment=environment, generated_at=when,
                images=[f"{IMAGES_FOLDER}/{name}" for name in figures],
            )
        )
        docs_written = docs_path
    return {"json": json_path, "markdown": markdown_path, "plots": plots, "docs": docs_written, "docs_images": docs_images}


# JSON -------------------------------------------------------------------------------------


def report_json(
    results: Iterable[DrillResult], traces: Iterable[TraceResult], *, command: str, environment: str, generated_at: dt.datetime
) -> dict[str, Any]:
    """The drills.json document. Infinite or NaN numbers become null (JSON has no such numbers)."""
    return {
        "generated_at": generated_at.isoformat(),
        "command": command,
        "environment": environment,
        "scenarios": [_finite(result.to_json()) for result in results],
        "traces": [_finite(trace.to_json()) for trace in traces],
    }


def load_report(path: Path) -> tuple[list[DrillResult], list[TraceResult], dict[str, Any]]:
    """Read a drills.json back: (results, traces, {generated_at, command, environment})."""
    document = json.loads(Path(path).read_text())
    results = []
    for entry in document.get("scenarios", []):
        fields = {k: v for k, v in entry.items() if k not in ("within_bound", "reacted", "passed")}
        fields["timings"] = Timings(**fields["timings"])
        results.append(DrillResult(**fields))
    traces = [
        TraceResult(**{**entry, "runs": [TraceRun(**run) for run in entry.get("runs", [])]}) for entry in document.get("traces", [])
    ]
    about = {key: document.get(key) for key in ("generated_at", "command", "environment")}
    return results, traces, about


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


# Figures ----------------------------------------------------------------------------------


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


def _write_figures(figures: dict[str, bytes], folder: Path) -> list[Path]:
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


# Markdown ---------------------------------------------------------------------------------


def render_markdown(
    results: list[DrillResult],
    traces: list[TraceResult],
    *,
    command: str,
    environment: str,
    generated_at: dt.datetime,
    images: list[str],
) -> str:
    """The report page. images: the figure paths to link, as the page should spell them."""
    by_name = {Path(image).name: image for image in images}
    lines = [
        "# Failure drills",
        "",
        f"Generated {generated_at.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC by {_code(command)}.",
        "",
        f"Environment: {_inline(environment)}",
        "",
        *_how_to_read(),
        *_method(),
        "## Scenarios",
        "",
    ]
    if results:
        lines += [*_scenario_table(results), ""]
        for name, alt in ((RECOVERY_PNG, "Recovery time per scenario and backend"), (GOODPUT_PNG, "Goodput against the Young/Daly optimum")):
            if name in by_name:
                lines += [f"![{alt}]({by_name[name]})", ""]
    else:
        lines += ["No scenario was run.", ""]
    lines += ["## Preemption trace", ""]
    if traces:
        if len(traces) > 1:
            lines += _trace_summary(traces)
        for number, trace in enumerate(traces, start=1):
            lines += _trace_section(number, trace, by_name.get(f"trace-{number}.png"))
    else:
        lines += ["No preemption trace was run.", ""]
    if results:
        lines += ["## Scenario details", ""]
        for result in results:
            lines += _detail(result)
    return "\n".join(lines).rstrip() + "\n"


def _how_to_read() -> list[str]:
    return [
        "## How to read this",
        "",
        "Each scenario injects one real fault into a real run of a lane's workload and times how the "
        "platform recovered. The times are seconds after the fault; — means that milestone never happened. "
        "*Work lost / bound* compares the work the run had to redo with the most its checkpoint cadence "
        "allows; a run within its bound lost no more than promised. *Goodput* is the share of the "
        "allocated time that went into the result, next to the best a checkpoint cadence can do at that "
        "fault rate. *Identical* says whether the run ended in exactly the state an uninterrupted run "
        "with the same seeds reaches. *Passed* needs all of it: the platform reacted (every milestone "
        "happened), the step finished, within its bound, identical. Each drill is a Dagster run: open "
        "`platform/failure_drill` in the UI for its partition's metadata. The preemption trace replays interruptions drawn from a rate over a "
        "longer run, once per checkpoint cadence, and compares goodput with what the model predicts.",
        "",
    ]


def _method() -> list[str]:
    items = [
        "**Fault time**: when the injector acted (signal sent, file torn, pool taken away, node marked unhealthy).",
        "**Detect**: when the platform saw the attempt end or flagged it (the backend saw the process or job "
        "end, the straggler detector or the health check raised it).",
        "**Contain**: when the faulty capacity was out of use: the attempt's process gone, the pool cooled "
        "down or drained, so nothing new lands on it.",
        "**Replace**: when the next attempt was running on replacement capacity.",
        "**Resume**: when the new attempt reported it had loaded its checkpoint and was working again.",
        "**Work lost**: the units (steps or episodes) done before the fault minus the unit the next attempt "
        "resumed from. With notice, the checkpoint written on SIGTERM gives the units done exactly; without, "
        "they are the last checkpoint plus the time from it to the fault at the attempt's median step time "
        "(from its step-time telemetry).",
        "**Bound**: what the checkpoint cadence promises: 0 with notice (the workload checkpoints on SIGTERM "
        "at the end of its current step), one checkpoint interval without.",
        "**Goodput**: productive ÷ allocated seconds over every attempt of the faulted run, from the ledger.",
        "**Optimum**: the best goodput a checkpoint cadence allows this run: Daly's model (Daly 2006) at the "
        "Young/Daly interval √(2·δ·M), for the checkpoint cost δ measured in the run, one fault per faulted run "
        "(M = its wall time) and the restart cost R measured in it (process start, imports, data, reading the "
        "checkpoint), with the first start-up added. At these small sizes start-up dominates: the gap between "
        "goodput and optimum is mostly the recovery the scenario measures.",
        "**Identical**: the sha256 of the final checkpoint's tensors (training) or of the episode files "
        "(rollouts), compared with an uninterrupted run with the same seeds.",
        "**Trace mode**: interruption times are a Poisson process drawn with a fixed seed; every cadence "
        "replays the same times. The predicted goodput is Daly's model for the cadence's interval, the "
        "measured checkpoint cost, the replayed rate and the measured restart cost. A trace holds a bounded "
        "number of interruptions, so a run that keeps losing its work (no cadence) finishes once they run "
        "out, where Daly's model assumes they never stop: there, measured goodput is above the prediction by "
        "construction. One draw can be lucky or unlucky; compare the means over several seeds.",
    ]
    return ["## Method", "", *(f"- {item}" for item in items), ""]


def _scenario_table(results: list[DrillResult]) -> list[str]:
    header = [
        "scenario", "backend", "workload", "detect (s)", "contain (s)", "replace (s)", "resume (s)",
        "work lost / bound", "goodput vs optimum", "identical", "passed", "what the platform did",
    ]
    rows = []
    for r in results:
        lost = f"{r.work_lost} / {r.loss_bound} {r.unit}" + ("" if r.within_bound else " (over bound)")
        rows.append([
            r.scenario, r.backend, r.workload,
            *(_seconds(getattr(r.timings, m)) for m in MILESTONES),
            lost, f"{_percent(r.goodput)} vs {_percent(r.optimum_goodput)}", _tick(r.identical),
            _tick(r.passed) + ("" if r.reacted else " (no reaction)"), r.action,
        ])
    return _table(header, rows)


def _trace_summary(traces: list[TraceResult]) -> list[str]:
    """Each cadence over every trace: one draw of a Poisson process can be lucky or unlucky
    (a long quiet gap, a burst); the mean over several draws is the figure to compare."""
    cadences = list(dict.fromkeys(run.cadence for trace in traces for run in trace.runs))
    rows = []
    for cadence in cadences:
        runs = [run for trace in traces for run in trace.runs if run.cadence == cadence]
        mean = lambda values: sum(values) / len(values) if values else float("nan")  # noqa: E731
        rows.append([
            cadence,
            str(len(runs)),
            str(sum(len(run.faults_at) for run in runs)),
            _percent(mean([run.goodput for run in runs])),
            _percent(mean([run.predicted_goodput for run in runs])),
            f"{mean([run.work_lost_seconds for run in runs]):.2f}",
            f"{sum(run.finished and run.identical for run in runs)}/{len(runs)}",
        ])
    header = ["cadence", "traces", "interruptions (all)", "mean goodput", "mean predicted (Daly)", "mean work lost (s)", "finished and identical"]
    return [
        f"Over {len(traces)} traces (one seed each, the same rate); the sections below give each trace.",
        "",
        *_table(header, rows),
        "",
    ]


def _trace_section(number: int, trace: TraceResult, image: str | None) -> list[str]:
    lines = [f"### Trace {number}: {trace.workload} on {trace.backend}, seed {trace.seed}", ""]
    published = published_rate_of(trace.band)
    lines.append(f"- Rate source: {_inline(trace.band)}")
    if published is not None and published > 0:
        factor = trace.rate_per_hour / published
        lines.append(f"- Published rate: {published:.3g} interruptions per hour (one every {format_hours(1 / published)})")
        lines.append(
            f"- Replayed rate: {trace.rate_per_hour:.3g} per hour (one every {format_hours(1 / trace.rate_per_hour)}), "
            f"time compressed ×{factor:,.0f}"
            if trace.rate_per_hour > 0 else "- Replayed rate: 0 per hour (no interruptions)"
        )
    elif trace.rate_per_hour > 0:
        lines.append(f"- Replayed rate: {trace.rate_per_hour:.3g} per hour (one every {format_hours(1 / trace.rate_per_hour)})")
    else:
        lines.append("- Replayed rate: 0 per hour (no interruptions)")
    lines.append(f"- Checkpoint cost (measured): {_seconds(trace.checkpoint_seconds)} s; uninterrupted work: {trace.work_seconds:.2f} s")
    if trace.rate_per_hour > 0:
        interval = young_daly_interval(trace.checkpoint_seconds, 3600.0 / trace.rate_per_hour)
        lines.append(f"- Young/Daly interval at the replayed rate: {interval:.2f} s of work")
    lines.append("")
    if trace.runs:
        header = [
            "cadence", "interval (s)", "faults", "wall (s)", "goodput measured vs predicted",
            "checkpoints", "work lost (s)", "finished", "identical",
        ]
        rows = [
            [
                run.cadence,
                "final only" if run.interval_seconds is None else _seconds(run.interval_seconds),
                str(len(run.faults_at)),
                _seconds(run.wall_seconds),
                f"{_percent(run.goodput)} vs {_percent(run.predicted_goodput)}",
                str(run.checkpoints),
                _seconds(run.work_lost_seconds),
                _tick(run.finished),
                _tick(run.identical),
            ]
            for run in trace.runs
        ]
        lines += [*_table(header, rows), ""]
        if image:
            lines += [f"![Preemption trace {number}: goodput per cadence and fault timeline]({image})", ""]
    else:
        lines += ["No cadence was run under this trace.", ""]
    return lines


def _detail(result: DrillResult) -> list[str]:
    lines = [
        f"### {_inline(result.title)}: {result.backend}, {result.workload}",
        "",
        f"- Scenario: `{result.scenario}`" + (f", Dagster run `{result.run_id}`" if result.run_id else ""),
        f"- Fault: {_inline(result.fault)}, at {_when(result.fault_at)}",
        f"- What the platform did: {_inline(result.action)}",
        f"- Recovered: {_tick(result.recovered)}; work lost {result.work_lost} {result.unit} (bound {result.loss_bound})",
        f"- Checkpoint cost {_seconds(result.checkpoint_seconds)} s; fault rate {result.fault_rate_per_hour:.3g} per hour",
        f"- Final state {_tick(result.identical)}: digest `{result.digest[:16]}`, uninterrupted run `{result.baseline_digest[:16]}`",
    ]
    if result.ledger_causes:
        causes = ", ".join(f"{cause} {_seconds(seconds)} s" for cause, seconds in result.ledger_causes.items())
        lines.append(f"- Lost time in the ledger by cause: {causes}")
    lines.append("")
    if result.attempts:
        keys: list[str] = []
        for attempt in result.attempts:
            keys += [key for key in attempt if key not in keys]
        rows = [[_attempt_cell(key, attempt.get(key)) for key in keys] for attempt in result.attempts]
        lines += ["Attempts:", "", *_table(keys, rows), ""]
    else:
        lines += ["No attempt was recorded.", ""]
    return lines


# Cells ------------------------------------------------------------------------------------


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(_inline(h) for h in header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(_inline(cell) for cell in row) + " |" for row in rows),
    ]


def _inline(text: Any) -> str:
    """Text for one line or table cell: pipes escaped, line breaks as spaces."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: str) -> str:
    fence = "`"
    while fence in text:
        fence += "`"
    padded = f" {text} " if text.startswith("`") or text.endswith("`") else text
    return f"{fence}{padded}{fence}"


def _seconds(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:.2f}" if abs(value) >= 0.1 or value == 0 else f"{value:.3g}"


def _percent(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.1%}"


def _tick(value: bool) -> str:
    return "✓" if value else "✗"


def _when(unix: float) -> str:
    if unix is None or not math.isfinite(unix):
        return "—"
    return dt.datetime.fromtimestamp(unix, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _attempt_cell(key: str, value: Any) -> str:
    """An attempts-table cell: unix times under *_at keys as UTC times, other numbers at 2 decimals."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return _tick(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "—"
    if key.endswith("_at") and isinstance(value, (int, float)) and value > 1e9:
        return _when(float(value))
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)

