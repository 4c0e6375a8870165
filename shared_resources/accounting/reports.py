"""Reports over the ledger: goodput and cost per run, project, provider and lane; cost per
completed task; and the figures (cost breakdown, goodput over time) as PNG bytes.

Every function takes the DataFrame `Ledger.frame()` returns and changes nothing.

Goodput is productive time over allocated time, each attempt weighed by its GPUs: an hour
lost on eight GPUs counts eight times an hour lost on one. Cost per completed task is
everything a group spent (failed, preempted and refused attempts included) over the tasks
it completed.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from shared_resources.accounting.records import LOST_REASONS

GROUPINGS = {"run": "run_id", "project": "project", "provider": "provider", "lane": "lane", "tenant": "tenant", "cause": "cause"}
_PURCHASING_ORDER = ["reserved", "block", "on_demand", "spot"]
_OUTCOME_COLOURS = {"succeeded": "tab:green", "preempted": "tab:orange", "refused": "tab:gray", "failed": "tab:red", "orphaned": "tab:purple"}


def _weighted(frame: pd.DataFrame) -> pd.DataFrame:
    """GPU-hours of each part of each attempt's time (allocated = productive + checkpoint + lost)."""
    gpus = frame["gpus"].clip(lower=1)
    parts = {
        "gpu_hours": frame["allocated_seconds"],
        "productive_gpu_hours": frame["productive_seconds"],
        "checkpoint_gpu_hours": frame["checkpoint_seconds"],
        **{f"lost_{reason}_gpu_hours": frame[f"lost_{reason}_seconds"] for reason in LOST_REASONS},
    }
    return pd.DataFrame({name: seconds * gpus / 3600.0 for name, seconds in parts.items()}, index=frame.index)


def summary(frame: pd.DataFrame, by: str = "lane") -> pd.DataFrame:
    """Goodput, time and cost per `by` (run, project, provider, lane or cause: why attempts
    ended), costliest first."""
    if by not in GROUPINGS:
        raise ValueError(f"cannot report by {by!r}; choose one of {', '.join(GROUPINGS)}")
    key = GROUPINGS[by]
    columns = [
        by, "attempts", "preempted", "failed", "gpu_hours", "productive_gpu_hours", "checkpoint_gpu_hours",
        *(f"lost_{r}_gpu_hours" for r in LOST_REASONS), "goodput", "gpu_cost_usd", "token_cost_usd", "cost_usd",
        "completed_tasks", "cost_per_completed_task",
    ]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    work = pd.concat([frame[[key, "outcome", "gpu_cost_usd", "cost_usd", "task_id"]], _weighted(frame)], axis=1)
    if key == "cause":
        work["cause"] = work["cause"].replace("", "none (succeeded)")
    work["token_cost_usd"] = frame["token_cost_usd"].astype(float).fillna(0.0)
    work["completed"] = frame["task_id"].where(frame["completed_task"])
    grouped = work.groupby(key, sort=False)
    table = grouped.agg(
        attempts=("outcome", "size"),
        preempted=("outcome", lambda s: int((s == "preempted").sum())),
        failed=("outcome", lambda s: int(s.isin(["failed", "orphaned"]).sum())),
        **{name: (name, "sum") for name in _weighted(frame.head(0)).columns},
        gpu_cost_usd=("gpu_cost_usd", "sum"),
        token_cost_usd=("token_cost_usd", "sum"),
        cost_usd=("cost_usd", "sum"),
        completed_tasks=("completed", "nunique"),
    )
    table["goodput"] = table["productive_gpu_hours"] / table["gpu_hours"].where(table["gpu_hours"] > 0)
    table["cost_per_completed_task"] = table["cost_usd"] / table["completed_tasks"].where(table["completed_tasks"] > 0)
    table = table.reset_index().rename(columns={key: by})
    return table[columns].sort_values(["cost_usd", by], ascending=[False, True], kind="stable").reset_index(drop=True)


def totals(frame: pd.DataFrame) -> dict[str, float]:
    """The whole ledger in one line: cost, GPU-hours, goodput, tasks completed and cost per task."""
    weighted = _weighted(frame)
    gpu_hours = float(weighted["gpu_hours"].sum())
    cost = float(frame["cost_usd"].sum())
    tasks = int(frame.loc[frame["completed_task"], "task_id"].nunique()) if len(frame) else 0
    return {
        "attempts": int(len(frame)),
        "gpu_hours": gpu_hours,
        "goodput": float(weighted["productive_gpu_hours"].sum() / gpu_hours) if gpu_hours > 0 else float("nan"),
        "cost_usd": cost,
        "completed_tasks": tasks,
        "cost_per_completed_task": cost / tasks if tasks else float("nan"),
        **{f"lost_{r}_gpu_hours": float(weighted[f"lost_{r}_gpu_hours"].sum()) for r in LOST_REASONS},
    }


def cost_per_completed_task(frame: pd.DataFrame, by: str | None = None) -> pd.Series | float:
    """What one completed task cost, overall or per run, project, provider or lane."""
    if by is None:
        return totals(frame)["cost_per_completed_task"]
    return summary(frame, by).set_index(by)["cost_per_completed_task"]


