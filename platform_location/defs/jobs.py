"""The job and schedule that refresh the platform's reports."""

import dagster as dg

from platform_location.defs.assets.capacity_plan import CAPACITY_PLAN
from platform_location.defs.assets.ledger_reports import LEDGER_SUMMARY

ledger_report_job = dg.define_asset_job(
    "ledger_report_job",
    selection=[LEDGER_SUMMARY, CAPACITY_PLAN],
    description="Rebuilds the cost and goodput report from the attempt ledger, and the capacity plan of the lanes' calendar.",
)

daily_ledger_report = dg.ScheduleDefinition(
    name="daily_ledger_report",
    job=ledger_report_job,
    cron_schedule="0 6 * * *",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every morning at 06:00 UTC, refreshes the cost and goodput report with yesterday's GPU attempts, and re-plans the lanes' calendar on current prices.",
)
