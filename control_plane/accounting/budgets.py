"""What each budget has spent, whether it is ok, warning or over, and refusing work past it.

A budget (`control_plane.catalog.budgets`) limits a project's or a tenant's dollars, GPU-hours
and tokens over a period. Its spending is read from the ledger, which books every GPU attempt and
every model task: dollars are `cost_usd` (GPU cost plus token cost), GPU-hours `gpu_hours`, tokens
`tokens_in + tokens_out` (missing counts are 0).

- `evaluate(frame, budgets)` / `check(storage)`: every budget's `BudgetStatus` (spent, limits,
  `ok` / `warn` / `over`, a one-line `message`), for the alerts sensor, the UI and the CLI.
- `enforce(storage, project=, tenant=, adding=)`: called before new work starts (each GPU step,
  each model call). One aggregate query over the ledger, narrowed to the budgets' periods; raises
  `BudgetExceeded` when a budget that applies is at its limit or the work would pass it.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import sqlalchemy as sa

from control_plane.accounting.ledger import Ledger, attempts
from control_plane.catalog.budgets import LIMITS, Budget, Budgets, Period, load_budgets
from workload_runtime.storage import Storage

STATUSES = ("ok", "warn", "over")
_UNITS = {"usd": "USD", "gpu_hours": "GPU-h", "tokens": "tokens"}


@dataclass(frozen=True)
class Spend:
    """Dollars (GPU cost plus token cost), GPU-hours and tokens (in plus out)."""

    usd: float = 0.0
    gpu_hours: float = 0.0
    tokens: float = 0.0

    def __add__(self, other: Spend) -> Spend:
        return Spend(self.usd + other.usd, self.gpu_hours + other.gpu_hours, self.tokens + other.tokens)

    def of(self, limit: str) -> float:
        return float(getattr(self, limit))


def period_bounds(period: Period, now: dt.datetime) -> tuple[dt.datetime | None, dt.datetime | None]:
    """The start and end (exclusive) of the period that holds `now`, in UTC; (None, None) for `all`."""
    if period is Period.all:
        return None, None
    now = now.astimezone(dt.UTC)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start, end


def _amount(limit: str, value: float) -> str:
    if limit == "usd":
        return f"${value:,.2f}"
    if limit == "gpu_hours":
        return f"{value:,.2f} GPU-h"
    return f"{value:,.0f} tokens"


def _percent(fraction: float) -> str:
    return f"{fraction:.0%}" if math.isfinite(fraction) else "limit 0"


@dataclass(frozen=True)
class BudgetStatus:
    """One budget in its current period: what it spent of each limit, and its status."""

    budget: Budget
    spent: Spend
    start: dt.datetime | None  # the period, UTC; None: all time
    end: dt.datetime | None
    file: str = ""  # the budgets file it came from

    @property
    def period_key(self) -> str:
        """`2026-03` for a month, `all` for all time: with the budget's id, what an alert is sent once for."""
        return self.start.strftime("%Y-%m") if self.start is not None else "all"

    @property
    def key(self) -> str:
        return f"{self.budget.id}@{self.period_key}"

    @property
    def fractions(self) -> dict[str, float]:
        """Spent over limit, per limit (inf: a limit of 0)."""
        return {k: (self.spent.of(k) / v if v > 0 else math.inf) for k, v in self.budget.limits.items()}

    @property
    def status(self) -> str:
        fractions = self.fractions.values()
        if any(f >= 1 for f in fractions):
            return "over"
        if any(f >= self.budget.warn_at for f in fractions):
            return "warn"
        return "ok"

    @property
    def period_words(self) -> str:
        return "this month" if self.budget.period is Period.month else "in all"

    def spent_words(self) -> str:
        """`$412.00 of $500.00 this month (82%)`, one part per limit."""
        parts = [f"{_amount(k, self.spent.of(k))} of {_amount(k, v)}" for k, v in self.budget.limits.items()]
        fractions = list(self.fractions.values())
        if len(parts) == 1:
            return f"{parts[0]} {self.period_words} ({_percent(fractions[0])})"
        return ", ".join(f"{p} ({_percent(f)})" for p, f in zip(parts, fractions, strict=True)) + f" {self.period_words}"

    @property
    def message(self) -> str:
        """E.g. `project robotics: $412.00 of $500.00 this month (82%), warning at 80%`."""
        tail = "over its limit" if self.status == "over" else f"warning at {self.budget.warn_at:.0%}"
        return f"{self.budget.label}: {self.spent_words()}, {tail}"

    def to_dict(self) -> dict[str, Any]:
        """For JSON: the webhook's body, `sinewgrid report --budgets --json`."""
        return {
            "budget": self.budget.id,
            "scope": self.budget.scope.value,
            "name": self.budget.name,
            "period": self.budget.period.value,
            "period_key": self.period_key,
            "status": self.status,
            "message": self.message,
            "spent": {k: self.spent.of(k) for k in LIMITS},
            "limits": self.budget.limits,
            "warn_at": self.budget.warn_at,
            "budgets_file": self.file,
        }


