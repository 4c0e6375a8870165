"""What an asset does when it sends a drop to quarantine: the same in every lane."""

from __future__ import annotations

from typing import NoReturn

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
) -> NoReturn:
    """Copy the drop to quarantine with its reasons, and fail the asset's partition for it.

    A quarantined drop is not good data, and the UI shows it as Dagster shows anything that
    failed: the partition reads *Failed* (no materialization is recorded for it), its checks
    (`check_results`) are red, and the run fails with the reasons. An observation of the
    partition keeps what a user needs beside it: `status: quarantined`, where the copy is and
    a table of what to fix (so the UI shows it without opening a file). Under a tenant's root
    the copied files and the reasons are sealed with the tenant's key (`quarantine_drop`), and
    the table and the log name each rule and where it broke, not the values it quotes.
    `metadata`: more entries for the observation (the tenant, say).
    """
    where = quarantine_drop(store, kind, drop_id, issues, stage=stage)
    rules = sorted({i.rule for i in issues})
    facts = {
        "status": "quarantined",
        **(metadata or {}),
        "stage": stage,
        "issues": len(issues),
        "quarantine": dg.MetadataValue.path(where),
        "reasons": dg.MetadataValue.md(issues_markdown(issues, sealed_for=sealed_tenant(store.root))),
    }
    context.log_event(dg.AssetObservation(asset_key=context.asset_key, partition=context.partition_key if context.has_partition_key else None, metadata=facts))
    for check in check_results:
        context.log_event(
            dg.AssetCheckEvaluation(
                asset_key=context.asset_key, check_name=check.check_name, passed=bool(check.passed), metadata=check.metadata, severity=check.severity, description=check.description
            )
        )
    context.log.error(f"{kind} drop {drop_id} quarantined at {where}:\n" + "\n".join(issue_text(store.root, i) for i in issues[:20]))
    raise dg.Failure(
        description=(
            f"{kind} drop {drop_id} is quarantined ({stage}): {len(issues)} issue(s), {', '.join(rules)}. "
            f"Its files are kept at {where} with QUARANTINE.md saying what to fix: send it again, corrected, under a new id."
        ),
        metadata={"quarantine": dg.MetadataValue.path(where), "issues": len(issues)},
        allow_retries=False,
    )
