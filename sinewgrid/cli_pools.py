"""`sinewgrid pools list`: the catalog's pools by accelerator and shape (docs/accelerators.md)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from control_plane.catalog.pools import Pool


def shape(pool: Pool) -> str:
    """One fast domain, short: `NVLink domain: 18 × 4`, `TPU slice 4x4x4: 16 × 4, whole`, or `—`."""
    if pool.domain_nodes is None:
        return "—"
    if pool.topology is not None and pool.topology.slice:
        return f"TPU slice {pool.topology.slice}: {pool.domain_nodes} × {pool.gpus_per_node}, whole"
    return f"{pool.domain_noun}: {pool.domain_nodes} × {pool.gpus_per_node}"


def pools_list(
    pools: list[Path] = typer.Option(None, "--pools", help="Pool catalog file or folder (repeatable); default SINEWGRID_POOLS or the packaged one."),
) -> None:
    """The pools of the catalog: accelerator and family, nodes, fast domains and their links, price."""
    from control_plane.catalog.pools import load_catalog
    from control_plane.settings import settings

    sources = list(pools or []) or [settings().pools or None]
    catalog = load_catalog(sources[0])
    for source in sources[1:]:
        catalog = catalog.merged(load_catalog(source))
    table = Table(title=f"Pools ({', '.join(catalog.files)})")
    for column in ("pool", "accelerator", "nodes", "fast domain (nodes × devices)", "GB/s in / across", "$/device-h"):
        table.add_column(column, no_wrap=column in ("pool", "accelerator"))
    for pool in catalog.pools.values():
        inside, across = pool.link_gb_per_s
        links = f"{inside:g} / {across:g}" if pool.domain_nodes is not None else "—"
        table.add_row(
            escape(pool.name), f"{pool.accelerator} ({pool.family})", f"{pool.nodes} × {pool.gpus_per_node}", shape(pool), links,
            f"{pool.price_per_gpu_hour:.2f} {pool.purchasing.value}",
        )
    Console().print(table)
    Console().print("A step lands only on the families its code runs on (`runs_on`; none said: CUDA): docs/accelerators.md")