class BudgetExceeded(RuntimeError):
    """New work of a project or tenant whose budget is at its limit (or would pass it)."""

    def __init__(self, message: str, statuses: list[BudgetStatus], adding: Spend):
        super().__init__(message)
        self.statuses, self.adding = statuses, adding

    def metadata(self) -> dict[str, Any]:
        """Plain values for a Dagster failure's metadata."""
        first = self.statuses[0]
        return {
            "budget": first.budget.id,
            "applies_to": first.budget.label,
            "period": first.period_key,
            **{f"spent_{k}": round(first.spent.of(k), 4) for k in first.budget.limits},
            **{f"limit_{k}": v for k, v in first.budget.limits.items()},
            "budgets_file": first.file,
        }


def _filter(frame: pd.DataFrame, budget: Budget, start: dt.datetime | None, end: dt.datetime | None) -> pd.DataFrame:
    rows = frame[frame[budget.scope.value].fillna("").astype(str) == budget.name]
    if start is not None:
        when = pd.to_datetime(rows["started_at"], utc=True)
        rows = rows[(when >= pd.Timestamp(start)) & (when < pd.Timestamp(end))]
    return rows


def spent(frame: pd.DataFrame, budget: Budget, now: dt.datetime | None = None) -> Spend:
    """What `budget` spent in its period holding `now`, from a ledger frame (`Ledger.frame()`)."""
    start, end = period_bounds(budget.period, now or dt.datetime.now(dt.UTC))
    rows = _filter(frame, budget, start, end)
    number = lambda column: pd.to_numeric(rows[column], errors="coerce").fillna(0.0)  # noqa: E731
    return Spend(
        usd=float(number("cost_usd").sum()),
        gpu_hours=float(number("gpu_hours").sum()),
        tokens=float((number("tokens_in") + number("tokens_out")).sum()),
    )


def evaluate(frame: pd.DataFrame, budgets: Budgets | Iterable[Budget], now: dt.datetime | None = None) -> list[BudgetStatus]:
    """Every budget's status from a ledger frame, in the budgets file's order."""
    now = now or dt.datetime.now(dt.UTC)
    file = getattr(budgets, "file", "")
    items = budgets.values() if isinstance(budgets, dict) else budgets
    return [BudgetStatus(b, spent(frame, b, now), *period_bounds(b.period, now), file=file) for b in items]


def _earliest(budgets: Iterable[Budget], now: dt.datetime) -> dt.datetime | None:
    starts = [period_bounds(b.period, now)[0] for b in budgets]
    return None if any(s is None for s in starts) or not starts else min(starts)


def _ledger(storage: Storage | Ledger | str) -> Ledger:
    return storage if isinstance(storage, Ledger) else Ledger.for_storage(storage)


def check(storage: Storage | Ledger | str, budgets: Budgets | None = None, now: dt.datetime | None = None) -> list[BudgetStatus]:
    """Every budget's status, reading the ledger once (only the periods the budgets cover)."""
    budgets = budgets if budgets is not None else load_budgets()
    now = now or dt.datetime.now(dt.UTC)
    if not budgets:
        return []
    return evaluate(_ledger(storage).frame(since=_earliest(budgets.values(), now)), budgets, now)


def _spent_in_sql(ledger: Ledger, budgets: list[Budget], now: dt.datetime) -> list[Spend]:
    """What each of `budgets` spent, in one aggregate query: no rows leave the database."""
    t = attempts
    tokens = sa.func.coalesce(t.c.tokens_in, 0) + sa.func.coalesce(t.c.tokens_out, 0)
    conditions, columns = [], []
    for i, b in enumerate(budgets):
        condition = t.c[b.scope.value] == b.name
        start, end = period_bounds(b.period, now)
        if start is not None:
            condition = sa.and_(condition, t.c.started_at >= start, t.c.started_at < end)
        conditions.append(condition)
        for name, value in (("usd", t.c.cost_usd), ("gpu_hours", t.c.gpu_hours), ("tokens", tokens)):
            columns.append(sa.func.coalesce(sa.func.sum(sa.case((condition, value), else_=0)), 0).label(f"{name}_{i}"))
    with ledger.engine.connect() as conn:
        row = conn.execute(sa.select(*columns).where(sa.or_(*conditions))).one()._mapping
    return [Spend(float(row[f"usd_{i}"]), float(row[f"gpu_hours_{i}"]), float(row[f"tokens_{i}"])) for i in range(len(budgets))]


