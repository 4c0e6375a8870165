"""A tiny code location that tests/test_production_instance.py runs on the production instance
(deploy/dagster.yaml): one job whose step logs an event and prints to stdout and stderr, and a
schedule to store. Only Dagster itself is imported, so its code server starts quickly."""

import sys

import dagster as dg

STDOUT_LINE = "sinewgrid production-instance check: printed to stdout by the step"
STDERR_LINE = "sinewgrid production-instance check: printed to stderr by the step"
LOG_MESSAGE = "sinewgrid production-instance check: logged through context.log"


@dg.op
def say_hello(context: dg.OpExecutionContext) -> int:
    context.log.info(LOG_MESSAGE)
    print(STDOUT_LINE, flush=True)
    print(STDERR_LINE, file=sys.stderr, flush=True)
    return 42


@dg.job
def hello_production():
    say_hello()


hello_nightly = dg.ScheduleDefinition(job=hello_production, cron_schedule="0 3 * * *", name="hello_nightly")

defs = dg.Definitions(jobs=[hello_production], schedules=[hello_nightly])
