"""`sinewgrid report` and `sinewgrid plan`: what GPU work cost, and what it will cost.

`report` reads the attempt ledger under the storage root and prints goodput and cost per run,
project, provider, lane or cause; `plan` answers a job file with a capacity plan (where each
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

from shared_resources.settings import settings, storage_root

console = Console(width=None if sys.stdout.isatty() else 150)


def _storage():
    from shared_resources.runtime.storage import Storage

    return Storage.at(storage_root())


def report(
    by: str = typer.Option("lane", "--by", help="Group the ledger by run, project, provider, lane, tenant or cause (why attempts ended: notice, lost-node, straggler, unhealthy-node, ...)."),
    as_json: bool = typer.Option(False, "--json", help="Print the table and totals as JSON instead."),
) -> None:
    """Goodput and cost from the attempt ledger, per run, project, provider or lane."""
    import json

    from shared_resources.accounting import reports
    from shared_resources.accounting.ledger import Ledger, LedgerConfigError

    if by not in reports.GROUPINGS:
        raise typer.BadParameter(f"use --by {', '.join(reports.GROUPINGS)}", param_hint="--by")
    try:
        frame = Ledger.for_storage(_storage()).frame()
    except LedgerConfigError as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(2) from exc
    table, totals = reports.summary(frame, by), reports.totals(frame)
    if as_json:
        clean = lambda v: None if isinstance(v, float) and v != v else v  # noqa: E731 - NaN is not JSON
        rows = [{k: clean(v) for k, v in row.items()} for row in table.to_dict("records")]
        print(json.dumps({"by": by, "rows": rows, "totals": {k: clean(v) for k, v in totals.items()}}, indent=2, default=str))
        return
    money = lambda v: "—" if v != v else f"${v:,.2f}"  # noqa: E731
    out = Table(title=f"Goodput and cost by {by} (goodput: productive ÷ allocated GPU time)")
    for column in (by, "attempts", "preempted", "failed", "GPU-h", "goodput", "lost GPU-h (preempt/fail/queue/rework)", "cost", "tasks done", "cost per task"):
        out.add_column(column, justify="left" if column == by else "right")
    for row in table.itertuples(index=False):
        r = row._asdict()
        lost = "/".join(f"{r[f'lost_{reason}_gpu_hours']:.2f}" for reason in ("preemption", "failure", "queueing", "rework"))
        out.add_row(
            escape(str(r[by])), str(r["attempts"]), str(r["preempted"]), str(r["failed"]), f"{r['gpu_hours']:.3f}",
            "—" if r["goodput"] != r["goodput"] else f"{r['goodput']:.0%}", lost, money(r["cost_usd"]),
            str(r["completed_tasks"]), money(r["cost_per_completed_task"]),
        )
    if len(table):
        lost = "/".join(f"{totals[f'lost_{reason}_gpu_hours']:.2f}" for reason in ("preemption", "failure", "queueing", "rework"))
        out.add_row("total", str(totals["attempts"]), str(int(table["preempted"].sum())), str(int(table["failed"].sum())),
                    f"{totals['gpu_hours']:.3f}", f"{totals['goodput']:.0%}", lost, money(totals["cost_usd"]),
                    str(totals["completed_tasks"]), money(totals["cost_per_completed_task"]), style="bold")
    console.print(out)
    if not len(table):
        console.print("No GPU attempts in the ledger yet: run a step (e.g. `sinewgrid demo`) first.")


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
    from shared_resources.catalog.pools import PoolCatalogError
    from shared_resources.placement.job_files import JobFileError, plan_job_file
    from shared_resources.placement.planner import InfeasiblePlanError

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
