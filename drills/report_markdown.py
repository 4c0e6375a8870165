"""The drill report's Markdown page (drills.md, docs/drills.md), rendered from the results.

`render_markdown` writes the page: how to read it, the method, a table of the scenarios with
their figures, each preemption trace, and every scenario's details and attempts. The helpers
at the end format cells (seconds, percentages, UTC times, escaped text). The page is written,
next to drills.json and the figures, by `drills.report`.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

from drills.goodput import young_daly_interval
from drills.model import DrillResult, TraceResult
from drills.report_plots import GOODPUT_PNG, MILESTONES, RECOVERY_PNG
from drills.trace import format_hours, published_rate_of


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
        "**Fault time**: when the injector acted (signal sent, file torn, pool taken away, node marked unhealthy). "
        "Faults fire on events, never on a guess about the run's speed: the torn checkpoint is the checkpoint "
        "writer's own failpoint; for every other fault the workload, armed with a `hold` failpoint, says it has done "
        "the fault's unit (the middle of the interval after the trigger checkpoint; for rollouts, the trigger "
        "episode committed) and waits there, and the injector fires on that and lets it go on (an unhealthy node: "
        "the workload waits until the platform stops it). The held time counts neither as work nor as step time. "
        "A drill too small for its fault, or whose run finished with nothing to recover, is an error.",
        "**Gang scenarios** (`node-loss`, `slow-rank`, `node-unqualified`, workload `pretrain-gang`): the pretraining "
        "as a gang of 2 nodes × 1 rank on a pool of 3 nodes (one spare): local (torchrun per node), Slurm (a 3-node "
        "cluster, each node in its own network namespace) and Ray (a head and 3 worker nodes). The fault hits rank 1's "
        "node; the platform replaces that node alone (Slurm: drained; Ray: Ray's own drain; local: left out) and the "
        "gang resumes on the spare. `node-unqualified` fires before the gang starts: the node that would host rank 1 "
        "fails its health check in the gang's qualification probe (one rank per node), so nothing runs and nothing "
        "is lost; its times count from the moment the health check was set to fail, before the run began.",
        "**Detect**: when the platform saw the attempt end or flagged it (the backend saw the process or job "
        "end, the straggler detector or the health check raised it).",
        "**Contain**: when the faulty capacity was out of use: the attempt's process gone, the pool cooled "
        "down or drained, so nothing new lands on it.",
        "**Replace**: when the next attempt was running on replacement capacity.",
        "**Resume**: when the new attempt reported it had loaded its checkpoint and was working again.",
        "**Work lost**: the units (steps or episodes) done before the fault minus the unit the next attempt "
        "resumed from. With notice, the checkpoint written on SIGTERM gives the units done exactly; without, "
        "the unit the workload was held at does (where no hold told it, the last checkpoint plus the time from "
        "it to the fault at the attempt's median step time, from its step-time telemetry).",
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