def cost_breakdown(frame: pd.DataFrame, rows: str = "provider", columns: str = "purchasing") -> pd.DataFrame:
    """Cost in dollars, `rows` × `columns` (default provider × purchasing mode)."""
    if frame.empty:
        return pd.DataFrame()
    table = frame.pivot_table(index=rows, columns=columns, values="cost_usd", aggfunc="sum", fill_value=0.0)
    if columns == "purchasing":
        table = table[[c for c in _PURCHASING_ORDER if c in table.columns] + sorted(set(table.columns) - set(_PURCHASING_ORDER))]
    return table


def goodput_over_time(frame: pd.DataFrame, freq: str = "D", by: str = "lane") -> pd.DataFrame:
    """Goodput per period (by when attempts started) and per `by`: one column per lane by default."""
    if frame.empty:
        return pd.DataFrame()
    weighted = _weighted(frame)
    period = frame["started_at"].dt.tz_convert("UTC").dt.tz_localize(None).dt.to_period(freq).dt.start_time
    work = pd.DataFrame({"period": period, by: frame[GROUPINGS.get(by, by)], **weighted[["gpu_hours", "productive_gpu_hours"]]})
    sums = work.groupby(["period", by]).sum()
    return (sums["productive_gpu_hours"] / sums["gpu_hours"].where(sums["gpu_hours"] > 0)).unstack(by).sort_index()


# Figures ----------------------------------------------------------------------------------


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return buffer.getvalue()


def _empty(figure: Figure, title: str) -> bytes:
    axes = figure.add_subplot()
    axes.set_title(title)
    axes.text(0.5, 0.5, "no attempts in the ledger yet", ha="center", va="center", transform=axes.transAxes)
    axes.set_axis_off()
    return _png(figure)


def cost_breakdown_png(frame: pd.DataFrame) -> bytes:
    """Two bar charts: cost by provider stacked by purchasing mode, and cost by lane stacked by outcome."""
    figure = Figure(figsize=(10, 4))
    if frame.empty:
        return _empty(figure, "Cost breakdown")
    for axes, (rows, columns, title) in zip(
        figure.subplots(1, 2),
        [("provider", "purchasing", "Cost by provider and purchasing mode"), ("lane", "outcome", "Cost by lane and attempt outcome")],
        strict=True,
    ):
        table = cost_breakdown(frame, rows, columns)
        bottom = np.zeros(len(table))
        for column in table.columns:
            colour = _OUTCOME_COLOURS.get(str(column)) if columns == "outcome" else None
            axes.bar(table.index.astype(str), table[column].to_numpy(), bottom=bottom, label=str(column), color=colour)
            bottom += table[column].to_numpy()
        for x, total in enumerate(bottom):
            axes.annotate(f"${total:,.2f}", (x, total), ha="center", va="bottom", fontsize=8)
        axes.set_title(title, fontsize=10)
        axes.set_ylabel("cost (USD)")
        axes.legend(fontsize=8, title=columns, title_fontsize=8)
    return _png(figure)


def goodput_over_time_png(frame: pd.DataFrame, freq: str = "D") -> bytes:
    """Goodput per day (or `freq`) for each lane, with the whole ledger's goodput as a dashed line."""
    figure = Figure(figsize=(8, 3.5))
    if frame.empty:
        return _empty(figure, "Goodput over time")
    table = goodput_over_time(frame, freq)
    axes = figure.add_subplot()
    for lane in table.columns:
        axes.plot(table.index, table[lane].to_numpy(), marker="o", label=str(lane))
    overall = totals(frame)["goodput"]
    axes.axhline(overall, linestyle="--", color="grey", label=f"all lanes: {overall:.0%}")
    axes.set_ylim(0, 1.05)
    axes.set_ylabel("goodput (productive ÷ allocated GPU time)", fontsize=8)
    axes.set_title("Goodput over time, by lane", fontsize=10)
    axes.legend(fontsize=8)
    figure.autofmt_xdate()
    return _png(figure)


# Tables as markdown -----------------------------------------------------------------------


def _cell(value) -> str:
    if isinstance(value, float):
        return "—" if np.isnan(value) else f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def summary_markdown(table: pd.DataFrame) -> str:
    """A `summary()` table as markdown, goodput as a percentage and money in dollars."""
    shown = table.copy()
    if "goodput" in shown:
        shown["goodput"] = [("—" if pd.isna(g) else f"{g:.0%}") for g in shown["goodput"]]
    for money in ("gpu_cost_usd", "token_cost_usd", "cost_usd", "cost_per_completed_task"):
        if money in shown:
            shown[money] = [("—" if pd.isna(v) else f"${v:,.2f}") for v in shown[money]]
    header = "| " + " | ".join(str(c) for c in shown.columns) + " |"
    rule = "|" + "---|" * len(shown.columns)
    rows = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in shown.itertuples(index=False)]
    return "\n".join([header, rule, *rows]) if rows else header + "\n" + rule + "\n| " + "no attempts yet |"
