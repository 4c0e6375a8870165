"""The production Dagster instance (deploy/dagster.yaml), opened for real.

tests/test_deploy.py checks the file as a schema. Here the same file becomes a live instance:
runs, event logs and schedules on a real PostgreSQL server (tests/fixtures/postgres.py, a
database of this module's own), step logs in a bucket on the suite's S3 API server (moto on
loopback, `s3_endpoint`), runs submitted through its QueuedRunCoordinator and dequeued by the
daemon's own queued-run iteration. A run is submitted with the operator's command
(`dagster job launch`), stays QUEUED until the coordinator daemon takes it, runs to SUCCESS,
and its record, its events and its step's stdout/stderr are read back from PostgreSQL and S3,
through the instance and directly (SQL on the `runs`/`event_logs`/`jobs` tables, boto3 on the
bucket).

What differs from production, and why (`rehearsal.stack.runnable_here`, which `make rehearsal`
uses too; a test asserts these are the only differences from deploy/dagster.yaml):

- `run_launcher`: the K8sRunLauncher needs a Kubernetes API server, and none can run here. The
  DefaultRunLauncher stands in: it starts the run worker from the code server, as the run pod's
  `dagster api execute_run` would. What the K8sRunLauncher would submit is not exercised here
  (its config is validated in tests/test_deploy.py); `make rehearsal` launches each run in a
  container of its own through dagster-docker instead.
- `storage.postgres.postgres_db.port`: the file says 5432, the managed-PostgreSQL port; the test
  server listens on a free loopback port.
- `run_monitoring.max_resume_run_attempts`: 0, as Dagster requires with the DefaultRunLauncher
  (it cannot start a new worker for a run); `make rehearsal` keeps the file's value.

`sslmode: require` is kept: the suite's PostgreSQL serves TLS with a self-signed certificate,
and a test checks the instance's own connection is encrypted.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
import sqlalchemy as sa
import yaml
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.instance.ref import InstanceRef
from dagster._core.launcher import DefaultRunLauncher
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster._core.storage.compute_log_manager import ComputeIOType
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
    QueuedRunCoordinatorDaemon,
)
from dagster_aws.s3.compute_log_manager import S3ComputeLogManager
from dagster_postgres import (
    PostgresEventLogStorage,
    PostgresRunStorage,
    PostgresScheduleStorage,
)

from rehearsal.stack import STAND_INS, runnable_here
from testbed.postgres_server import PostgresServer
from tests import production_instance_location as location

pytestmark = pytest.mark.engines

REPO = Path(__file__).resolve().parent.parent
PRODUCTION_YAML = REPO / "deploy" / "dagster.yaml"
LOCATION_FILE = Path(location.__file__).resolve()
LOCATION_NAME = "production-check"
JOB = "hello_production"
BUCKET = "sinewgrid-compute-logs"
LOG_PREFIX = "dagster/compute-logs"  # what deploy/dagster.yaml says
RUN_TIMEOUT_S = 180

def _without(config: dict[str, Any], paths: set[tuple]) -> dict[str, Any]:
    """A copy of a YAML tree with the entries at `paths` removed."""
    config = copy.deepcopy(config)
    for *parents, last in paths:
        node = config
        for key in parents:
            node = node[key]
        del node[last]
    return config


@dataclass
class ProductionHome:
    home: Path  # DAGSTER_HOME, holding the instance's dagster.yaml
    workspace: Path  # the workspace file loading tests/production_instance_location.py
    database_url: str  # the instance's PostgreSQL database, for direct SQL


@pytest.fixture(scope="module")
def production_home(postgres: PostgresServer, s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProductionHome]:
    """A DAGSTER_HOME holding deploy/dagster.yaml (with the stand-ins), its own database on the
    session's PostgreSQL, a compute-log bucket on the S3 API server, and the environment the
    file reads. The environment is restored after the module."""
    database = f"dagster_{uuid.uuid4().hex[:10]}"
    database_url = postgres.create_database(database)
    home = tmp_path_factory.mktemp("dagster-production-home")
    config = runnable_here(yaml.safe_load(PRODUCTION_YAML.read_text()), postgres.port)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    workspace = home / "workspace.yaml"
    workspace.write_text(yaml.safe_dump({"load_from": [{"python_file": {
        "relative_path": str(LOCATION_FILE), "location_name": LOCATION_NAME, "working_directory": str(REPO)}}]}))
    environment = {
        "DAGSTER_HOME": str(home),
        "DAGSTER_PG_USERNAME": "postgres",
        "DAGSTER_PG_PASSWORD": "unchecked",  # the test server trusts loopback; production's comes from a Secret
        "DAGSTER_PG_HOST": "127.0.0.1",
        "DAGSTER_PG_DB": database,
        "DAGSTER_COMPUTE_LOG_BUCKET": BUCKET,
        "DAGSTER_K8S_JOB_NAMESPACE": "sinewgrid-runs",  # read by the K8sRunLauncher only (not run here)
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in environment.items():
            patch.setenv(name, value)
        s3 = boto3.client("s3")
        if BUCKET not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
            s3.create_bucket(Bucket=BUCKET)
        yield ProductionHome(home=home, workspace=workspace, database_url=database_url)


@pytest.fixture(scope="module")
def production_instance(production_home: ProductionHome) -> Iterator[DagsterInstance]:
    """`DagsterInstance.get()`: the instance DAGSTER_HOME names, as the webserver and daemon open it."""
    instance = DagsterInstance.get()
    try:
        yield instance
    finally:
        instance.dispose()


@pytest.fixture(scope="module")
def workspace_context(production_instance: DagsterInstance, production_home: ProductionHome) -> Iterator[WorkspaceProcessContext]:
    """The workspace as the daemon loads it: the check location in a code server of its own.

    Closed only once the code server runs no run worker: the server looks each finished worker's
    run up in PostgreSQL before it exits, and would hang on retries if the session's server
    were gone by then."""
    with WorkspaceProcessContext(production_instance, WorkspaceFileTarget(paths=[str(production_home.workspace)])) as context:
        try:
            yield context
        finally:
            _wait_until_the_code_server_is_idle(context)


def _wait_until_the_code_server_is_idle(context: WorkspaceProcessContext, timeout_s: float = 60) -> None:
    """Until the code server has no run worker left (each has exited and been cleared)."""
    code_location = context.create_request_context().get_code_location(LOCATION_NAME)
    deadline = time.monotonic() + timeout_s
    while current := code_location.get_current_runs():
        if time.monotonic() > deadline:
            pytest.fail(f"the code server still runs {list(current)} after {timeout_s:.0f}s")
        time.sleep(0.2)


def _sql(production_home: ProductionHome, query: str, **params) -> list[sa.Row]:
    """Rows straight from the instance's PostgreSQL database, not through Dagster."""
    engine = sa.create_engine(production_home.database_url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text(query), params))
    finally:
        engine.dispose()


