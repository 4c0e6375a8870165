"""The platform code location: cross-lane views — what the GPU work cost and how much was useful,
where the lanes' calendar will run next (the capacity plan), how the platform recovers
from faults (the failure drills), and the data layer (dataset versions, training runs,
checkpoint retention)."""

import dagster as dg

from platform_location.assets import capacity_plan, data_layer, drills, ledger_reports
from platform_location.jobs import daily_ledger_report, ledger_report_job
from shared_resources.resources import platform_resources

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([ledger_reports, capacity_plan, drills, data_layer]),
    jobs=[ledger_report_job],
    schedules=[daily_ledger_report],
    resources=platform_resources(),
)
