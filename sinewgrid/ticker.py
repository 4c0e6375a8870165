"""Evaluate every sensor of a code location once and run what it asks for, in this process.

This is what the Dagster daemon does on each tick, done once and synchronously, so the
loop can be driven from a terminal or a test against the same instance the UI shows.
Sensor cursors are kept in the instance's key-value store; run keys are honoured as
the daemon honours them (a run key already used by the sensor or schedule is not run again), and
so are a sensor's dynamic partition requests (added and deleted) and asset events. Everything
comes from `import dagster as dg`, no private `dagster._` module. Dagster has no public call for
a sensor's stored cursor (the daemon keeps it in its instigator state, reached only through
private modules), hence the key-value store (`instance.run_storage`, the instance's own storage).
"""

from __future__ import annotations

import importlib
import time
from datetime import UTC, datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import yaml

from control_plane.settings import REPO_ROOT
from control_plane.signals import sigterm_kept

RUN_KEY_TAG = "dagster/run_key"
SENSOR_NAME_TAG = "dagster/sensor_name"
SCHEDULE_NAME_TAG = "dagster/schedule_name"


@dataclass
class RunOutcome:
    job: str
    partition: str | None
    run_id: str
    success: bool
    seconds: float
    failure: str | None = None
    quarantined: list[str] = field(default_factory=list)


@dataclass
class SensorTick:
    location: str
    sensor: str
    skipped: str | None = None
    new_partitions: list[str] = field(default_factory=list)
    deleted_partitions: list[str] = field(default_factory=list)
    runs: list[RunOutcome] = field(default_factory=list)
    already_run: list[str] = field(default_factory=list)
    asset_events: list[str] = field(default_factory=list)


def workspace_locations(workspace: Path = REPO_ROOT / "workspace.yaml") -> dict[str, str]:
    """Code location name → definitions module, read from workspace.yaml."""
    doc = yaml.safe_load(workspace.read_text())
    locations = {}
    for entry in doc.get("load_from", []):
        module = entry.get("python_module")
        if module:
            locations[module.get("location_name", module["module_name"])] = module["module_name"]
    return locations


def load_definitions(module_name: str) -> dg.Definitions:
    module = importlib.import_module(module_name)
    return module.defs


def _cursor_key(location: str, sensor: str) -> str:
    return f"sinewgrid/cli/sensor_cursor/{location}/{sensor}"


def _quarantined(result: dg.ExecuteInProcessResult) -> list[str]:
    """Where the run put the drops it rejected: each quarantine fails its step with a `dg.Failure`
    whose metadata names the copy (control_plane/intake/quarantine.py)."""
    found = []
    for event in result.all_events:
        failure = event.step_failure_data.user_failure_data if event.is_step_failure and event.step_failure_data else None
        if failure is not None and "quarantine" in failure.metadata:
            found.append(str(failure.metadata["quarantine"].value))
    return found


def _first_failure(result: dg.ExecuteInProcessResult) -> str | None:
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data and event.step_failure_data.error:
            return f"{event.step_key}: {event.step_failure_data.error.message.strip().splitlines()[0]}"
    return None if result.success else "run failed"