# --- the instance is the production one ------------------------------------------------------


def test_the_instance_differs_from_deploy_dagster_yaml_only_in_the_stand_ins(production_home: ProductionHome):
    production = yaml.safe_load(PRODUCTION_YAML.read_text())
    opened = yaml.safe_load((production_home.home / "dagster.yaml").read_text())
    assert _without(production, STAND_INS) == _without(opened, STAND_INS)  # everything else is the file's, to the letter
    assert opened["run_launcher"] == {"module": "dagster", "class": "DefaultRunLauncher"}
    assert opened["storage"]["postgres"]["postgres_db"]["port"] != production["storage"]["postgres"]["postgres_db"]["port"] == 5432
    assert production["storage"]["postgres"]["postgres_db"]["params"] == {"sslmode": "require"} == opened["storage"]["postgres"]["postgres_db"]["params"]
    assert production["run_launcher"]["class"] == "K8sRunLauncher"


def test_storage_is_postgresql_over_tls_and_step_logs_go_to_s3(
    production_instance: DagsterInstance, production_home: ProductionHome, postgres: PostgresServer
):
    assert InstanceRef.from_dir(str(production_home.home)).storage_data.class_name == "DagsterPostgresStorage"
    assert isinstance(production_instance.run_storage, PostgresRunStorage)
    assert isinstance(production_instance.event_log_storage, PostgresEventLogStorage)
    assert isinstance(production_instance.schedule_storage, PostgresScheduleStorage)
    assert isinstance(production_instance.compute_log_manager, S3ComputeLogManager)
    assert isinstance(production_instance.run_coordinator, QueuedRunCoordinator)
    assert isinstance(production_instance.run_launcher, DefaultRunLauncher)  # the stand-in for K8sRunLauncher

    # The run queue is the file's: 20 runs at once, each lane capped.
    queue = production_instance.get_concurrency_config().run_queue_config
    assert queue is not None and queue.max_concurrent_runs == 20
    limits = {(limit["key"], limit["value"]): limit["limit"] for limit in queue.tag_concurrency_limits}
    assert limits == {("dagster/code_location", "cell"): 12, ("dagster/code_location", "robotics"): 12, ("dagster/code_location", "platform"): 4}

    # Each storage reaches the database with the file's `sslmode: require`, and the session is encrypted.
    event_logs = production_instance.event_log_storage
    for storage, connect in (
        (production_instance.run_storage, production_instance.run_storage.connect),
        (event_logs, event_logs.index_connection),
        (production_instance.schedule_storage, production_instance.schedule_storage.connect),
    ):
        assert "sslmode=require" in storage.postgres_url
        assert f"@127.0.0.1:{postgres.port}/" in storage.postgres_url
        with connect() as conn:
            assert conn.execute(sa.text("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")).scalar() is True
            assert conn.execute(sa.text("SELECT current_database()")).scalar() == production_home.database_url.rsplit("/", 1)[1]

    # Dagster made its schema in that database.
    tables = {row.tablename for row in _sql(production_home, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert {"runs", "event_logs", "jobs", "job_ticks", "instigators", "alembic_version"} <= tables


# --- a run, end to end -----------------------------------------------------------------------


def _launch_with_the_cli(production_home: ProductionHome) -> None:
    """`dagster job launch`, as an operator submits a run: a process of its own that opens the
    instance from DAGSTER_HOME and hands the run to the instance's run coordinator."""
    done = subprocess.run(
        [sys.executable, "-m", "dagster", "job", "launch", "-w", str(production_home.workspace), "-l", LOCATION_NAME, "-j", JOB],
        check=False, capture_output=True, text=True, timeout=180, cwd=production_home.home,
    )
    assert done.returncode == 0, f"dagster job launch failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"


def _wait_until_finished(instance: DagsterInstance, run_id: str) -> DagsterRunStatus:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        run = instance.get_run_by_id(run_id)
        assert run is not None
        if run.is_finished:
            return run.status
        if time.monotonic() > deadline:
            pytest.fail(f"run {run_id} still {run.status} after {RUN_TIMEOUT_S}s")
        time.sleep(0.5)


def test_a_queued_run_is_launched_and_its_logs_are_read_back(
    production_instance: DagsterInstance, production_home: ProductionHome, workspace_context: WorkspaceProcessContext
):
    instance = production_instance
    _launch_with_the_cli(production_home)
    runs = instance.get_runs(filters=RunsFilter(job_name=JOB))
    assert len(runs) == 1, runs
    run_id = runs[0].run_id

    # The QueuedRunCoordinator holds it: nothing runs it until the daemon dequeues it.
    assert runs[0].status == DagsterRunStatus.QUEUED
    assert _sql(production_home, "SELECT status FROM runs WHERE run_id = :run_id", run_id=run_id)[0].status == "QUEUED"

    # One iteration of the daemon's queued-run coordinator: within the queue's limits, so it
    # dequeues the run and the run launcher starts it from the code server.
    daemon = QueuedRunCoordinatorDaemon(interval_seconds=1)
    try:
        list(daemon.run_iteration(workspace_context))
    finally:
        daemon.__exit__(None, None, None)
    status = _wait_until_finished(instance, run_id)
    _wait_until_the_code_server_is_idle(workspace_context)  # the run worker has exited: every event is written
    messages = [entry.message for entry in instance.all_logs(run_id)]
    assert status == DagsterRunStatus.SUCCESS, "\n".join(messages)

    # Through the instance: the run record and its events.
    record = instance.get_run_record_by_id(run_id)
    assert record is not None and record.dagster_run.status == DagsterRunStatus.SUCCESS
    events = instance.all_logs(run_id)
    types = {entry.dagster_event.event_type for entry in events if entry.dagster_event}
    assert {DagsterEventType.RUN_ENQUEUED, DagsterEventType.RUN_STARTING, DagsterEventType.RUN_START, DagsterEventType.STEP_SUCCESS, DagsterEventType.LOGS_CAPTURED, DagsterEventType.RUN_SUCCESS} <= types
    assert location.LOG_MESSAGE in {entry.user_message for entry in events}

    # Straight from PostgreSQL: the same run and events are rows in its tables.
    [row] = _sql(production_home, "SELECT pipeline_name, status FROM runs WHERE run_id = :run_id", run_id=run_id)
    assert (row.pipeline_name, row.status) == (JOB, "SUCCESS")
    rows = _sql(production_home, "SELECT dagster_event_type, event FROM event_logs WHERE run_id = :run_id ORDER BY id", run_id=run_id)
    assert len(rows) == len(events)
    sql_types = [r.dagster_event_type for r in rows if r.dagster_event_type]
    assert sql_types[0] == DagsterEventType.RUN_ENQUEUED.value  # the stored names are the old PIPELINE_* ones
    assert {e.value for e in (DagsterEventType.RUN_SUCCESS, DagsterEventType.STEP_SUCCESS, DagsterEventType.LOGS_CAPTURED)} <= set(sql_types)
    assert any(location.LOG_MESSAGE in r.event for r in rows)

    # The step's stdout and stderr are in the bucket, under the file's prefix.
    [captured] = [e.dagster_event.logs_captured_data for e in events if e.dagster_event and e.dagster_event.event_type == DagsterEventType.LOGS_CAPTURED]
    assert captured.step_keys == ["say_hello"]
    log_key = [run_id, "compute_logs", captured.file_key]
    s3 = boto3.client("s3")
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{LOG_PREFIX}/storage/{run_id}/")
    keys = {item["Key"] for item in listed.get("Contents", [])}
    out_key = f"{LOG_PREFIX}/storage/{run_id}/compute_logs/{captured.file_key}.out"
    err_key = f"{LOG_PREFIX}/storage/{run_id}/compute_logs/{captured.file_key}.err"
    assert {out_key, err_key} <= keys, keys
    assert location.STDOUT_LINE in s3.get_object(Bucket=BUCKET, Key=out_key)["Body"].read().decode()
    assert location.STDERR_LINE in s3.get_object(Bucket=BUCKET, Key=err_key)["Body"].read().decode()

    # Through the instance's compute log manager, as the UI reads them once the run pod is gone:
    # with the local copies removed, it fetches both from S3.
    manager = instance.compute_log_manager
    assert isinstance(manager, S3ComputeLogManager)
    manager.local_manager.delete_logs(log_key=log_key)
    try:
        assert not manager.has_local_file(log_key, ComputeIOType.STDOUT)
        data = manager.get_log_data(log_key)
        assert data.stdout is not None and location.STDOUT_LINE in data.stdout.decode()
        assert data.stderr is not None and location.STDERR_LINE in data.stderr.decode()
    finally:
        manager.local_manager.delete_logs(prefix=[run_id])  # the downloaded copies, in the system temp folder


def test_schedule_state_is_stored_in_postgresql(
    production_instance: DagsterInstance, production_home: ProductionHome, workspace_context: WorkspaceProcessContext
):
    request_context = workspace_context.create_request_context()
    repository = request_context.get_code_location(LOCATION_NAME).get_repository("__repository__")
    schedule = repository.get_schedule("hello_nightly")
    origin_id, selector_id = schedule.get_remote_origin_id(), schedule.selector_id
    query = "SELECT job_type, status, job_body FROM jobs WHERE job_origin_id = :origin_id"
    production_instance.start_schedule(schedule)
    try:
        state = production_instance.get_instigator_state(origin_id, selector_id)
        assert state is not None and state.is_running
        [row] = _sql(production_home, query, origin_id=origin_id)
        assert (row.job_type, row.status) == ("SCHEDULE", "RUNNING") and "hello_nightly" in row.job_body
    finally:
        production_instance.stop_schedule(origin_id, selector_id, schedule)
    [row] = _sql(production_home, query, origin_id=origin_id)
    assert row.status == "STOPPED"