def enforce(
    storage: Storage | Ledger | str,
    *,
    project: str = "",
    tenant: str = "",
    adding: Spend | None = None,
    budgets: Budgets | None = None,
    now: dt.datetime | None = None,
) -> list[BudgetStatus]:
    """Refuse new work of `project` for `tenant` when a budget that applies is at its limit, or
    when `adding` (what the work is expected to cost, if known) would take it past the limit.

    Returns the statuses of the budgets that apply (warnings included) when the work may go on;
    raises `BudgetExceeded` naming each budget, its spending against its limit and how to go on.
    Without budgets for `project` or `tenant` the ledger is not read.
    """
    budgets = budgets if budgets is not None else load_budgets()
    applying = budgets.applying_to(project=project, tenant=tenant)
    if not applying:
        return []
    now = now or dt.datetime.now(dt.UTC)
    adding = adding or Spend()
    spends = _spent_in_sql(_ledger(storage), applying, now)
    statuses = [BudgetStatus(b, s, *period_bounds(b.period, now), file=budgets.file) for b, s in zip(applying, spends, strict=True)]
    refused = [s for s in statuses if _refuses(s, adding)]
    if refused:
        raise BudgetExceeded(_refusal(refused, adding), refused, adding)
    return statuses


def _refuses(status: BudgetStatus, adding: Spend) -> bool:
    return any(status.spent.of(k) >= v or status.spent.of(k) + adding.of(k) > v for k, v in status.budget.limits.items())


def _refusal(refused: list[BudgetStatus], adding: Spend) -> str:
    lines = []
    for s in refused:
        line = f"budget `{s.budget.id}` of {s.budget.label}: {s.spent_words()}"
        if any(s.spent.of(k) >= v for k, v in s.budget.limits.items()):
            line += ", at its limit" if all(s.spent.of(k) <= v for k, v in s.budget.limits.items()) else ", past its limit"
        passing = [k for k, v in s.budget.limits.items() if s.spent.of(k) < v and s.spent.of(k) + adding.of(k) > v]
        if passing:
            line += "; the new work (about " + ", ".join(_amount(k, adding.of(k)) for k in passing) + ") would pass it"
        lines.append(line)
    first = refused[0]
    over = ", ".join(f"`{k}`" for k, v in first.budget.limits.items() if first.spent.of(k) + adding.of(k) >= v) or "its limits"
    ways = [f"raise {over} of budget `{first.budget.id}` in {first.file or 'the budgets file'}",
            "or point SINEWGRID_BUDGETS at a budgets file with a higher limit"]
    if first.end is not None:
        ways.append(f"or wait for next month (the budget starts again on {first.end:%Y-%m-%d} 00:00 UTC)")
    return (
        f"Budget exceeded, new work refused for {' and '.join(dict.fromkeys(s.budget.label for s in refused))}:\n  "
        + "\n  ".join(lines)
        + "\nTo go on: " + ", ".join(ways) + "."
    )


def budgets_markdown(statuses: list[BudgetStatus]) -> str:
    """Every budget's spending against its limits as a markdown table, for the UI."""
    lines = ["| budget | applies to | period | spent | limit | used | warn at | status |", "|---|---|---|---|---|---|---|---|"]
    for s in statuses:
        for k, v in s.budget.limits.items():
            mark = {"ok": "ok", "warn": "⚠ warn", "over": "⛔ over"}[s.status]
            lines.append(
                f"| `{s.budget.id}` | {s.budget.label} | {s.period_key} | {_amount(k, s.spent.of(k))} | {_amount(k, v)} | "
                f"{_percent(s.fractions[k])} | {s.budget.warn_at:.0%} | {mark} |"
            )
    if not statuses:
        lines.append("| no budgets | | | | | | | |")
    return "\n".join(lines)


def counts_words(statuses: list[BudgetStatus]) -> str:
    """`4 ok, 1 warn, 0 over`."""
    return ", ".join(f"{sum(1 for s in statuses if s.status == status)} {status}" for status in STATUSES)
