"""`sinewgrid queue`: each pool's queue — who holds its GPUs against their quotas, and what waits
for them and why (docs/queues.md); `sinewgrid queue kueue`: the same quotas as Kueue objects."""

from __future__ import annotations

import datetime as dt

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()
queue_app = typer.Typer(help="Each pool's queue: GPUs by team against quotas, and the steps waiting with their reasons.")


def _catalogs():
    from control_plane.catalog.pools import load_pools
    from control_plane.catalog.quotas import QuotaCatalogError, load_quotas

    from control_plane.settings import settings

    try:
        quotas = load_quotas()
    except QuotaCatalogError as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(2) from None
    return load_pools(settings().pools or None), quotas  # the catalog the compute resource uses


@queue_app.callback(invoke_without_command=True)
def queue(ctx: typer.Context, pool: str = typer.Option("", help="One pool only (default: every pool of the catalog).")) -> None:
    """Each pool's GPUs by team (nominal quota, in use, borrowed) from the jobs in flight, and the
    steps waiting for it: team, GPUs, priority class, how long, why, and an expected start."""
    if ctx.invoked_subcommand is not None:
        return
    global console
    console = Console()  # as wide as the terminal is now (COLUMNS)
    from control_plane.queues.view import queue_view
    from control_plane.settings import storage_root
    from workload_runtime.storage import Storage

    pools, quotas = _catalogs()
    for problem in quotas.problems_with({p.name: p.gpus_per_node * p.nodes for p in pools.values()}):
        console.print(f"[yellow]{escape(problem)}[/]")
    if pool and pool not in pools:
        console.print(f"[red]no pool `{escape(pool)}` in the pool catalog (its pools: {escape(', '.join(sorted(pools)))})[/]")
        raise typer.Exit(2)
    views = [v for v in queue_view(Storage.at(storage_root()), pools, quotas) if not pool or v.pool == pool]
    table = Table(title=f"GPUs by team (quotas: {escape(quotas.file)})", caption="borrowed: in use past the team's nominal quota, lent by its cohort; "
                  "a pool the quotas file does not name is not queued")  # fmt: skip
    for column in ("pool", "GPUs", "free", "team", "nominal", "in use", "borrowed"):
        table.add_column(column, justify="left" if column in ("pool", "team") else "right")
    for view in views:
        for i, row in enumerate(view.teams or [None]):
            first = i == 0
            label = escape(view.pool) + ("" if view.queued else " (not queued)")
            cells = [escape(row.team), str(row.nominal), str(row.used), str(row.borrowed)] if row else ["—", "", "", ""]
            table.add_row(label if first else "", str(view.gpus) if first else "", str(view.free) if first else "", *cells)
    console.print(table)
    waiting = [(v.pool, w) for v in views for w in v.waiting]
    if not waiting:
        console.print("Nothing waits for admission.")
        return
    now = dt.datetime.now(dt.UTC)
    table = Table(title="Waiting, in the order the GPUs go to them", caption="expected start: if the running jobs end when their steps expect; an estimate")
    for column in ("pool", "step", "team", "GPUs", "class", "waiting", "why", "expected start"):
        table.add_column(column, justify="right" if column in ("GPUs", "waiting") else "left", no_wrap=column != "why")
    for name, w in waiting:
        start = "now" if w.expected_start is not None and w.expected_start <= now.timestamp() + 1 else (
            dt.datetime.fromtimestamp(w.expected_start, dt.UTC).strftime("%H:%M UTC") if w.expected_start else "not before other work ends")
        table.add_row(escape(name), escape(w.step), escape(w.team), str(w.gpus), escape(w.priority), f"{w.waited_seconds / 60:.0f} min", escape(w.reason), start)
    console.print(table)


@queue_app.command("kueue")
def kueue() -> None:
    """The quotas as Kueue objects for the Kubernetes pools (ResourceFlavors, ClusterQueues,
    LocalQueues, WorkloadPriorityClasses): `sinewgrid queue kueue | kubectl apply -f -`
    (docs/queues_kubernetes.md)."""
    from control_plane.queues.kueue import KueueObjectsError, kueue_manifests

    pools, quotas = _catalogs()
    try:
        typer.echo(kueue_manifests(quotas, pools), nl=False)
    except KueueObjectsError as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(2) from None


@queue_app.command("slurm")
def slurm(
    pools: list[str] = typer.Argument(..., help="The Slurm pools of the pool catalog that one cluster serves."),
    user: list[str] = typer.Option([], help="A Unix user that submits the jobs (default: this one); repeat for more."),
    apply: bool = typer.Option(False, "--apply", help="Make what differs on the cluster, then print `sshare`."),
) -> None:
    """The quotas as Slurm accounts (Fairshare from each team's weight) and QOS (one per priority
    class): print the `sacctmgr` commands, or make them with --apply (docs/queues_slurm.md)."""
    from control_plane.compute.backends.slurm_accounts import main

    main([*pools, *(a for u in user for a in ("--user", u)), *(["--apply"] if apply else [])])
