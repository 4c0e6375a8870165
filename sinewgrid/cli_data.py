"""`sinewgrid data …` and `sinewgrid lineage`: dataset versions and where every result came from."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree as RichTree

data_app = typer.Typer(help="Dataset versions in the data registry (git + DVC under the storage root).", no_args_is_help=True)
console = Console(width=None if sys.stdout.isatty() else 150)
errors = Console(stderr=True, width=None if sys.stderr.isatty() else 150)


def _root(root: str | None) -> str:
    from shared_resources.runtime.storage import Storage
    from shared_resources.settings import storage_root

    return Storage.at(root or storage_root()).root


def _fail(message: str) -> None:
    errors.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(1)


ROOT = typer.Option(None, "--root", help="The storage root (default: $SINEWGRID_HOME, else .sinewgrid/).")


@data_app.command("list")
def data_list(dataset: str = typer.Argument(None, help="Only this dataset, e.g. cell/omics."), root: str = ROOT) -> None:
    """Every registered dataset version: its DVC hash, registry revision, size and region."""
    from shared_resources.data.registry.names import RegistryError
    from shared_resources.data.registry.registry import DataRegistry

    try:
        registry = DataRegistry.for_root(_root(root))
        versions = registry.versions(dataset)
    except RegistryError as exc:
        _fail(str(exc))
    if not versions:
        console.print(f"no dataset versions registered{' for ' + escape(dataset) if dataset else ''} in {escape(registry.git_url)}")
        return
    table = Table(title=f"Dataset versions ({escape(registry.git_url)})")
    for column in ("dataset", "version", "dvc md5", "registry rev", "files", "MB", "region", "registered"):
        table.add_column(column)
    for v in versions:
        table.add_row(
            escape(v.dataset), escape(v.version), v.md5[:12], v.rev[:10], str(v.files), f"{v.bytes / 1e6:.2f}",
            escape(v.region if v.provider == v.region else f"{v.provider} {v.region}"), v.registered_at[:19],
        )
    console.print(table)


@data_app.command("get")
def data_get(
    dataset: str = typer.Argument(..., help="The dataset, e.g. cell/omics, cell/assays, robotics/teleop, robotics/rollouts."),
    version: str = typer.Argument(..., help="Its version (see `sinewgrid data list`)."),
    dest: str = typer.Argument(..., help="Where to put it: a folder that does not exist yet."),
    root: str = ROOT,
) -> None:
    """Get one dataset version back, exactly as registered (every file checked against its hash)."""
    from shared_resources.data.registry.names import RegistryError
    from shared_resources.data.registry.registry import DataRegistry

    try:
        got = DataRegistry.for_root(_root(root)).get(dataset, version, dest)
    except (RegistryError, FileExistsError) as exc:
        _fail(str(exc))
    console.print(f"{escape(got.ref)} → {escape(dest)}: {got.files} files, {got.bytes / 1e6:.2f} MB, DVC md5 {got.md5}, registry rev {got.rev[:10]}")
    console.print(f"without sinewgrid: {escape(got.metadata()['get_command'])}")


def lineage(
    thing: str = typer.Argument(..., help="An evaluation, model run, dataset version (cell/omics@<v>), drop, or a checkpoint URI."),
    root: str = ROOT,
) -> None:
    """Where a result came from: evaluation → model checkpoint → dataset versions → code → raw drops.

    Each record's code version (git revision) is shown where it differs from the one above it.
    """
    from shared_resources.data.lineage import LineageNotFound, LineageStore, Tree

    store = LineageStore(_root(root))
    try:
        tree = store.tree(store.resolve(thing).id)
    except (LineageNotFound, ValueError) as exc:
        _fail(str(exc))

    def label(t: Tree, parent_code: str = "") -> str:
        node = t.node
        head = f"[bold]{escape(node.id)}[/bold] [dim]({node.kind})[/dim] {escape(node.title)}"
        if t.repeated:
            return head + " [dim](shown above)[/dim]"
        facts = [f"{k}: {v}" for k, v in node.facts.items() if v not in (None, "", [], {})]
        details = [escape("; ".join(facts))] if facts else []
        if node.code_version and node.code_version != parent_code:  # shown again only where it changes
            details.append(f"code {escape(node.code_version[:12])}")
        if node.uri:
            details.append(f"[dim]{escape(node.uri)}[/dim]")
        return head + "".join(f"\n{d}" for d in details)

    def add(branch: RichTree, t: Tree) -> None:
        for child in t.children:
            add(branch.add(label(child, t.node.code_version)), child)
        for gone in t.missing:
            branch.add(f"[yellow]{escape(gone)}[/yellow] (its lineage record is missing)")

    root_branch = RichTree(label(tree))
    add(root_branch, tree)
    console.print(root_branch)
