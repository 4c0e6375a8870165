"""`sinewgrid report` and `sinewgrid plan`: what GPU work cost, and what it will cost.

`report` reads the attempt ledger under the storage root and prints goodput, GPU-hours, tokens and
cost per run, project, provider, lane, tenant, cause, task or model; with `--budgets` each budget's
spending against its limits, with `--commit` how much token spend to commit to per provider; `plan` answers a job file with a capacity plan (where each
step runs, its failover order, the cost, and why). Both print a table, or JSON with `--json`.
Registered on the `sinewgrid` app in `sinewgrid.cli`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from control_plane.settings import settings, storage_root

console = Console(width=None if sys.stdout.isatty() else 150)


def _storage():
    from workload_runtime.storage import Storage

    return Storage.at(storage_root())


def _clean(value):
    return None if isinstance(value, float) and value != value else value  # NaN is not JSON


def _money(value: float) -> str:
    return "—" if value != value else f"${value:,.2f}"


def _count(n: float) -> str:
    """Tokens, compactly: 950, 12.3k, 4.56M."""
    return f"{n:,.0f}" if n < 1e4 else f"{n / 1e3:,.1f}k" if n < 1e6 else f"{n / 1e6:,.2f}M"


def report(
    by: str = typer.Option(
        "lane", "--by",
        help="Group the ledger by run, project, provider, lane, tenant, cause (why attempts ended: notice, lost-node, ...), "
        "task (a GPU step, or a model task such as label-failure@v1), model, pool or purchasing.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the table and totals as JSON instead."),
    budgets: bool = typer.Option(False, "--budgets", help="Instead: each budget's spending against its limits, and its status (ok, warn, over)."),
    commit: bool = typer.Option(False, "--commit", help="Instead: how much pay-as-you-go token spend to commit to per day, per model provider."),
) -> None:
    """Goodput, GPU-hours, tokens and cost from the attempt ledger, per run, project, provider, lane, tenant, task or model."""
    import json

    from control_plane.accounting import reports
    from control_plane.accounting.ledger import Ledger, LedgerConfigError

    if by not in reports.GROUPINGS:
        raise typer.BadParameter(f"use --by {', '.join(reports.GROUPINGS)}", param_hint="--by")
    try:
        ledger = Ledger.for_storage(_storage())
        frame = ledger.frame()
    except LedgerConfigError as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(2) from exc
    if budgets or commit:
        found = {}
        if budgets:
            found["budgets"] = _budgets(ledger, as_json)
        if commit:
            found["commit"] = _commit(frame, as_json)
        if as_json:
            print(json.dumps(found, indent=2, default=str))
        return
    table, totals = reports.summary(frame, by), reports.totals(frame)
    if as_json:
        rows = [{k: _clean(v) for k, v in row.items()} for row in table.to_dict("records")]
        print(json.dumps({"by": by, "rows": rows, "totals": {k: _clean(v) for k, v in totals.items()}}, indent=2, default=str))
        return
    out = Table(
        title=f"Goodput, GPU-hours, tokens and cost by {by} (goodput: productive ÷ allocated GPU time)",
        caption="attempts (preempted/failed); lost GPU-h: preemption/failure/queueing/rework; cached: input tokens from the "
        "provider's prompt cache / calls answered from the gateway's cache; cost: GPU and tokens (of it tokens)",
    )
    columns = (by, "attempts", "GPU-h", "goodput", "lost GPU-h", "tokens in/out", "cached/hits", "cost (tokens)", "tasks done", "per task")
    for column in columns:
        out.add_column(column, justify="left" if column == by else "right", no_wrap=True)
    lost = lambda r: "/".join(f"{r[f'lost_{reason}_gpu_hours']:.2f}" for reason in ("preemption", "failure", "queueing", "rework"))  # noqa: E731
    goodput = lambda g: "—" if g != g else f"{g:.0%}"  # noqa: E731
    for row in table.itertuples(index=False):
        r = row._asdict()
        out.add_row(
            escape(str(r[by])), f"{r['attempts']} ({r['preempted']}/{r['failed']})", f"{r['gpu_hours']:.3f}", goodput(r["goodput"]), lost(r),
            f"{_count(r['tokens_in'])}/{_count(r['tokens_out'])}", f"{_count(r['tokens_cached'])}/{r['cache_hits']}",
            f"{_money(r['cost_usd'])} ({_money(r['token_cost_usd'])})", str(r["completed_tasks"]), _money(r["cost_per_completed_task"]),
        )
    if len(table):
        out.add_row(
            "total", f"{totals['attempts']} ({int(table['preempted'].sum())}/{int(table['failed'].sum())})", f"{totals['gpu_hours']:.3f}",
            goodput(totals["goodput"]), lost(totals), f"{_count(totals['tokens_in'])}/{_count(totals['tokens_out'])}",
            f"{_count(totals['tokens_cached'])}/{totals['cache_hits']}", f"{_money(totals['cost_usd'])} ({_money(totals['token_cost_usd'])})",
            str(totals["completed_tasks"]), _money(totals["cost_per_completed_task"]), style="bold",
        )
    console.print(out)
    if not len(table):
        console.print("No attempts in the ledger yet: run a step (e.g. `sinewgrid demo`) first.")


def _budgets(ledger, as_json: bool) -> list[dict]:
    """Each budget's spending against its limits (`report --budgets`)."""
    from control_plane.accounting.budgets import check, counts_words
    from control_plane.catalog.budgets import BudgetCatalogError, load_budgets

    try:
        catalog = load_budgets()
    except BudgetCatalogError as exc:
        Console(stderr=True, width=console.width).print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(2) from None
    statuses = check(ledger, catalog)
    if as_json:
        return [s.to_dict() for s in statuses]
    out = Table(title=f"Budgets ({catalog.file})")
    for column in ("budget", "applies to", "period", "limit", "spent", "of limit", "warn at", "status"):
        out.add_column(column, justify="right" if column in ("spent", "limit", "of limit", "warn at") else "left")
    colour = {"ok": "green", "warn": "yellow", "over": "red"}
    for s in statuses:
        for kind, limit in s.budget.limits.items():
            spent = s.spent.of(kind)
            amount = _money if kind == "usd" else (lambda v: f"{v:,.2f} GPU-h") if kind == "gpu_hours" else (lambda v: f"{_count(v)} tokens")
            share = f"{spent / limit:.0%}" if limit > 0 else "limit 0"
            out.add_row(escape(s.budget.id), escape(s.budget.label), s.period_key, amount(limit), amount(spent), share,
                        f"{s.budget.warn_at:.0%}", f"[{colour[s.status]}]{s.status}[/]")
    console.print(out)
    for s in statuses:
        if s.status != "ok":
            console.print(f"[{colour[s.status]}]{escape(s.message)}[/]")
    console.print(f"{len(statuses)} budget(s): {counts_words(statuses)}. Limits live in {escape(catalog.file)} (SINEWGRID_BUDGETS names another file).")
    return []


