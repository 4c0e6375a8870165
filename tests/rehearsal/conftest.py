"""The rehearsal's one stack (rehearsal/stack.py), started once for every test of `make rehearsal`.

The test process opens the same instance, ledger and buckets the stack's services use, through
the stack's environment; it never runs a job itself: the daemon does.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import pytest

from rehearsal.services import built_image
from rehearsal.stack import Stack, production_stack

REPO = Path(__file__).resolve().parents[2]
REPORT = REPO / "build" / "rehearsal"  # the stack's logs and the timings, kept after the run
RUN_TIMEOUT_S = 900.0  # a sensor tick (30 s), the run queue, then the run: a training round takes minutes here
FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    """The stack, its services in containers of the orchestration image `make images` built
    (SINEWGRID_REHEARSAL_PROCESSES=1: as processes of this checkout instead)."""
    REPORT.mkdir(parents=True, exist_ok=True)
    in_containers = os.environ.get("SINEWGRID_REHEARSAL_PROCESSES") != "1"
    image, run_image = (built_image("orchestration"), built_image("workload")) if in_containers else ("", "")
    signal.signal(signal.SIGTERM, _interrupted)  # a CI timeout's SIGTERM stops the stack too: no containers or servers left
    with production_stack(REPORT / "stack", image=image, run_image=run_image) as running, pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith(("AWS_", "DAGSTER_", "SINEWGRID_"))]:
            patch.delenv(name)
        for name, value in running.env.items():
            patch.setenv(name, value)
        print(f"rehearsal: UI at {running.webserver_url}, logs in {running.folder}, services in {running.image or 'processes'}")
        yield running


@pytest.fixture(scope="session")
def instance(stack: Stack) -> Iterator[dg.DagsterInstance]:
    """The deployed instance (PostgreSQL), as the daemon and webserver open it."""
    with dg.DagsterInstance.get() as opened:
        yield opened


@pytest.fixture(scope="session")
def timings() -> Iterator[dict[str, float]]:
    """Seconds from a lab's upload to each milestone, written to build/rehearsal/timings.json."""
    measured: dict[str, float] = {}
    yield measured
    (REPORT / "timings.json").write_text(json.dumps(measured, indent=2))


def wait_for_run(instance: dg.DagsterInstance, stack: Stack, matches: Callable[[dg.DagsterRun], bool], what: str,
                 timeout_s: float = RUN_TIMEOUT_S, down: frozenset[str] | set[str] = frozenset()) -> dg.DagsterRun:
    """The first run `matches` accepts, once it has finished; fails with the stack's logs after
    `timeout_s`, or as soon as a service other than those `down` on purpose has exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for run in instance.get_runs(limit=200):
            if matches(run) and run.status in FINISHED:
                return run
        dead = [name for name, service in stack.services.items() if not service.alive and name not in down]
        if dead:
            pytest.fail(f"waiting for {what}: {', '.join(dead)} exited\n{stack.logs()}")
        time.sleep(3)
    pytest.fail(f"no finished run of {what} within {timeout_s:.0f} s\n{stack.logs()}")


def failure_of(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str:
    """Why `run` failed, in its own events' words (each failed step's error and the run's), for an
    assertion's message; the services' logs do not hold a run's own events."""
    lines = []
    for record in instance.all_logs(run.run_id):
        event = record.dagster_event
        if event is not None and event.event_type in (dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE):
            error = getattr(event.event_specific_data, "error", None)
            lines.append(f"{event.event_type.value} {event.step_key or ''}: {event.message or ''}\n{error.to_string() if error else ''}")
    return f"run {run.run_id} ({run.job_name}) is {run.status.value}\n" + "\n".join(lines)


def sensor_cursor(instance: dg.DagsterInstance, name: str, timeout_s: float = 120.0) -> dict:
    """Sensor `name`'s cursor as the daemon last stored it, once it has one (its first tick done)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for state in instance.all_instigator_state():
            cursor = getattr(state.instigator_data, "cursor", None)
            if state.name == name and cursor:
                return json.loads(cursor)
        time.sleep(2)
    pytest.fail(f"sensor {name} stored no cursor within {timeout_s:.0f} s: has the daemon ticked it?")
