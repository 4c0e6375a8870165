"""Budget alerts: a budget that reaches its warning level or its limit is said once per period.

Every minute the `budget_alerts` sensor evaluates every budget (`control_plane/accounting/
budgets.py`). A budget newly at `warn` or `over` in its period (a month, or all time) is shown in
the UI, as an observation of `platform/budgets` with the table of every budget, and POSTed as
JSON to `SINEWGRID_ALERT_WEBHOOK` when one is set (a Slack-style `text` line plus the figures).
What was shown and what was delivered are remembered in the sensor's cursor per budget and
period: a budget that goes from warn to over is said again; a new month starts afresh. A webhook
that fails is logged and tried again on the next tick until it takes the alert.

`alert_round` is the whole tick without Dagster (the sensor calls it; so do the tests).
"""

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import dagster as dg

from control_plane.accounting.budgets import BudgetStatus, check, counts_words
from control_plane.accounting.ledger import LedgerConfigError
from control_plane.catalog.budgets import BudgetCatalogError, load_budgets
from control_plane.settings import settings
from platform_location.defs.assets.budgets import BUDGETS, budgets_metadata
from shared_resources.resources import StorageResource

_RANK = {"warn": 1, "over": 2}


def alerts_due(statuses: list[BudgetStatus], already: Mapping[str, str]) -> list[BudgetStatus]:
    """The budgets at `warn` or `over` that `already` (budget@period -> the level last alerted)
    has not yet seen at that level or a higher one."""
    return [s for s in statuses if s.status in _RANK and _RANK[s.status] > _RANK.get(already.get(s.key, ""), 0)]


def alert_body(status: BudgetStatus) -> dict:
    """The JSON the webhook receives: a `text` line (Slack and most chat webhooks show it) and the figures."""
    word = "OVER BUDGET" if status.status == "over" else "budget warning"
    return {"text": f"Sinewgrid {word}: {status.message}", "source": "sinewgrid", "kind": "budget", **status.to_dict()}


def post_alert(url: str, status: BudgetStatus, timeout: float = 10.0) -> None:
    """POST one alert; raises OSError (URLError, HTTPError, a timeout) when the webhook does not take it."""
    request = urllib.request.Request(
        url, data=json.dumps(alert_body(status)).encode(), method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "sinewgrid-budget-alerts"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - the operator's own webhook
        if not 200 <= response.status < 300:
            raise urllib.error.HTTPError(url, response.status, f"webhook answered {response.status}", response.headers, None)


def webhook_host(url: str) -> str:
    """The webhook's host only: its path often holds a secret token, never logged."""
    return urllib.parse.urlsplit(url).netloc or "the alert webhook"


@dataclass
class AlertRound:
    """One tick: the alerts newly shown, those delivered to the webhook, those it refused, and the new cursor."""

    shown: list[BudgetStatus] = field(default_factory=list)
    sent: list[BudgetStatus] = field(default_factory=list)
    failed: list[tuple[BudgetStatus, str]] = field(default_factory=list)
    cursor: str = ""


def _read_cursor(cursor: str | None) -> tuple[dict[str, str], dict[str, str]]:
    try:
        state = json.loads(cursor) if cursor else {}
    except json.JSONDecodeError:
        state = {}
    return dict(state.get("shown", {})), dict(state.get("posted", {}))


def alert_round(
    statuses: list[BudgetStatus], cursor: str | None, webhook: str, *, post: Callable[[str, BudgetStatus], None] = post_alert
) -> AlertRound:
    """Which budgets to show and to POST now, given what the cursor says was done before; POSTs them."""
    current = {s.key for s in statuses}
    shown, posted = _read_cursor(cursor)
    # Budgets and periods no longer current are forgotten: the cursor stays small.
    shown = {k: v for k, v in shown.items() if k in current}
    posted = {k: v for k, v in posted.items() if k in current}
    found = AlertRound(shown=alerts_due(statuses, shown))
    shown.update({s.key: s.status for s in found.shown})
    if webhook:
        for status in alerts_due(statuses, posted):
            try:
                post(webhook, status)
            except (OSError, ValueError) as exc:  # URLError, HTTPError and timeouts are OSErrors; a malformed URL a ValueError
                found.failed.append((status, f"{type(exc).__name__}: {exc}"))
            else:
                found.sent.append(status)
                posted[status.key] = status.status
    found.cursor = json.dumps({"shown": shown, "posted": posted}, sort_keys=True)
    return found


@dg.sensor(
    name="budget_alerts",
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Every minute, checks every budget (GPU hours and model tokens per project and tenant). A budget newly at its "
        "warning level or over its limit is recorded on platform/budgets and POSTed to SINEWGRID_ALERT_WEBHOOK, once per "
        "budget, level and period; a webhook that fails is tried again next tick."
    ),
)
def budget_alerts(context: dg.SensorEvaluationContext, storage: StorageResource) -> dg.SensorResult | dg.SkipReason:
    try:
        catalog = load_budgets()
        statuses = check(storage.get(), catalog)
    except (BudgetCatalogError, LedgerConfigError) as exc:
        context.log.error(str(exc))
        return dg.SkipReason(f"budgets not checked: {exc}")
    webhook = settings().alert_webhook
    tick = alert_round(statuses, context.cursor, webhook)
    where = webhook_host(webhook)
    for status in tick.shown:
        context.log.warning(f"budget {status.status}: {status.message}")
    for status in tick.sent:
        context.log.info(f"alert for budget `{status.budget.id}` ({status.status}) delivered to {where}")
    for status, error in tick.failed:
        context.log.error(f"alert for budget `{status.budget.id}` ({status.status}) not delivered to {where} ({error}); tried again next tick")
    said = f"{len(statuses)} budget(s): {counts_words(statuses)}"
    if tick.failed:
        said += f"; {len(tick.failed)} alert(s) not delivered to {where}, tried again next tick"
    if not tick.shown:
        return dg.SensorResult(cursor=tick.cursor, skip_reason=dg.SkipReason(f"{said}; nothing new to alert"))
    metadata = {
        **budgets_metadata(statuses, catalog.file),
        "alerts": dg.MetadataValue.md("\n".join(f"- **{s.status}** {s.message}" for s in tick.shown)),
        "webhook": dg.MetadataValue.text(
            "not set (SINEWGRID_ALERT_WEBHOOK): shown here only" if not webhook else f"{len(tick.sent)} delivered, {len(tick.failed)} to retry ({where})"
        ),
    }
    return dg.SensorResult(asset_events=[dg.AssetObservation(asset_key=BUDGETS, metadata=metadata)], cursor=tick.cursor)
