"""What a tenant's step may put in Dagster's metadata and logs: identifiers, counts and aggregates.

Dagster's run and event databases and its compute logs are the platform's: every tenant's runs
share them, anyone with the UI reads them, and revoking a tenant's key does not reach them. So
where a tenant's data is sealed (its root holds a key in this process), its rows, per-gene
figures, notes and the values a quarantine reason quotes never go there: the metadata says how
many there are and where to open them with the tenant's key (docs/tenancy.md). The platform's
own data, and a tenant without a key, are shown in full as before.
"""

from __future__ import annotations

import dagster as dg
import pandas as pd

from workload_runtime.data_issues import DropIssue
from workload_runtime.tenant_access import keyring_for


def sealed_tenant(root: str) -> str | None:
    """The tenant whose key seals what is written under `root` in this process, or None (plain)."""
    keyring = keyring_for(root)
    return keyring.tenant if keyring is not None else None


def table_or_count(root: str, table: pd.DataFrame, what: str, where: str) -> dg.MetadataValue:
    """`table` as markdown where `root` holds plain data; else only how many `what` and where
    they are (`where`: the sealed file or folder, or the lab's own outbox) to read with the key."""
    tenant = sealed_tenant(root)
    if tenant is None:
        return dg.MetadataValue.md(table.to_markdown(index=False) if len(table) else f"no {what}")
    held = (
        f"in `{where}`, the lab's own outbox, for the lab to read" if keyring_for(where) is None
        else f"in `{where}`, sealed with `{tenant}`'s key: `sinewgrid data decrypt {where} --tenant {tenant} --to DEST` "
        "gives a plain copy to whoever holds it"
    )
    return dg.MetadataValue.md(
        f"{len(table)} {what} of tenant `{tenant}`: not copied here (Dagster's database is shared by every "
        f"tenant's runs and outlives a revoked key). They are {held}."
    )


def issue_text(root: str, issue: DropIssue) -> str:
    """One quarantine reason for a log line or a check's metadata: in full for plain data; for a
    sealed tenant only its rule and where (its message quotes the lab's values)."""
    if sealed_tenant(root) is None:
        return issue.describe()
    return f"{issue.located()} (the full reason, which quotes the lab's data, is in the sealed QUARANTINE.md)"
