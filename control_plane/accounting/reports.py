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
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from control_plane.accounting.records import LOST_REASONS

# `task`: a GPU step's name, or a model task's name and version (`label-failure@v1`); `model`: the
# model that answered a gateway row (GPU rows have none).
GROUPINGS = {
    "run": "run_id", "project": "project", "provider": "provider", "lane": "lane", "tenant": "tenant", "cause": "cause",
    "task": "step", "model": "model", "pool": "pool", "purchasing": "purchasing",
}
# Tokens bought from model providers, and calls the gateway answered from its own cache.
TOKEN_COLUMNS = ("tokens_in", "tokens_out", "tokens_cached", "cache_hits")
# Ledger rows of the model gateway: one per completed model task, no GPUs.
GATEWAY_BACKEND = "model-gateway"
# A group without a value: GPU steps have no model, a succeeded attempt no cause.
_NO_VALUE = {"cause": "none (succeeded)", "model": "none (GPU steps)"}
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


def _tokens(frame: pd.DataFrame) -> pd.DataFrame:
    """The token counts of each row, missing counts as 0 (GPU rows, ledgers older than a column)."""
    return pd.DataFrame(
        {c: pd.to_numeric(frame[c], errors="coerce").fillna(0).astype("int64") if c in frame else 0 for c in TOKEN_COLUMNS}, index=frame.index
    )


def _group_values(frame: pd.DataFrame, by: str) -> pd.Series:
    """The value each row is grouped under for `by`: its column, with a name for "none" where a
    row has no value (`_NO_VALUE`); a row without a tenant (booked before the column) is its lane's,
    which is where such ledgers kept the step's tenant."""
    values = frame[GROUPINGS[by]]
    if by == "tenant":
        lane = frame["lane"].fillna("").astype(str)
        values = values.fillna("").astype(str)
        return values.where(values != "", lane)
    if by in _NO_VALUE:
        return values.fillna("").replace("", _NO_VALUE[by])
    return values


def summary(frame: pd.DataFrame, by: str | Sequence[str] = "lane") -> pd.DataFrame:
    """Goodput, time, tokens and cost per `by` (run, project, provider, lane, tenant, cause: why
    attempts ended, task, model, pool or purchasing; or several of them, e.g. `["task", "pool",
    "purchasing"]`, one row per combination), costliest first. GPU-hours and tokens sit side by
    side: a model task books tokens and no GPU time, a GPU step the reverse."""
    keys = [by] if isinstance(by, str) else list(by)
    unknown = [key for key in keys if key not in GROUPINGS]
    if unknown or not keys:
        raise ValueError(f"cannot report by {unknown[0] if unknown else by!r}; choose one of {', '.join(GROUPINGS)}")
    columns = [
        *keys, "attempts", "preempted", "failed", "gpu_hours", "productive_gpu_hours", "checkpoint_gpu_hours",
        *(f"lost_{r}_gpu_hours" for r in LOST_REASONS), "goodput", *TOKEN_COLUMNS, "gpu_cost_usd", "token_cost_usd", "cost_usd",
        "completed_tasks", "cost_per_completed_task",
    ]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    work = pd.concat([frame[["outcome", "gpu_cost_usd", "cost_usd"]], _weighted(frame), _tokens(frame)], axis=1)
    for key in keys:
        work[key] = _group_values(frame, key)
    work["token_cost_usd"] = frame["token_cost_usd"].astype(float).fillna(0.0)
    work["completed"] = frame["task_id"].where(frame["completed_task"])
    grouped = work.groupby(keys, sort=False)
    table = grouped.agg(
        attempts=("outcome", "size"),
        preempted=("outcome", lambda s: int((s == "preempted").sum())),
        failed=("outcome", lambda s: int(s.isin(["failed", "orphaned"]).sum())),
        **{name: (name, "sum") for name in _weighted(frame.head(0)).columns},
        **{name: (name, "sum") for name in TOKEN_COLUMNS},
        gpu_cost_usd=("gpu_cost_usd", "sum"),
        token_cost_usd=("token_cost_usd", "sum"),
        cost_usd=("cost_usd", "sum"),
        completed_tasks=("completed", "nunique"),
    )
    table["goodput"] = table["productive_gpu_hours"] / table["gpu_hours"].where(table["gpu_hours"] > 0)
    table["cost_per_completed_task"] = table["cost_usd"] / table["completed_tasks"].where(table["completed_tasks"] > 0)
    table = table.reset_index()
    return table[columns].sort_values(["cost_usd", *keys], ascending=[False, *[True] * len(keys)], kind="stable").reset_index(drop=True)


