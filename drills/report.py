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

This module writes the report and holds its JSON (`report_json`, `load_report`); the figures
are drawn in `drills.report_plots` and the page is rendered in `drills.report_markdown`.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from drills.model import DrillResult, Timings, TraceResult, TraceRun
from drills.report_markdown import render_markdown
from drills.report_plots import render_figures, write_figures

JSON_NAME = "drills.json"
MARKDOWN_NAME = "drills.md"
IMAGES_FOLDER = "drills"  # beside docs_path


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
    plots = write_figures(figures, out_dir)
    markdown_path = out_dir / MARKDOWN_NAME
    markdown_path.write_text(
        render_markdown(results, traces, command=command, environment=environment, generated_at=when, images=list(figures))
    )

    docs_written: Path | None = None
    docs_images: list[Path] = []
    if docs_path is not None:
        docs_path = Path(docs_path)
        docs_path.parent.mkdir(parents=True, exist_ok=True)
        docs_images = write_figures(figures, docs_path.parent / IMAGES_FOLDER)
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
