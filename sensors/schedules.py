"""Schedules built from arguments (they import no lane)."""

import datetime as dt

import dagster as dg


def make_nightly_schedule(
    *,
    name: str,
    job_name: str,
    night_dimension: str,
    config_dimension: str,
    configs: list[str],
    cron_schedule: str = "0 2 * * *",
    description: str,
) -> dg.ScheduleDefinition:
    """One run per configuration each night, for the night that just ended (partition keys
    night × config). Run keys make a night's runs happen once, however often it is evaluated."""

    @dg.schedule(
        name=name,
        cron_schedule=cron_schedule,
        job_name=job_name,
        execution_timezone="UTC",
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=description,
    )
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

    return _schedule
