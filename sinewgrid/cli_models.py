"""`sinewgrid checkpoints …` and `sinewgrid runs …`: find checkpoints, prune them, look at runs.

Both read the storage root (`$SINEWGRID_HOME`, or `--root`, local or `s3://`); nothing here
needs Dagster running. See docs/checkpoints.md.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

checkpoints_app = typer.Typer(help="Find checkpoints and prune old ones (retention).", no_args_is_help=True)
runs_app = typer.Typer(help="Recorded training runs: their metrics, config, datasets and code, side by side.", no_args_is_help=True)
console = Console(width=None if sys.stdout.isatty() else 150)

ROOT_HELP = "Storage root (a folder or s3://bucket/prefix); $SINEWGRID_HOME by default."


def _root(root: str | None) -> str:
    from control_plane.settings import storage_root

    return root or storage_root()


@contextmanager
def _clear_errors() -> Iterator[None]:
    """Turn a user's mistake (bad option, missing run) into a red message and exit code 1."""
    from data_layer.experiments import RunNotFound

    try:
        yield
    except (RunNotFound, ValueError, FileNotFoundError, PermissionError) as exc:
        message = exc.args[0] if isinstance(exc, RunNotFound) and exc.args else str(exc)
        Console(stderr=True, width=console.width).print(f"[red]{escape(message)}[/]", soft_wrap=True)
        raise typer.Exit(1) from None


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.5g}"


def _short(text: str, n: int = 10) -> str:
    return text[:n] if text else ""


# checkpoints ------------------------------------------------------------------------------


@checkpoints_app.command("list")
def checkpoints_list(
    model: str = typer.Option(None, help="A model (cell/foundation_model) or a lane (cell)."),
    run: str = typer.Option(None, help="A run id or a whole lineage."),
    dataset: str = typer.Option(None, help="Trained on: a dataset ref (cell/omics@3fa2b1), name or version."),
    step: int = typer.Option(None, help="Only checkpoints at this step."),
    root: str = typer.Option(None, help=ROOT_HELP),
) -> None:
    """Every valid checkpoint, by run and step, with its figures; torn ones are listed apart."""
    from data_layer.checkpoint_registry import CheckpointRegistry, human_bytes

    with _clear_errors():
        registry = CheckpointRegistry(_root(root))
        entries = registry.entries(model=model, run=run, step=step, dataset=dataset)
        torn = registry.torn(model, run)
    if not entries:
        console.print(f"No checkpoints match under {escape(registry.checkpoints_uri)}.")
    else:
        table = Table(title=f"checkpoints under {escape(registry.checkpoints_uri)}")
        for column in ("model", "run", "step", "final", "loss", "other figures", "size", "created (UTC)", "datasets", "code"):
            table.add_column(column, justify="right" if column in ("step", "loss", "size") else "left")
        for e in entries:
            others = ", ".join(f"{k}={v:.4g}" for k, v in sorted(e.metrics.items()) if k != "loss")
            table.add_row(
                escape(e.model), escape(e.run), str(e.step), "final" if e.final else "", _num(e.metrics.get("loss")),
                escape(others), human_bytes(e.bytes), e.created_at[:19].replace("T", " "),
                escape(", ".join(e.datasets)), _short(e.code_version),
            )
        console.print(table)
        console.print(f"{len(entries)} checkpoint(s), {human_bytes(sum(e.bytes for e in entries))}.")
    if torn:
        console.print(f"[yellow]{len(torn)} torn step folder(s), not checkpoints:[/]")
        for t in torn:
            console.print(f"  [yellow]{escape(t.uri)}[/]: {escape(t.reason)}", soft_wrap=True)
        console.print("  (`sinewgrid checkpoints prune --include-torn` removes those older than their run's newest valid checkpoint)")