def tick_sensor(
    location: str,
    defs: dg.Definitions,
    sensor: dg.SensorDefinition,
    instance: dg.DagsterInstance,
    on_run: Callable[[str, str | None], None] | None = None,
    log_level: str | None = None,
) -> SensorTick:
    key = _cursor_key(location, sensor.name)
    cursor = instance.run_storage.get_cursor_values({key}).get(key)
    tick = SensorTick(location, sensor.name)
    # The instance goes in as its reference, as the daemon passes it: only then does the context
    # load dynamic partitions, which a run request for a partition just added is checked against.
    with dg.build_sensor_context(
        instance_ref=instance.get_ref(), cursor=cursor, definitions=defs, sensor_name=sensor.name, resources=defs.resources
    ) as context:
        data = sensor.evaluate_tick(context)
    for request in data.dynamic_partitions_requests or []:
        if isinstance(request, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
            tick.new_partitions.extend(request.partition_keys)
        elif isinstance(request, dg.DeleteDynamicPartitionsRequest):
            for partition_key in request.partition_keys:
                instance.delete_dynamic_partition(request.partitions_def_name, partition_key)
            tick.deleted_partitions.extend(request.partition_keys)
    if data.cursor is not None and data.cursor != cursor:
        instance.run_storage.set_cursor_values({key: data.cursor})
    for event in data.asset_events or []:
        instance.report_runless_asset_event(event)  # what the daemon does with a sensor's asset events
        tick.asset_events.append(event.asset_key.to_user_string())
    if not data.run_requests:
        tick.skipped = data.skip_message or "nothing requested"
    if data.run_requests:  # a sensor without a job (the watcher) requests no runs
        _run_requests(tick, defs, instance, data.run_requests, sensor.job_name, SENSOR_NAME_TAG, sensor.name, on_run, log_level)
    return tick


def _run_requests(
    tick: "SensorTick",
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    requests: list[dg.RunRequest],
    default_job: str | None,
    origin_tag: str,
    origin_name: str,
    on_run: Callable[[str, str | None], None] | None,
    log_level: str | None,
) -> None:
    """Run each request in this process, unless its run key was used before by the same origin."""
    for request in requests:
        job_name = request.job_name or default_job
        if request.run_key:
            used = instance.get_run_records(filters=dg.RunsFilter(tags={origin_tag: origin_name, RUN_KEY_TAG: request.run_key}), limit=1)
            if used:
                tick.already_run.append(request.run_key)
                continue
        if on_run:
            on_run(job_name, request.partition_key)
        job = defs.resolve_job_def(job_name)
        tags = {**request.tags, origin_tag: origin_name, **({RUN_KEY_TAG: request.run_key} if request.run_key else {})}
        run_config = dict(request.run_config or {})
        if log_level:
            run_config.setdefault("loggers", {"console": {"config": {"log_level": log_level}}})
        started = time.monotonic()
        with sigterm_kept():
            result = job.execute_in_process(
                instance=instance,
                partition_key=request.partition_key,
                run_config=run_config or None,
                tags=tags,
                raise_on_error=False,
            )
        tick.runs.append(
            RunOutcome(
                job_name,
                request.partition_key,
                result.run_id,
                result.success,
                time.monotonic() - started,
                _first_failure(result),
                _quarantined(result),
            )
        )


def tick_schedule(
    location: str,
    defs: dg.Definitions,
    schedule: dg.ScheduleDefinition,
    instance: dg.DagsterInstance,
    on_run: Callable[[str, str | None], None] | None = None,
    log_level: str | None = None,
) -> "SensorTick":
    """Evaluate a schedule as of now and run what it requests (each run key once)."""
    tick = SensorTick(location, schedule.name)
    with dg.build_schedule_context(
        instance=instance, scheduled_execution_time=datetime.now(UTC), repository_def=defs.get_repository_def()
    ) as context:
        data = schedule.evaluate_tick(context)
    if not data.run_requests:
        tick.skipped = data.skip_message or "nothing requested"
    _run_requests(tick, defs, instance, list(data.run_requests or []), schedule.job_name, SCHEDULE_NAME_TAG, schedule.name, on_run, log_level)
    return tick


def tick_all(
    instance: dg.DagsterInstance,
    locations: dict[str, str] | None = None,
    on_run: Callable[[str, str | None], None] | None = None,
    log_level: str | None = None,
) -> list[SensorTick]:
    """One tick of every schedule, then every sensor (upstream first), in every code location."""
    ticks = []
    for location, module_name in (locations or workspace_locations()).items():
        defs = load_definitions(module_name)
        for schedule in defs.schedules or []:
            ticks.append(tick_schedule(location, defs, schedule, instance, on_run, log_level))
        for sensor in upstream_first(defs, list(defs.sensors or [])):
            ticks.append(tick_sensor(location, defs, sensor, instance, on_run, log_level))
    return ticks


def upstream_first(defs: dg.Definitions, sensors: list[dg.SensorDefinition]) -> list[dg.SensorDefinition]:
    """The sensors in the order work flows: one whose job materializes assets nearer the roots of
    the asset graph ticks first, so a tick ingests new drops before it retrains on them; sensors
    that run no job (the in-flight watcher) tick last."""
    levels = {key: i for i, level in enumerate(defs.resolve_asset_graph().toposorted_asset_keys_by_level) for key in level}

    def rank(sensor: dg.SensorDefinition) -> tuple[float, str]:
        try:
            keys = defs.resolve_job_def(sensor.job_name).asset_layer.selected_asset_keys
        except dg.DagsterInvalidDefinitionError:
            return float("inf"), sensor.name
        return min((levels.get(key, 0) for key in keys), default=0), sensor.name

    return sorted(sensors, key=rank)
