"""Budgets over GPU hours and model tokens: what each project and tenant has spent of its limits."""

import datetime as dt

import dagster as dg

from control_plane.accounting.budgets import BudgetStatus, budgets_markdown, check, counts_words
from control_plane.accounting.ledger import LedgerConfigError
from control_plane.catalog.budgets import BudgetCatalogError, load_budgets
from platform_location.defs.assets.ledger_reports import REPORT_GROUP
from shared_resources.resources import StorageResource

BUDGETS = dg.AssetKey(["platform", "budgets"])


def budgets_metadata(statuses: list[BudgetStatus], file: str) -> dict[str, dg.MetadataValue]:
    """The table of every budget, its counts by status and its file: the asset's metadata, and
    the observations the `budget_alerts` sensor makes of it."""
    return {
        "budgets": dg.MetadataValue.md(budgets_markdown(statuses)),
        **{f"budgets_{status}": dg.MetadataValue.int(sum(1 for s in statuses if s.status == status)) for status in ("ok", "warn", "over")},
        "budgets_file": dg.MetadataValue.path(file),
        "as_of": dg.MetadataValue.timestamp(dt.datetime.now(dt.UTC)),
    }


@dg.asset(key=BUDGETS, group_name=REPORT_GROUP, kinds={"sql"})
def budgets_report(context: dg.AssetExecutionContext, storage: StorageResource) -> dg.MaterializeResult:
    """What each project and tenant has spent of its budget this period, and whether it is ok,
    warning or over.

    A budget limits a project's or a tenant's dollars (GPU cost plus model token cost), GPU-hours
    and model tokens, per calendar month (UTC) or in all. At its warning level (80% unless it says
    otherwise) the `budget_alerts` sensor records an observation here and calls the alert webhook;
    at its limit new GPU steps and model calls of that project or tenant are refused until the
    limit is raised in the budgets file (SINEWGRID_BUDGETS) or the month ends.
    """
    try:
        catalog = load_budgets()
        statuses = check(storage.get(), catalog)
    except (BudgetCatalogError, LedgerConfigError) as exc:
        raise dg.Failure(description=str(exc)) from exc
    for status in statuses:
        if status.status != "ok":
            context.log.warning(status.message)
    context.log.info(f"{len(statuses)} budget(s): {counts_words(statuses)}")
    return dg.MaterializeResult(metadata=budgets_metadata(statuses, catalog.file))