def totals(frame: pd.DataFrame) -> dict[str, float]:
    """The whole ledger in one line: cost (GPU and tokens), GPU-hours, tokens, goodput, tasks
    completed and cost per task."""
    weighted = _weighted(frame)
    tokens = _tokens(frame)
    gpu_hours = float(weighted["gpu_hours"].sum())
    cost = float(frame["cost_usd"].sum())
    tasks = int(frame.loc[frame["completed_task"], "task_id"].nunique()) if len(frame) else 0
    return {
        "attempts": int(len(frame)),
        "gpu_hours": gpu_hours,
        "goodput": float(weighted["productive_gpu_hours"].sum() / gpu_hours) if gpu_hours > 0 else float("nan"),
        "cost_usd": cost,
        "gpu_cost_usd": float(frame["gpu_cost_usd"].sum()),
        "token_cost_usd": float(pd.to_numeric(frame["token_cost_usd"], errors="coerce").fillna(0.0).sum()),
        **{name: int(tokens[name].sum()) for name in TOKEN_COLUMNS},
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


# Committing to a model provider -------------------------------------------------------------

DEFAULT_COMMIT_DISCOUNT = 0.2
FIRM_AFTER_DAYS = 7  # fewer days of spending than this: the recommendation is provisional
DAYS_PER_MONTH = 30
COMMIT_COLUMNS = [
    "provider", "days", "mean_daily_usd", "p50_daily_usd", "p90_daily_usd", "discount",
    "commit_per_day_usd", "expected_saving_per_month_usd", "provisional",
]


def daily_token_spend(frame: pd.DataFrame) -> pd.DataFrame:
    """Pay-as-you-go token spend of the model gateway, USD per provider (columns) per UTC day
    (rows), from each provider's first day to the ledger's last; a day without spend is 0."""
    rows = frame[(frame["backend"] == GATEWAY_BACKEND) & (frame["purchasing"] == "pay-as-you-go")] if len(frame) else frame
    if rows.empty:
        return pd.DataFrame()
    day = pd.to_datetime(rows["started_at"], utc=True).dt.floor("D")
    cost = pd.to_numeric(rows["token_cost_usd"], errors="coerce").fillna(0.0)
    table = cost.groupby([day, rows["provider"]]).sum().unstack("provider")
    table = table.reindex(pd.date_range(table.index.min(), table.index.max(), freq="D"))
    # Before a provider's first day it was not in use (NaN); after it, a day without spend spent 0.
    return pd.DataFrame({p: table[p].fillna(0.0).where(table.index >= table[p].first_valid_index()) for p in table.columns})


def commit_recommendation(
    frame: pd.DataFrame, discounts: dict[str, float], *, default_discount: float = DEFAULT_COMMIT_DISCOUNT
) -> pd.DataFrame:
    """How much token spend to commit to per day with each model provider, from the gateway's
    pay-as-you-go rows in the ledger.

    A commitment of `c` dollars a day costs `(1 - discount) · c` whether it is used or not;
    demand above it is paid at the pay-as-you-go price. Over days of demand `D` the expected
    cost is `(1 - d) · c + E[max(D - c, 0)]`. Raising `c` by a dollar costs `1 - d` and saves a
    dollar on every day whose demand exceeds `c`, so the cost is lowest where
    `P(D > c) = 1 - d`, i.e. `P(D ≤ c) = d`: commit at the `discount`-quantile of daily demand
    (the newsvendor rule). The quantile is the empirical one (`inverted_cdf`: the smallest observed
    day with at least that share of days at or below it), which minimises the cost over the
    observed days exactly. With a 20% discount, commit what four days in five exceed.

    `discounts` maps a provider to its commitment discount (the model catalog's
    `commit_discount`); others get `default_discount`. Returns one row per provider: days of
    data, mean, median and 90th-percentile daily spend, the discount, the commitment per day and
    the expected saving per month (30 days) against paying as you go. With fewer than
    `FIRM_AFTER_DAYS` days of data the row is `provisional`.
    """
    daily = daily_token_spend(frame)
    rows = []
    for provider in daily.columns:
        demand = daily[provider].dropna().to_numpy()
        discount = float(discounts.get(provider, default_discount))
        if not 0 <= discount < 1:
            raise ValueError(f"provider {provider}: commit discount {discount} must be at least 0 and below 1 (0.2 is 20% off)")
        commit = float(np.quantile(demand, discount, method="inverted_cdf")) if discount > 0 else 0.0
        expected_cost = (1 - discount) * commit + float(np.maximum(demand - commit, 0.0).mean())
        rows.append({
            "provider": provider,
            "days": len(demand),
            "mean_daily_usd": float(demand.mean()),
            "p50_daily_usd": float(np.quantile(demand, 0.5)),
            "p90_daily_usd": float(np.quantile(demand, 0.9)),
            "discount": discount,
            "commit_per_day_usd": commit,
            "expected_saving_per_month_usd": (float(demand.mean()) - expected_cost) * DAYS_PER_MONTH,
            "provisional": len(demand) < FIRM_AFTER_DAYS,
        })
    return pd.DataFrame(rows, columns=COMMIT_COLUMNS)


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
    if isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_):
        return f"{value:,}"
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