def _commit_discounts() -> tuple[dict[str, float], str]:
    """Each provider's `commit_discount` from the model catalog, and where they came from."""
    from control_plane.accounting.reports import DEFAULT_COMMIT_DISCOUNT
    from control_plane.catalog.models import ModelCatalogError, load_models

    try:
        catalog = load_models()
    except ModelCatalogError as exc:
        return {}, f"the model catalog could not be read ({exc}); every provider at the default {DEFAULT_COMMIT_DISCOUNT:.0%}"
    found = {name: provider.commit_discount for name, provider in catalog.providers.items()}
    return found, f"`commit_discount` of each provider in {catalog.file}; {DEFAULT_COMMIT_DISCOUNT:.0%} for providers it does not list"


def _commit(frame, as_json: bool) -> list[dict]:
    """How much token spend to commit to per provider (`report --commit`)."""
    from control_plane.accounting import reports

    discounts, source = _commit_discounts()
    table = reports.commit_recommendation(frame, discounts)
    if as_json:
        return [{**{k: _clean(v) for k, v in row.items()}, "discounts_from": source} for row in table.to_dict("records")]
    out = Table(title="Committed token spend per provider (newsvendor: commit at the discount-quantile of daily pay-as-you-go spend)")
    for column in ("provider", "days", "mean/day", "median/day", "p90/day", "discount", "commit/day", "saving/month", "note"):
        out.add_column(column, justify="left" if column in ("provider", "note") else "right")
    for r in table.to_dict("records"):
        note = f"provisional: {r['days']} day(s) of data, fewer than {reports.FIRM_AFTER_DAYS}" if r["provisional"] else ""
        out.add_row(escape(r["provider"]), str(r["days"]), _money(r["mean_daily_usd"]), _money(r["p50_daily_usd"]), _money(r["p90_daily_usd"]),
                    f"{r['discount']:.0%}", _money(r["commit_per_day_usd"]), _money(r["expected_saving_per_month_usd"]), note)
    console.print(out)
    if not len(table):
        console.print("No pay-as-you-go model tasks in the ledger yet: nothing to commit to.")
    console.print(
        "A commitment of c a day costs (1 - discount)·c used or not; spend above it is paid as you go. The expected cost is lowest at "
        "the discount-quantile of daily spend. Discounts: " + escape(source) + "."
    )
    return []


