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
    from workload_runtime.storage import Storage
    from control_plane.settings import storage_root

    return Storage.at(root or storage_root()).root


def _fail(message: str) -> None:
    errors.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(1)


ROOT = typer.Option(None, "--root", help="The storage root (default: $SINEWGRID_HOME, else .sinewgrid/).")
TENANT = typer.Option(
    None, "--tenant",
    help="The tenant (tenants catalog) whose data it is: its registry under its own root, opened with its key held here.",
)


def _tenant_root(root: str | None, tenant: str) -> str:
    """The tenant's storage root, with its key registered in this process (never created here)."""
    from control_plane.catalog.tenants import TenantCatalogError, UnknownTenant
    from workload_runtime.tenant_access import register
    from control_plane.tenancy.control import tenant_access
    from workload_runtime.keys import KeyUnavailable

    try:
        access = tenant_access(_root(root), tenant)
        register(access.storage_root, access.keyring(create=False))  # a new key could open nothing
    except (UnknownTenant, TenantCatalogError, KeyUnavailable) as exc:
        _fail(str(exc))
    return access.storage_root


def _sealed_note(dest: str) -> None:
    """Say so when what was fetched is still sealed (got without --tenant)."""
    from pathlib import Path

    from data_layer.registry.sealed_files import sealed_tenants

    if "://" in dest and not dest.startswith("file://"):
        return
    found = sealed_tenants(Path(dest.removeprefix("file://")))
    for tenant, files in sorted(found.items()):
        console.print(
            f"{files} files are sealed with the key of tenant {escape(tenant)}: open them with "
            f"`sinewgrid data decrypt {escape(dest)} --tenant {escape(tenant)}` (needs that key)."
        )


@data_app.command("list")
def data_list(dataset: str = typer.Argument(None, help="Only this dataset, e.g. cell/omics."), root: str = ROOT, tenant: str = TENANT) -> None:
    """Every registered dataset version: its DVC hash, registry revision, size and region (with
    --tenant: of that tenant's own registry, e.g. a lab's cell/assays and cell/omics)."""
    from data_layer.registry.names import RegistryError
    from data_layer.registry.registry import DataRegistry

    try:
        registry = DataRegistry.for_root(_tenant_root(root, tenant) if tenant else _root(root))
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
    dataset: str = typer.Argument(..., help="The dataset, e.g. cell/omics, cell/assays, robotics/teleop, robotics/rollouts, robotics/scenes."),
    version: str = typer.Argument(..., help="Its version (see `sinewgrid data list`)."),
    dest: str = typer.Argument(..., help="Where to put it: a folder that does not exist yet."),
    root: str = ROOT,
    tenant: str = TENANT,
) -> None:
    """Get one dataset version back, exactly as registered (every file checked against its hash).

    With --tenant: from that tenant's registry (under its own storage root), and its sealed files
    opened with its key, so DEST holds the plain dataset. If the key is unavailable or a file fails
    its integrity check, DEST is not created.
    """
    from data_layer.registry.names import RegistryError
    from data_layer.registry.registry import DataRegistry
    from workload_runtime.tenant_access import opener
    from workload_runtime.envelope import SealedDataError
    from workload_runtime.keys import KeyUnavailable

    registry_root = _tenant_root(root, tenant) if tenant else _root(root)
    try:
        got = DataRegistry.for_root(registry_root).get(dataset, version, dest, opener=opener() if tenant else None)
    except (RegistryError, FileExistsError, KeyUnavailable, SealedDataError) as exc:
        _fail(str(exc))
    console.print(f"{escape(got.ref)} → {escape(dest)}: {got.files} files, {got.bytes / 1e6:.2f} MB, DVC md5 {got.md5}, registry rev {got.rev[:10]}")
    if tenant:
        console.print(f"opened with the key of tenant {escape(tenant)}: {escape(dest)} holds the plain files (their md5s are not the registered ones)")
    else:
        _sealed_note(dest)
    console.print(f"without sinewgrid: {escape(got.metadata()['get_command'])}" + (f", then `sinewgrid data decrypt {escape(got.version)} --tenant {escape(tenant)}`" if tenant else ""))


@data_app.command("decrypt")
def data_decrypt(
    path: str = typer.Argument(..., help="A folder (or one file) fetched with plain `dvc get`, holding a tenant's sealed files."),
    tenant: str = typer.Option(..., "--tenant", help="The tenant whose key sealed them (tenants catalog); its key must be usable here."),
    to: str = typer.Option(None, "--to", help="Write the plain copy here (a new folder or file) and leave PATH sealed."),
    root: str = ROOT,
) -> None:
    """Open a tenant's sealed files: in place, or into a plain copy with --to.

    In place, each sealed file is replaced by its plain form. Each file is decrypted to a hidden
    temporary file beside it first; only when every sealed file has been opened are they renamed
    over the sealed originals (same names, so the folder is then the plain dataset, e.g. a zarr
    store anndata opens). If any cannot be opened (the key unavailable or disabled, a file changed
    or cut short) the temporary files are removed and nothing is replaced: every sealed original
    stays as it was. Plain files are left alone, so running it again is safe.

    Never under a storage root (the platform's or any tenant's, symlinks followed): plain text
    there would sit where the platform and its workloads expect sealed objects. A PATH there is
    decrypted only `--to` a destination outside every root.
    """
    import shutil
    from pathlib import Path

    from control_plane.tenancy.control import storage_root_holding
    from data_layer.registry.sealed_files import decrypt_folder
    from workload_runtime.tenant_access import opener
    from workload_runtime.envelope import SealedDataError
    from workload_runtime.keys import KeyUnavailable

    _tenant_root(root, tenant)
    source = Path(path).expanduser()
    target = Path(to).expanduser() if to else source
    if (inside := storage_root_holding(target, _root(root))) is not None:
        whose, where = inside
        fix = "give another `--to` outside every storage root" if to else f"give `--to DEST` to write a plain copy outside it (`{path}` stays sealed)"
        _fail(f"{target} is under the storage root of {whose} ({where}): plain files there would replace the sealed objects the platform reads. Nothing was changed; {fix}.")
    if to:
        if target.exists():
            _fail(f"{target} exists already: give a new folder (or file) for the plain copy. Nothing was changed.")
        if not source.exists():
            _fail(f"{source} does not exist. Nothing was changed.")
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, target)
    try:
        done = decrypt_folder(target, opener())
    except (FileNotFoundError, KeyUnavailable, SealedDataError) as exc:
        if to:
            (shutil.rmtree if target.is_dir() else Path.unlink)(target)  # the copy this command made, sealed still
        _fail(f"{exc} Nothing under {path} was changed.")
    where = f"{escape(path)} -> {escape(to)}" if to else escape(path)
    console.print(f"{where}: {done.files} sealed files replaced by their plain form ({done.bytes / 1e6:.2f} MB), {done.plain} already plain")


def lineage(
    thing: str = typer.Argument(..., help="An evaluation, model run, dataset version (cell/omics@<v>), drop, or a checkpoint URI."),
    root: str = ROOT,
    tenant: str = TENANT,
) -> None:
    """Where a result came from: evaluation → model checkpoint → dataset versions → code → raw drops.

    Each record's code version (git revision) is shown where it differs from the one above it.
    With --tenant: a tenant's lineage (a lab's drops, datasets, models and proposals live under its own root).
    """
    from data_layer.lineage import LineageNotFound, LineageStore, Tree

    store = LineageStore(_tenant_root(root, tenant) if tenant else _root(root))
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
