"""The job and schedule that refresh the platform's reports."""

import dagster as dg

from platform_location.defs.assets.capacity_plan import CAPACITY_PLAN
from platform_location.defs.assets.ledger_reports import LEDGER_SUMMARY
from platform_location.defs.assets.queues import GPU_QUEUES

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


gpu_queues_job = dg.define_asset_job(
    "gpu_queues_job", selection=[GPU_QUEUES], description="Refreshes the view of each pool's queue: GPUs by team against quotas, and what waits."
)

gpu_queues_schedule = dg.ScheduleDefinition(
    name="gpu_queues_every_15_minutes",
    job=gpu_queues_job,
    cron_schedule="*/15 * * * *",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Every 15 minutes, refreshes platform/gpu_queues (who holds each pool's GPUs, what waits and why). Off by default: turn it on where pools are queued.",
)