@checkpoints_app.command("prune")
def checkpoints_prune(
    keep_latest: int = typer.Option(1, help="Keep this many newest checkpoints per run (at least 1)."),
    keep_best: int = typer.Option(1, help="Keep this many best checkpoints per run, by --metric."),
    metric: str = typer.Option("loss", help="The figure that ranks checkpoints."),
    mode: str = typer.Option("min", help="min: lower is better; max: higher is better."),
    model: str = typer.Option(None, help="Only runs of this model (or lane)."),
    run: str = typer.Option(None, help="Only this run (run id or lineage)."),
    protect: list[str] = typer.Option([], help="Also keep this checkpoint or run folder URI (repeatable)."),
    include_torn: bool = typer.Option(False, "--include-torn", help="Also remove torn step folders older than their run's newest valid checkpoint."),
    yes: bool = typer.Option(False, "--yes", help="Remove. Without it, only show the plan."),
    root: str = typer.Option(None, help=ROOT_HELP),
) -> None:
    """Show what retention keeps and removes, and why; remove it with --yes.

    Per run it keeps the newest --keep-latest, the best --keep-best by --metric, every final
    checkpoint and every checkpoint a `latest.json` pointer names. Run folders' run.json and
    metrics.parquet are never removed.
    """
    from data_layer.checkpoint_registry import CheckpointRegistry, human_bytes
    from data_layer.checkpoint_retention import apply_retention, plan_retention, pointer_protections

    with _clear_errors():
        where = _root(root)
        registry = CheckpointRegistry(where)
        plan = plan_retention(
            registry, keep_latest=keep_latest, keep_best=keep_best, metric=metric, mode=mode, model=model, run=run,
            protect=pointer_protections(where) | set(protect), include_torn=include_torn,
        )
    rows = plan.rows()
    if not rows:
        console.print(f"No checkpoints match under {escape(registry.checkpoints_uri)}.")
        return
    table = Table(title="retention plan")
    for column in ("action", "run", "step", metric, "size", "reason"):
        table.add_column(column, justify="right" if column in ("step", metric, "size") else "left")
    for r in rows:
        colour = "red" if r["action"] == "remove" else "green"
        table.add_row(f"[{colour}]{r['action']}[/]", escape(r["lineage"]), str(r["step"]), _num(r[metric]), human_bytes(r["bytes"]), escape(r["reason"]))
    console.print(table)
    console.print(f"Retention {plan.summary()}.")
    if plan.empty:
        console.print("Nothing to remove.")
        return
    if not yes:
        console.print(
            "[bold]Dry run: nothing was removed.[/] Run the same command with [bold]--yes[/] to remove "
            f"{len(plan.remove) + len(plan.remove_torn)} folder(s) and free {human_bytes(plan.bytes_freed)}."
        )
        return
    with _clear_errors():
        removed = apply_retention(plan)
    sizes = {r["uri"]: r["bytes"] for r in rows}
    for uri in removed:
        console.print(f"  removed {escape(uri)}", soft_wrap=True)
    console.print(f"[green]Removed {len(removed)} folder(s), freed {human_bytes(sum(sizes.get(u, 0) for u in removed))}.[/]")
    skipped = len(plan.remove) + len(plan.remove_torn) - len(removed)
    if skipped:
        console.print(f"[yellow]{skipped} planned folder(s) changed since the plan was made and were left alone; run prune again.[/]")


# runs -------------------------------------------------------------------------------------


@runs_app.command("list")
def runs_list(
    model: str = typer.Option(None, help="A model (cell/foundation_model) or a lane (cell)."),
    root: str = typer.Option(None, help=ROOT_HELP),
) -> None:
    """Every recorded run, with its summary figures, evaluations, data and code."""
    from data_layer.experiments import list_runs

    warnings: list[str] = []
    with _clear_errors():
        runs = list_runs(_root(root), model=model, warn=warnings.append)
    for warning in warnings:
        console.print(f"[yellow]{escape(warning)}[/]")
    if not runs:
        console.print("No runs recorded yet" + (f" for {escape(model)}" if model else "") + ": training assets record theirs when they finish.")
        return
    table = Table(title="recorded runs")
    for column in ("lineage", "recorded (UTC)", "figures", "datasets", "code", "pool", "cost"):
        table.add_column(column)
    for r in runs:
        figures = ", ".join(f"{k}={v:.4g}" for k, v in r.figures().items())
        cost = "" if r.cost_usd is None else f"${r.cost_usd:,.2f}"
        table.add_row(
            escape(r.lineage), r.recorded_at[:19].replace("T", " "), escape(figures), escape(", ".join(r.datasets)),
            _short(r.code_version), escape(r.pool), cost,
        )
    console.print(table)


