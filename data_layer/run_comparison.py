"""Comparing recorded training runs: two runs' figures, config, datasets and code side by side
(`compare`, `Comparison`, `MetricDiff`), runs' curves plotted on shared axes (`curve_png`), a model's successive runs as rounds
(`rounds_frame`, `rounds_png`), and a PNG as a markdown image for Dagster metadata (`image_markdown`).

    compare(load_run(root, a), load_run(root, b)).markdown()
"""

from __future__ import annotations

import base64
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from data_layer.experiments import ExperimentRun


# Figures --------------------------------------------------------------------------------
def curve_png(runs: Sequence[ExperimentRun], metric: str = "loss") -> bytes:
    """One `metric` curve per run on shared axes, as PNG bytes (log scale when it spans decades)."""
    figure = Figure(figsize=(8, 4.2))
    axes = figure.add_subplot()
    plotted, lowest, highest = 0, math.inf, -math.inf
    for run in runs:
        curve = run.curve(metric)
        if curve.empty:
            continue
        axes.plot(curve["step"], curve["value"], label=run.lineage, linewidth=1.4)
        lowest, highest = min(lowest, curve["value"].min()), max(highest, curve["value"].max())
        plotted += 1
    if not plotted:
        have = sorted({m for run in runs for m in run.curves()["metric"].unique()})
        raise ValueError(
            f"none of {', '.join(r.lineage for r in runs) or 'these runs'} recorded a {metric!r} curve"
            + (f"; they have: {', '.join(have)}" if have else "; they have no curves at all")
        )
    if lowest > 0 and highest / lowest > 100:
        axes.set_yscale("log")
    axes.set_title(f"{metric} by training step", fontsize=11)
    axes.set_xlabel("step")
    axes.set_ylabel(metric)
    axes.grid(alpha=0.3)
    axes.legend(title="run", fontsize=8, title_fontsize=8)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return buffer.getvalue()


def image_markdown(png: bytes, title: str) -> str:
    """A PNG as a markdown image with a data URI, for Dagster `MetadataValue.md`."""
    return f"![{title}](data:image/png;base64,{base64.b64encode(png).decode()})"


# Rounds -----------------------------------------------------------------------------------


def rounds_frame(runs: Sequence[ExperimentRun], metrics: Sequence[str]) -> pd.DataFrame:
    """One row per run of a model, oldest first (round 1 is the first): `metrics` from each run's
    summary, its cost and the dataset it trained on. A metric a run did not record is NaN."""
    ordered = sorted(runs, key=lambda r: r.recorded_at)
    return pd.DataFrame(
        [
            {"round": i, "run": r.run, **{m: r.summary.get(m, math.nan) for m in metrics}, "cost_usd": math.nan if r.cost_usd is None else r.cost_usd, "dataset": ", ".join(r.datasets)}
            for i, r in enumerate(ordered, start=1)
        ]
    )


def rounds_png(frame: pd.DataFrame, panels: Mapping[str, Sequence[str]], label: str) -> bytes:
    """Figures by round, as PNG bytes: one panel per entry of `panels` (title -> the columns of
    `frame` drawn in it, one line each, a point per round), the rounds on a shared x axis."""
    figure = Figure(figsize=(4 * len(panels), 3.4))
    for i, (title, columns) in enumerate(panels.items(), start=1):
        axes = figure.add_subplot(1, len(panels), i)
        for column in columns:
            axes.plot(frame["round"], frame[column], marker="o", linewidth=1.4, label=column)
        axes.set_title(title, fontsize=10)
        axes.set_xlabel("round")
        axes.set_xticks(list(frame["round"]))
        axes.grid(alpha=0.3)
        if len(columns) > 1:
            axes.legend(fontsize=7)
    figure.suptitle(label, fontsize=11)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    return buffer.getvalue()


# Comparison -----------------------------------------------------------------------------


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted keys: `{"model": {"hidden": 64}}` -> `{"model.hidden": 64}`."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_config(value, name + "."))
        else:
            out[name] = value
    return out


_MISSING = "—"


@dataclass(frozen=True)
class MetricDiff:
    name: str
    a: float | None
    b: float | None

    @property
    def diff(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a


@dataclass(frozen=True)
class Comparison:
    """Run `a` against run `b`: figures side by side, what differs in config, data and code."""

    a: ExperimentRun
    b: ExperimentRun
    metrics: list[MetricDiff]
    config: list[tuple[str, Any, Any]]  # (key, value in a, value in b), keys that differ only
    datasets_only_a: list[str]
    datasets_only_b: list[str]
    datasets_both: list[str]

    @property
    def same_code(self) -> bool:
        return self.a.code_version == self.b.code_version

    def markdown(self) -> str:
        def num(v: float | None) -> str:
            return _MISSING if v is None else f"{v:.6g}"

        def signed(v: float | None) -> str:
            return _MISSING if v is None else f"{v:+.6g}"

        lines = [
            f"**a** = `{self.a.lineage}`  \n**b** = `{self.b.lineage}`",
            "",
            "| metric | a | b | b − a |",
            "|---|---|---|---|",
            *(f"| {m.name} | {num(m.a)} | {num(m.b)} | {signed(m.diff)} |" for m in self.metrics),
        ]
        if not self.metrics:
            lines.append("| no metrics recorded | | | |")
        lines += ["", "**Config that differs**", ""]
        if self.config:
            lines += ["| key | a | b |", "|---|---|---|"]
            lines += [f"| {k} | {_MISSING if va is _MISSING else json.dumps(va)} | {_MISSING if vb is _MISSING else json.dumps(vb)} |" for k, va, vb in self.config]
        else:
            lines.append("identical")
        lines += [
            "",
            "**Datasets**",
            "",
            f"- only in a: {', '.join(f'`{d}`' for d in self.datasets_only_a) or 'none'}",
            f"- only in b: {', '.join(f'`{d}`' for d in self.datasets_only_b) or 'none'}",
            f"- in both: {', '.join(f'`{d}`' for d in self.datasets_both) or 'none'}",
            "",
            f"**Code**: a `{self.a.code_version or 'unknown'}`, b `{self.b.code_version or 'unknown'}`"
            + (" (the same)" if self.same_code and self.a.code_version else ""),
        ]
        return "\n".join(lines)

    def png(self, metric: str = "loss") -> bytes:
        """Both runs' `metric` curves on one plot."""
        return curve_png([self.a, self.b], metric)


def compare(a: ExperimentRun, b: ExperimentRun) -> Comparison:
    """Compare two recorded runs: summary and evaluation figures, config, datasets and code."""
    fa, fb = a.figures(), b.figures()
    metrics = [MetricDiff(name, fa.get(name), fb.get(name)) for name in sorted(set(fa) | set(fb))]
    ca, cb = flatten_config(a.config), flatten_config(b.config)
    config = [(k, ca.get(k, _MISSING), cb.get(k, _MISSING)) for k in sorted(set(ca) | set(cb)) if ca.get(k, _MISSING) != cb.get(k, _MISSING)]
    da, db = set(a.datasets), set(b.datasets)
    return Comparison(
        a=a,
        b=b,
        metrics=metrics,
        config=config,
        datasets_only_a=sorted(da - db),
        datasets_only_b=sorted(db - da),
        datasets_both=sorted(da & db),
    )
