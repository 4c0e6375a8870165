"""`sinewgrid queue`: who holds each pool's GPUs now, by team, against its quota (docs/queues.md)."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()


def queue(pool: str = typer.Option("", help="One pool only (default: every pool of the catalog).")) -> None:
    """Each pool's GPUs by team: nominal quota, in use, borrowed, and the pool's free GPUs, from
    the jobs in flight. Waiting steps are not yet queued by team: this is who holds the GPUs now."""
    from control_plane.catalog.pools import load_pools
    from control_plane.catalog.quotas import QuotaCatalogError, load_quotas
    from control_plane.compute.inflight import InFlight
    from control_plane.queues.usage import queues_now
    from control_plane.settings import storage_root
    from workload_runtime.storage import Storage

    pools = load_pools()
    try:
        quotas = load_quotas()
    except QuotaCatalogError as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(2) from None
    for problem in quotas.problems_with({p.name: p.gpus_per_node * p.nodes for p in pools.values()}):
        console.print(f"[yellow]{escape(problem)}[/]")
    if pool and pool not in pools:
        console.print(f"[red]no pool `{escape(pool)}` in the pool catalog (its pools: {escape(', '.join(sorted(pools)))})[/]")
        raise typer.Exit(2)
    queues = queues_now(InFlight(Storage.at(storage_root())).records(), pools, quotas)
    table = Table(title=f"GPUs by team (quotas: {escape(quotas.file)})", caption="borrowed: in use past the team's nominal quota, lent by its cohort")
    for column in ("pool", "GPUs", "free", "team", "nominal", "in use", "borrowed"):
        table.add_column(column, justify="left" if column in ("pool", "team") else "right")
    for name in [pool] if pool else sorted(queues):
        q = queues[name]
        teams = sorted({*quotas.quotas.get(name, {}), *(r.team for r in q.running.values())})
        for i, team in enumerate(teams or ["—"]):
            first = i == 0
            nominal, used = (q.nominal(team), q.used(team)) if teams else (0, 0)
            table.add_row(escape(name) if first else "", str(q.capacity) if first else "", str(q.free) if first else "", escape(team),
                          str(nominal), str(used), str(max(0, used - nominal)))  # fmt: skip
    console.print(table)