def _kv_table(title: str, items: dict[str, Any], fmt: Callable[[Any], str] = str) -> Table:
    table = Table(title=title, show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    for key, value in items.items():
        table.add_row(escape(str(key)), escape(fmt(value)))
    return table


@runs_app.command("show")
def runs_show(
    lineage: str = typer.Argument(..., help="The run's lineage, e.g. cell/foundation_model/<run>."),
    root: str = typer.Option(None, help=ROOT_HELP),
) -> None:
    """One run: its figures, evaluations, curves, config, data, code and files."""
    from data_layer.experiments import load_run
    from data_layer.run_comparison import flatten_config

    with _clear_errors():
        run = load_run(_root(root), lineage)
        curves = run.curves()
    console.print(f"[bold]{escape(run.lineage)}[/]  recorded {run.recorded_at}")
    console.print(_kv_table("figures", run.figures(), lambda v: f"{v:.6g}"))
    if not curves.empty:
        last = curves.sort_values("step").groupby("metric").agg(points=("step", "size"), last_step=("step", "max"), last_value=("value", "last"))
        table = Table(title="curves (metrics.parquet)")
        for column in ("metric", "points", "last step", "last value"):
            table.add_column(column)
        for row in last.itertuples():
            table.add_row(escape(str(row.Index)), str(row.points), str(row.last_step), f"{row.last_value:.6g}")
        console.print(table)
    console.print(_kv_table("config", flatten_config(run.config)))
    about = {
        "datasets": ", ".join(run.datasets) or "none recorded",
        "code version": run.code_version or "unknown",
        "pool": run.pool or "unknown",
        "cost": "unknown" if run.cost_usd is None else f"${run.cost_usd:,.4f}",
        "dagster run": run.dagster_run_id or "unknown",
        "checkpoints": run.checkpoint_uri,
        "run.json": run.run_json_uri,
        "metrics.parquet": run.metrics_uri,
        **{f"extra.{k}": v for k, v in run.extra.items()},
    }
    console.print(_kv_table("provenance", about))


@runs_app.command("compare")
def runs_compare(
    a: str = typer.Argument(..., help="The first run's lineage."),
    b: str = typer.Argument(..., help="The second run's lineage."),
    plot: Path = typer.Option(None, help="Write both runs' curves to this PNG file."),
    metric: str = typer.Option("loss", help="The curve to plot."),
    root: str = typer.Option(None, help=ROOT_HELP),
) -> None:
    """Two runs side by side: figures and their difference, config that differs, datasets, code."""
    from data_layer.experiments import load_run
    from data_layer.run_comparison import compare

    with _clear_errors():
        where = _root(root)
        comparison = compare(load_run(where, a), load_run(where, b))
        png = comparison.png(metric) if plot else None
    console.print(f"[bold]a[/] = {escape(comparison.a.lineage)}\n[bold]b[/] = {escape(comparison.b.lineage)}")
    figures = Table(title="figures")
    for column in ("metric", "a", "b", "b − a"):
        figures.add_column(column, justify="left" if column == "metric" else "right")
    for m in comparison.metrics:
        figures.add_row(escape(m.name), _num(m.a), _num(m.b), "" if m.diff is None else f"{m.diff:+.5g}")
    console.print(figures)
    if comparison.config:
        config = Table(title="config that differs")
        for column in ("key", "a", "b"):
            config.add_column(column)
        for key, va, vb in comparison.config:
            config.add_row(escape(key), escape(str(va)), escape(str(vb)))
        console.print(config)
    else:
        console.print("config: identical")
    console.print(f"datasets only in a: {escape(', '.join(comparison.datasets_only_a) or 'none')}")
    console.print(f"datasets only in b: {escape(', '.join(comparison.datasets_only_b) or 'none')}")
    console.print(f"datasets in both:   {escape(', '.join(comparison.datasets_both) or 'none')}")
    same = " (the same)" if comparison.same_code and comparison.a.code_version else ""
    console.print(f"code: a {comparison.a.code_version or 'unknown'}, b {comparison.b.code_version or 'unknown'}{same}")
    if plot and png is not None:
        with _clear_errors():
            plot.parent.mkdir(parents=True, exist_ok=True)
            plot.write_bytes(png)
        console.print(f"wrote the {escape(metric)} curves to {escape(str(plot))}", soft_wrap=True)
