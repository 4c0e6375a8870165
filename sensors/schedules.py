"""Schedules built from arguments (they import no lane)."""

import datetime as dt
import re

import dagster as dg

from control_plane.settings import settings

DAILY = re.compile(r"^(\d{1,2}) (\d{1,2}) \* \* \*$")


def when(cron: str) -> str:
    """A cron string in words, for a schedule's description: "Every night at 02:00 UTC"."""
    daily = DAILY.match(cron.strip())
    if daily:
        minute, hour = (int(g) for g in daily.groups())
        return f"Every night at {hour:02}:{minute:02} UTC"
    return f"On the cron `{cron}` (UTC; SINEWGRID_NIGHTLY_CRON)"


def make_nightly_schedule(
    *,
    name: str,
    job_name: str,
    night_dimension: str,
    config_dimension: str,
    configs: list[str],
    cron_schedule: str | None = None,
    description: str,
) -> dg.ScheduleDefinition:
    """One run per configuration each night, for the night that just ended (partition keys
    night × config). Run keys make a night's runs happen once, however often it is evaluated.
    The night falls at `cron_schedule`, by default the deployment's `SINEWGRID_NIGHTLY_CRON`
    (02:00 UTC unless set); `{when}` in the description becomes it in words."""
    cron_schedule = cron_schedule or settings().nightly_cron

    def _schedule(context: dg.ScheduleEvaluationContext):
        now = context.scheduled_execution_time or dt.datetime.now(dt.UTC)
        night = (now - dt.timedelta(days=1)).strftime("%Y-%m-%d")
        return [
            dg.RunRequest(
                run_key=f"{night}/{config}",
                partition_key=dg.MultiPartitionKey({night_dimension: night, config_dimension: config}),
                tags={"sinewgrid/night": night, "sinewgrid/sweep": config},
            )
            for config in configs
        ]

    try:  # Dagster checks the cron string here
        return dg.schedule(
            name=name,
            cron_schedule=cron_schedule,
            job_name=job_name,
            execution_timezone="UTC",
            default_status=dg.DefaultScheduleStatus.RUNNING,
            description=description.replace("{when}", when(cron_schedule)),
        )(_schedule)
    except dg.DagsterInvalidDefinitionError as exc:
        raise ValueError(
            f"schedule {name}: {cron_schedule!r} is not a cron string (SINEWGRID_NIGHTLY_CRON, or the code's default); "
            "write five fields, minute hour day month weekday, e.g. `0 2 * * *` for 02:00 UTC every night"
        ) from exc
