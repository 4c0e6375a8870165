"""What an asset returns when it sends a drop to quarantine: the same shape in every lane."""

from __future__ import annotations

import dagster as dg

from control_plane.intake.landing import quarantine_drop
from control_plane.tenancy.shown import issue_text, sealed_tenant
from workload_runtime.data_issues import DropIssue
from workload_runtime.storage import Storage

_WHERE_FIELDS = ("file", "row", "well", "column")


def issues_markdown(issues: list[DropIssue], limit: int = 50, *, sealed_for: str | None = None) -> str:
    """A table of what is wrong and where, with only the location columns the issues use.

    `sealed_for`: the drop is that tenant's sealed data, so the messages (which quote its values)
    stay in its sealed QUARANTINE.md and the table shows each rule and where it broke."""
    fields = [f for f in _WHERE_FIELDS if any(getattr(i, f) not in (None, "") for i in issues)]
    lines = ["| " + " | ".join([*fields, "rule", "what to do"]) + " |", "|" + "---|" * (len(fields) + 2)]
    for issue in issues[:limit]:
        cells = [str(getattr(issue, f)) if getattr(issue, f) not in (None, "") else "" for f in fields]
        what = f"in QUARANTINE.md, sealed with `{sealed_for}`'s key" if sealed_for else issue.message.replace("|", "/")
        lines.append("| " + " | ".join([*cells, f"`{issue.rule}`", what]) + " |")
    if len(issues) > limit:
        lines.append("| " + " | ".join(["…"] + [""] * len(fields)) + f" | and {len(issues) - limit} more in QUARANTINE.json |")
    return "\n".join(lines)


def quarantined(
    context: dg.AssetExecutionContext,
    store: Storage,
    kind: str,
    drop_id: str,
    issues: list[DropIssue],
    *,
    stage: str,
    check_results: list[dg.AssetCheckResult],
    metadata: dict | None = None,
) -> dg.MaterializeResult:
    """Copy the drop to quarantine with its reasons and return the asset's result for it.

    The failing (blocking) checks in `check_results` stop the run here; the metadata carries
    the reasons as a table, so the UI shows what to fix without opening a file. Under a tenant's
    root the copied files and the reasons are sealed with the tenant's key (`quarantine_drop`), and
    the table and the log name each rule and where it broke, not the values it quotes.
    `metadata`: more entries for the result (the tenant, say).
    """
    where = quarantine_drop(store, kind, drop_id, issues, stage=stage)
    context.log.error(f"{kind} drop {drop_id} quarantined at {where}:\n" + "\n".join(issue_text(store.root, i) for i in issues[:20]))
    return dg.MaterializeResult(
        metadata={
            "status": "quarantined",
            **(metadata or {}),
            "quarantine": dg.MetadataValue.path(where),
            "reasons": dg.MetadataValue.md(issues_markdown(issues, sealed_for=sealed_tenant(store.root))),
        },
        check_results=check_results,
    )
