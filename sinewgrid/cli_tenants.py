"""`sinewgrid tenants`: the tenants catalog, and the local keys of the embedded default."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from control_plane.catalog.tenants import TenantCatalogError, UnknownTenant, load_tenants
from control_plane.settings import storage_root
from workload_runtime.keys import KeyUnavailable, LocalKeyring, create_local_key, rotate_local_key, set_local_key_enabled

console = Console()
tenants_app = typer.Typer(help="The platform's tenants (docs/tenancy.md): who owns which data, under which key.", no_args_is_help=True)
key_app = typer.Typer(help="A tenant's local key (the embedded default; a KMS key is managed in the tenant's KMS).", no_args_is_help=True)
tenants_app.add_typer(key_app, name="key")


def _tenant(name: str):
    try:
        return load_tenants().get_tenant(name)
    except (UnknownTenant, TenantCatalogError) as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(2) from None


def _local_key_file(name: str):
    tenant = _tenant(name)
    if tenant.key is None or tenant.key.kind != "local":
        kind = "no key" if tenant.key is None else f"a {tenant.key.kind} key ({tenant.key.key_id})"
        console.print(f"[red]tenant `{name}` has {escape(kind)}: manage it in the tenant's own KMS (docs/tenancy.md).[/]")
        raise typer.Exit(2)
    return tenant.key_file()


def _existing_key_file(name: str):
    path = _local_key_file(name)
    if not path.exists():
        console.print(f"[red]tenant `{name}` has no key file at {path} yet (`sinewgrid tenants key create {name}` makes one).[/]")
        raise typer.Exit(2)
    return path


@tenants_app.command("list")
def list_tenants() -> None:
    """Each tenant: its lane, storage root, key and agreement."""
    try:
        tenants = load_tenants()
    except TenantCatalogError as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(2) from None
    table = Table(title=f"tenants ({tenants.file})")
    for column in ("tenant", "lane", "storage root", "key", "agreement"):
        table.add_column(column)
    for t in tenants.values():
        if t.key is None:
            key = "none (not encrypted)"
        elif t.key.kind == "local":
            keyring = LocalKeyring(t.name, t.key_file())
            try:
                keyring._load()
                key = f"{keyring.key_id} (enabled)"
            except KeyUnavailable as exc:
                key = f"{exc.key_id}: {exc.reason}"
        else:
            key = f"aws-kms {t.key.key_id}"
        a = t.agreement
        agreement = f"shared models: {'yes' if a.shared_models else 'no'} · outside models: {', '.join(a.outside_models) or 'none'} · regions: {', '.join(a.regions) if a.regions else 'any'}"
        table.add_row(t.name, t.lane, escape(t.root(storage_root())), escape(key), agreement)
    console.print(table)


@key_app.command("create")
def key_create(tenant: str = typer.Argument(..., help="The tenant (tenants catalog).")) -> None:
    """Make the tenant's local key file (256 random bits, mode 0600, outside the storage root). Refuses to replace one."""
    path = _local_key_file(tenant)
    if path.exists():
        console.print(f"[red]{path} exists already: a tenant's key is never replaced (its data would become unreadable).[/]")
        raise typer.Exit(2)
    console.print(f"created {create_local_key(path, tenant)} at {path}. Back it up: without it the tenant's data cannot be read.")


@key_app.command("disable")
def key_disable(tenant: str = typer.Argument(..., help="The tenant (tenants catalog).")) -> None:
    """Revoke: every later read of the tenant's weights and data fails, naming the key; nothing is deleted."""
    path = _existing_key_file(tenant)
    doc = set_local_key_enabled(path, False)
    console.print(f"disabled {doc['key_id']} of tenant {tenant} at {doc['disabled_at']}; `sinewgrid tenants key enable {tenant}` restores access.")


@key_app.command("enable")
def key_enable(tenant: str = typer.Argument(..., help="The tenant (tenants catalog).")) -> None:
    """Restore access to the tenant's weights and data."""
    path = _existing_key_file(tenant)
    doc = set_local_key_enabled(path, True)
    console.print(f"enabled {doc['key_id']} of tenant {tenant}.")


@key_app.command("rotate")
def key_rotate(tenant: str = typer.Argument(..., help="The tenant (tenants catalog).")) -> None:
    """A new local key for the tenant; the old one kept as a retired key (what it sealed still opens) until `sinewgrid tenants reseal` moves the data."""
    path = _existing_key_file(tenant)
    try:
        old_id, new_id, kept = rotate_local_key(path, tenant)
    except KeyUnavailable as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(2) from None
    console.print(f"tenant {tenant}: new key {new_id} at {path}; the old key {old_id} is kept at {kept}.")
    console.print(f"Data sealed under the old key still opens. Move it to the new key with `sinewgrid tenants reseal {tenant}`; then the old key may go.")


@tenants_app.command("reseal")
def reseal(
    tenant: str = typer.Argument(..., help="The tenant (tenants catalog)."),
    old_kms_key: list[str] = typer.Option([], "--old-kms-key", help="An aws-kms tenant's previous key (id or ARN) that sealed data still under it; repeat for several."),
) -> None:
    """Move all of the tenant's sealed data (objects, checkpoints, registered versions) to its current key and format, checked object by object; run it again to finish a stopped run."""
    from control_plane.tenancy.control import tenant_access
    from data_layer.reseal import ResealCheckFailed, reseal_tenant
    from workload_runtime.envelope import Opener, SealedDataError
    from workload_runtime.keys import KmsKeyring
    from workload_runtime.tenant_access import NotSealedForTenant, register, resolve

    _tenant(tenant)
    try:
        access = tenant_access(storage_root(), tenant)
        keyring = access.keyring(create=False)
    except (UnknownTenant, TenantCatalogError, KeyUnavailable) as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(2) from None
    if keyring is None:
        console.print(f"[red]tenant `{tenant}` has no key: its data is not sealed, there is nothing to reseal.[/]")
        raise typer.Exit(2)
    if old_kms_key and not isinstance(keyring, KmsKeyring):
        console.print(f"[red]--old-kms-key is for a tenant whose key is in KMS; `{tenant}` has a local key (its retired keys are found by `key rotate`).[/]")
        raise typer.Exit(2)
    old = [KmsKeyring(tenant, k, keyring.region, keyring.endpoint, keyring.credentials) for k in old_kms_key] if isinstance(keyring, KmsKeyring) else []

    def opening_key(name: str, key_id: str):  # type: ignore[no-untyped-def]
        named = [k for k in old if name == k.tenant and k.names(key_id)]
        return named[0] if named else resolve(name, key_id)

    register(access.storage_root, keyring)
    try:
        report = reseal_tenant(access.storage_root, keyring, Opener(opening_key), say=lambda line: console.print(escape(line)))
    except (KeyUnavailable, SealedDataError, NotSealedForTenant, ResealCheckFailed) as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        console.print("Nothing that did not check was changed; fix the cause and run the same command again to finish.")
        raise typer.Exit(1) from None
    for line in report.lines():
        console.print(escape(line))


def key_revoked_drill(root: str, out: Path) -> None:
    """`sinewgrid drill -s key-revoked` (drills/key_revoked.py)."""
    from drills.key_revoked import run_key_revoked
    from sinewgrid.instance import get_instance

    with get_instance() as instance:
        report = run_key_revoked(instance, root, out, say=lambda line: console.print(escape(line)))
    console.print(f"report: [bold]{out / 'key-revoked.md'}[/]")
    if not report["passed"]:
        console.print("[red]The key-revoked drill did not pass: see the report.[/]")
        raise typer.Exit(1)