def plan(
    job_file: Path = typer.Argument(..., help="The job file (JOB.yaml): steps, datasets, schedule, tenant."),
    pools: list[Path] = typer.Option(None, "--pools", help="Pool catalog file or folder (repeatable); default SINEWGRID_POOLS or the packaged one."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON, for machines (streamed one step at a time)."),
    evidence: bool = typer.Option(True, help="Print, per step, why each pool was picked or refused (in the JSON too)."),
    time_budget: float = typer.Option(
        10.0, "--time-budget", min=0.1, help="Seconds the exact planner (HiGHS) may take before the greedy plan improved by local search is used.",
    ),
) -> None:
    """Answer a job file with a capacity plan: where each step runs, its failover order, the cost, and why."""
    from control_plane.catalog.pools import PoolCatalogError
    from control_plane.placement.job_files import JobFileError, plan_job_file
    from control_plane.placement.planner import InfeasiblePlanError

    try:
        result = plan_job_file(job_file, pools or [settings().pools or None], time_budget_s=time_budget)
    except (JobFileError, PoolCatalogError, InfeasiblePlanError) as exc:
        if as_json and isinstance(exc, InfeasiblePlanError):
            _write_refusal(job_file, exc)
        Console(stderr=True, width=console.width).print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(2) from None
    if as_json:
        _write_json(result, evidence, sys.stdout)
        return
    _print_plan(result, evidence)


def _write_json(result, evidence: bool, out) -> None:
    """The plan as one JSON document, written step by step as each row is worked out (never one giant string)."""
    import json

    dump = lambda v: json.dumps(v, default=str)  # noqa: E731
    out.write(f'{{"job": {dump(result.name)}, "catalogs": {dump(result.catalog.files)}, "totals": {dump(result.totals())}, "steps": [\n')
    for i, row in enumerate(result.iter_rows()):
        if evidence:
            row = {**row, "evidence": result.placement(i).evidence()}
        out.write(("" if i == 0 else ",\n") + dump(row))
    out.write("\n]}\n")


def _write_refusal(job_file: Path, exc) -> None:
    """A refused job as JSON: why, and each step no plan could place with its reasons."""
    import json

    doc = {"job_file": str(job_file), "refused": True, "reason": str(exc).splitlines()[0], "unplaced": exc.unplaced}
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")


def _print_plan(result, evidence: bool) -> None:
    totals = result.totals()
    table = Table(title=f"Capacity plan: {result.name}")
    for column in ("step", "pool", "mode", "start", "GPUs", "GPU-h", "rework", "ckpt every", "egress", "cost", "failover order"):
        numeric = column in ("GPUs", "GPU-h", "rework", "egress", "cost")
        table.add_column(column, justify="right" if numeric else "left", no_wrap=column in ("step", "pool", "cost"),
                         min_width=28 if column == "failover order" else None)
    for row in result.rows():
        every = row["checkpoint_interval_seconds"]
        table.add_row(
            row["step"], row["pool"], row["purchasing"], row["start"].removesuffix(" UTC"), str(row["gpus"]),
            f"{row['gpu_hours']:,.1f}", f"{row['rework_fraction']:.1%}", f"{every / 60:,.0f} min" if every else "—",
            f"${row['egress_usd']:,.2f}", f"${row['cost_usd']:,.2f}", ", ".join(row["failover"]) or "none",
        )
    table.add_row("total", "", "", "", "", f"{totals['gpu_hours']:,.1f}", "", "", f"${totals['egress_usd']:,.2f}",
                  f"${totals['cost_usd']:,.2f}", "", style="bold")
    console.print(table)
    modes = ", ".join(f"{mode} ${cost:,.2f}" for mode, cost in totals["cost_by_purchasing"].items() if cost)
    budget = f" of budget ${totals['budget_usd']:,.2f}" if totals["budget_usd"] is not None else ""
    console.print(f"total ${totals['cost_usd']:,.2f}{budget} ({modes}); commitments already paid cover "
                  f"{totals['committed_gpu_hours_used']:,.1f} GPU-h")
    if totals["spare_usd"]:
        spares = ", ".join(f"{r['step']} on {r['pool']} ${r['spare_usd']:,.2f}" for r in result.rows() if r["spare_usd"])
        console.print(escape(f"of which standby spare nodes held for gangs: ${totals['spare_usd']:,.2f} ({spares})"))
    if totals["prices_illustrative"]:
        console.print("[yellow]Prices in this catalog are ILLUSTRATIVE, not quotes.[/]")
    console.print(f"planned by {escape(result.method.words())}; lower bound ${totals['lower_bound_usd'] or 0:,.2f}")
    console.print(f"catalogs: {', '.join(result.catalog.files)}")
    if not evidence:
        return
    for i, step in enumerate(result.steps):
        placement = result.placement(i)
        console.print(f"\n[bold]{escape(step.name)}[/]")
        for v in sorted(placement.verdicts, key=lambda v: (v.rank is None, v.rank or 0, v.pool)):
            mark = f"[green]{v.rank}[/]" if v.rank else "[red]refused[/]"
            console.print(f"  {mark} {escape(v.pool)}: {escape('; '.join(v.reasons))}")
