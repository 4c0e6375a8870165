"""The summary the demo and `sinewgrid summary` print: GPU steps and model tasks side by side,
per tenant, each lab's model round by round, the policy version by version, quarantined drops."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from control_plane.settings import settings
from sinewgrid.summary import ledger_by_step, ledger_by_tenant, model_tasks, quarantined, training_rounds, truth_rmse
from workload_runtime.storage import Storage


def tag(tenant: str) -> str:
    """A line's prefix naming its tenant, `[lab-a]` (escaped: rich would read it as markup)."""
    return escape(f"[{tenant}]")


def _table(title: str, columns: tuple[str, ...], left: int) -> Table:
    table = Table(title=title)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i < left else "right")
    return table


def print_gpu_steps(console: Console, storage: Storage) -> None:
    """GPU time as `sinewgrid report` counts it: GPU-hours, each attempt's time × its GPUs, and
    goodput as productive over allocated GPU-hours."""
    steps = ledger_by_step(storage)
    table = _table(
        "GPU steps: where they ran and what they cost (goodput: productive ÷ allocated GPU time)",
        ("step", "pool", "purchasing", "attempts", "preempted", "GPU-h", "productive GPU-h", "goodput", "cost"), 3,
    )
    for row in steps.itertuples():
        table.add_row(
            row.step, row.pool, row.purchasing, str(row.attempts), str(row.preempted), f"{row.gpu_hours:.4f}",
            f"{row.productive_gpu_hours:.4f}", _percent(row.goodput), f"${row.cost_usd:.4f}",
        )
    if len(steps):
        # the total's goodput from the summed GPU-hours: what `reports.totals` gives for these rows
        gpu_hours, productive = steps["gpu_hours"].sum(), steps["productive_gpu_hours"].sum()
        table.add_row("total", "", "", str(int(steps["attempts"].sum())), str(int(steps["preempted"].sum())), f"{gpu_hours:.4f}",
                      f"{productive:.4f}", _percent(productive / gpu_hours if gpu_hours > 0 else float("nan")),
                      f"${steps['cost_usd'].sum():.4f}", style="bold")
    console.print(table)


def _percent(value: float) -> str:
    return f"{value:.0%}" if value == value else "—"


def print_model_tasks(console: Console, storage: Storage) -> None:
    tasks = model_tasks(storage)
    if not len(tasks):
        return
    evaluations = tasks[tasks["step"].str.startswith("evaluate ")]
    work = tasks[~tasks["step"].str.startswith("evaluate ")]
    table = _table(
        "Model tasks: tokens bought through the model gateway, by task and model",
        ("task", "model", "bought as", "items", "tokens in", "out", "cached in", "cache hits", "token cost", "per item"), 3,
    )
    for row in work.itertuples():
        per = f"${row.cost_per_completed:.6f}" if row.cost_per_completed == row.cost_per_completed else "—"
        table.add_row(
            escape(row.step), escape(row.model), row.purchasing, f"{int(row.completed)}/{row.items}", f"{row.tokens_in:,}", f"{row.tokens_out:,}",
            f"{row.tokens_cached:,}", str(row.cache_hits), f"${row.token_cost_usd:.6f}", per,
        )
    console.print(table)
    if len(evaluations):
        console.print(
            f"  Measuring the models on each task's own evaluation set (once per task version): {len(evaluations)} model × task pairs, "
            f"{int(evaluations['tokens_in'].sum() + evaluations['tokens_out'].sum()):,} tokens, ${evaluations['token_cost_usd'].sum():.4f}. "
            "Prices are the model catalog's (illustrative); `sinewgrid report --by model` has every figure."
        )


def print_tenants(console: Console, storage: Storage) -> None:
    tenants = ledger_by_tenant(storage)
    if not len(tenants):
        return
    table = _table("Per tenant: GPU hours and tokens, each with its cost", ("tenant", "GPU-h", "goodput", "GPU cost", "tokens", "token cost", "total"), 1)
    for row in tenants.itertuples():
        table.add_row(
            escape(row.tenant), f"{row.gpu_hours:.4f}", _percent(row.goodput),
            f"${row.gpu_cost_usd:.4f}", f"{row.tokens:,}", f"${row.token_cost_usd:.6f}", f"${row.cost_usd:.4f}",
        )
    console.print(table)


def print_lab_rounds(console: Console, instance, truth=None) -> None:
    rounds = training_rounds(instance)
    if not rounds:  # the robotics lane alone (`demo --lane robotics`) trains no lab's model
        return
    table = _table("The model of each lab, round by round (held-out error: lower is better)", ("tenant", "round", "assayed genes", "held-out RMSE", "baseline RMSE", "Spearman", "pool", "cost"), 1)
    if truth is not None:
        table.add_column("RMSE vs lab truth*", justify="right")
    for r in rounds:
        cells = [escape(r.tenant), str(r.round), str(r.assayed_genes), f"{r.held_out_rmse:.3f}", f"{r.baseline_rmse:.3f}", f"{r.spearman:.2f}", r.pool, f"${r.cost_usd:.4f}"]
        if truth is not None:
            cells.append(f"{truth_rmse(r.predictions_uri, truth):.3f}")
        table.add_row(*cells)
    console.print(table)
    if truth is not None:
        console.print("  * on genes never assayed, against the lab stand-in's hidden truth (only the stand-in can know it)")


def print_quarantined(console: Console, storage: Storage, labs: dict[str, Storage]) -> None:
    bad = [("", report) for report in quarantined(storage)]
    bad += [(tenant, report) for tenant, store in labs.items() for report in quarantined(store)]
    if not bad:
        return
    console.print(f"[yellow]Quarantined drops ({len(bad)}):[/]")
    for tenant, report in bad:
        prefix = f"{tag(tenant)} " if tenant else ""
        console.print(f"  {prefix}[bold]{report['kind']}/{report['drop_id']}[/] at the {report['stage']} stage — {len(report['issues'])} issue(s):")
        for issue in report["issues"][:4]:
            console.print(f"    - {escape(issue.get('file') or 'drop')} ({issue['rule']}): {escape(issue['message'])}")


def print_policy_versions(console: Console, instance) -> None:
    from robotics_lane.defs.policy_versions import policy_versions, verdict

    versions = policy_versions(instance)
    if not versions:
        return
    table = _table(
        "The policy, version by version (success rate with 95% Wilson interval)",
        ("policy", "trained on", "corrective episodes", "sim success", "real success", "sim-to-real gap", "failed real trials → relabel"), 1,
    )
    for v in versions:
        gap = f"{v.sim.rate - v.real.rate:+.0%}" if v.sim and v.real else "—"
        table.add_row(
            v.label, f"{v.datasets} datasets" if v.datasets is not None else "?", str(v.corrective_episodes if v.corrective_episodes is not None else "—"),
            str(v.sim or "—"), str(v.real or "pending (robot cell)"), gap, str(v.failed_real_trials if v.failed_real_trials is not None else "—"),
        )
    console.print(table)
    console.print(f"  {escape(verdict(versions))}")


def print_summary(console: Console, storage: Storage, instance, labs: dict[str, Storage], *, truth=None, robotics_rows: bool = True) -> None:
    """Everything above, in the order a reader asks: what ran and cost what, whose it was, did it help."""
    print_gpu_steps(console, storage)
    print_model_tasks(console, storage)
    print_tenants(console, storage)
    print_lab_rounds(console, instance, truth)
    print_quarantined(console, storage, labs)
    if robotics_rows:
        print_policy_versions(console, instance)
    console.print(f"\nStorage root: {storage.root}   Dagster instance: {settings().dagster_home}")
    console.print("Open the UI on the same instance with [bold]make ui[/] (http://127.0.0.1:3000).")
