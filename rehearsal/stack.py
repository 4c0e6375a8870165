"""The production shape on this machine: `production_stack()` starts it, yields a `Stack`, stops it.

What runs, each for real:
- **PostgreSQL** (testbed/postgres_server.py): one database for the Dagster instance (runs,
  events, schedules, sensor cursors), one for the attempt ledger.
- **A Slurm cluster** (rehearsal/slurm_pool.py), with images: the Cell lane's steady pool, each
  step in a container of the workload image (`srun --container`, Slurm's own OCI support).
- **The cloud account** (rehearsal/account.py) on the S3 API server with IAM, KMS and SQS: the
  platform's root, the step logs, each lab's root sealed with its own KMS key, each party
  signing as its own IAM user, and the queue each lab's bucket announces new drops on.
- **Dagster as deployed**: deploy/dagster.yaml as the instance (PostgreSQL storage, the queued
  run coordinator with its per-lane limits, run monitoring that resumes a run whose worker died,
  step logs on S3); one code server per location (`dagster api grpc`, as the chart's user-code
  deployments run them); `dagster-daemon run`, which ticks the sensors and schedules, dequeues
  runs and watches their workers; and `dagster-webserver`. Each in a container of the
  orchestration image (`make images`) on the host's network, and each run in a container of its
  own (rehearsal/services.py); or, with `image=""`, all as processes of this checkout.

What stands in, and why: the run launcher is Dagster's DockerRunLauncher against podman's
Docker-compatible API where production's K8sRunLauncher needs a Kubernetes API server (as
processes: the DefaultRunLauncher, each run a process of its code server); PostgreSQL listens on
a free port rather than 5432. Nothing else differs from deploy/dagster.yaml (`runnable_here`).
The night of the nightly schedules falls when a test turns the schedule on (`NIGHT_FALLS`).
"""

from __future__ import annotations

import contextlib
import copy
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from control_plane.accounting.ledger import Ledger
from control_plane.settings import child_env
from rehearsal.account import LOG_BUCKET, PLATFORM_BUCKET, PREFIX, Account, provision, queue_setting
from rehearsal.services import (
    RUN_LABEL, Service, StackError, bin_path, launcher, podman_api, remove_run_containers, wait_for_code_server, wait_for_webserver,
)
from rehearsal.slurm_pool import SlurmPool, slurm_pool
from testbed.aws_server import AwsServer, Principal, aws_server
from testbed.ports import free_port
from testbed.postgres_server import PostgresServer

__all__ = ["Stack", "StackError", "production_stack", "runnable_here"]

REPO = Path(__file__).resolve().parent.parent
PRODUCTION_YAML = REPO / "deploy" / "dagster.yaml"
LOCATIONS = {"cell": "cell_lane.definitions", "robotics": "robotics_lane.definitions", "platform": "platform_location.definitions"}
# Where the instance differs from deploy/dagster.yaml (see the module docstring), by config path.
STAND_INS = {("run_launcher",), ("storage", "postgres", "postgres_db", "port"), ("run_monitoring", "max_resume_run_attempts")}
DEFAULT_RUN_LAUNCHER = {"module": "dagster", "class": "DefaultRunLauncher"}
# The rehearsal's clock for nightly schedules: the night falls at every minute, and the schedule
# stays off until a test turns it on (`Stack.set_schedule`); its run keys make one night's sweeps
# happen once however many minutes tick after.
NIGHT_FALLS = "* * * * *"


def runnable_here(production: Mapping[str, Any], port: int, run_launcher: Mapping[str, Any] = DEFAULT_RUN_LAUNCHER) -> dict[str, Any]:
    """deploy/dagster.yaml with only what cannot run here replaced (STAND_INS): the run launcher,
    PostgreSQL's port, and, with the DefaultRunLauncher (which cannot start a new worker for a
    run, so Dagster refuses the setting with it), no resumed runs."""
    config = copy.deepcopy(dict(production))
    config["run_launcher"] = dict(run_launcher)
    config["storage"]["postgres"]["postgres_db"]["port"] = port
    if run_launcher == DEFAULT_RUN_LAUNCHER:
        config["run_monitoring"]["max_resume_run_attempts"] = 0
    return config


def docker_run_launcher(folder: Path, env_names: Iterable[str]) -> dict[str, Any]:
    """Dagster's DockerRunLauncher (through podman's Docker API): each run's worker in a container
    of its code location's image (the code servers' `--container-image`, as the chart sets it), on
    the host's network, with the stack's folder and the variables the chart hands run pods."""
    return {"module": "dagster_docker", "class": "DockerRunLauncher", "config": {
        "network": "host",
        "env_vars": sorted(env_names),
        "container_kwargs": {"volumes": {str(folder): {"bind": str(folder), "mode": "rw"}}, "labels": {RUN_LABEL: str(folder)}},
    }}


@dataclass
class Stack:
    """The running stack: the control plane's environment, the servers, and each lab's uploader."""

    folder: Path
    env: dict[str, str]  # what the code servers, daemon and webserver run with
    aws: AwsServer
    postgres: PostgresServer
    account: Account
    image: str = ""  # the orchestration image the services run in; "" for processes of this checkout
    run_image: str = ""  # the image each run's container starts from
    slurm: SlurmPool | None = None  # the Slurm pool (with images only)
    services: dict[str, Service] = field(default_factory=dict)
    webserver_url: str = ""

    @property
    def uploaders(self) -> dict[str, Principal]:
        """Each lab system's IAM user: its landing prefix only."""
        return self.account.uploaders

    def restart(self, name: str) -> None:
        """Start service `name` again, as its supervisor (Kubernetes, systemd) would after it died."""
        service = self.services[name].start()
        if service.port:
            wait_for_code_server(service)

    def set_schedule(self, location: str, name: str, running: bool) -> None:
        """Turn schedule `name` of `location` on or off, as an operator does (`dagster schedule start|stop`)."""
        done = subprocess.run([bin_path("dagster"), "schedule", "start" if running else "stop", name, "-w", str(self.folder / "workspace.yaml"), "-l", location],
                              env=self.env, cwd=REPO, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise StackError(f"`dagster schedule {'start' if running else 'stop'} {name}` failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")

    def logs(self) -> str:
        services = "\n".join(f"--- {name} ---\n{service.tail(2000)}" for name, service in self.services.items())
        return f"{services}\n{self.slurm.cluster.logs()}" if self.slurm else services


@contextlib.contextmanager
def production_stack(folder: Path | None = None, image: str = "", run_image: str = "") -> Iterator[Stack]:
    """Start everything (see the module docstring), yield it, stop it all on exit. With `image`
    (the orchestration image's tag), the code servers, daemon and webserver each run in a
    container of it, as the chart runs them, and each run in a container of its own, of
    `run_image` (default: `image`); without, as processes of this checkout, each run a process
    of its code server."""
    folder = Path(folder or tempfile.mkdtemp(prefix="sinewgrid-rehearsal-"))
    folder.mkdir(parents=True, exist_ok=True)
    with PostgresServer() as postgres, aws_server() as aws, contextlib.ExitStack() as engines:
        postgres.enable_tls()  # deploy/dagster.yaml asks for `sslmode: require`, as managed PostgreSQL serves
        dagster_db = postgres.create_database("dagster")
        ledger_url = postgres.create_database("ledger")
        Ledger(ledger_url).engine  # its schema through its migrations, once, before any run books an attempt
        account = provision(aws)
        home = folder / "dagster-home"
        home.mkdir(exist_ok=True)
        (folder / "tenants.yaml").write_text(yaml.safe_dump(account.tenants_catalog(aws), sort_keys=False))
        ports = {name: free_port() for name in LOCATIONS}
        (folder / "workspace.yaml").write_text(yaml.safe_dump({"load_from": [
            {"grpc_server": {"host": "127.0.0.1", "port": ports[name], "location_name": name}} for name in LOCATIONS]}))

        own = dict(aws.env(account.control_plane))  # the stack's own variables: what a container is given
        own.update({
            "DAGSTER_HOME": str(home),
            "DAGSTER_PG_USERNAME": "postgres",
            "DAGSTER_PG_PASSWORD": "unchecked",  # the test server trusts loopback; production's comes from a Secret
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_DB": dagster_db.rsplit("/", 1)[1],
            "DAGSTER_COMPUTE_LOG_BUCKET": LOG_BUCKET,
            "DAGSTER_K8S_JOB_NAMESPACE": "sinewgrid-runs",  # read by the K8sRunLauncher only
            "DAGSTER_DISABLE_TELEMETRY": "1",
            "SINEWGRID_HOME": f"s3://{PLATFORM_BUCKET}/{PREFIX}",
            "SINEWGRID_TENANTS": str(folder / "tenants.yaml"),
            "SINEWGRID_LEDGER_URL": ledger_url,
            "SINEWGRID_NODE_CACHE_DIR": str(folder / "node-cache"),
            "SINEWGRID_NIGHTLY_CRON": NIGHT_FALLS,
            **queue_setting(account),
            **account.credentials_env(),
        })
        slurm = None
        if image:  # the Cell lane's steady pool on a Slurm cluster, its steps in the run image (rehearsal/slurm_pool.py)
            slurm = engines.enter_context(slurm_pool(folder, run_image or image, binds=[folder / "node-cache"]))
            (folder / "pools.yaml").write_text(yaml.safe_dump(slurm.catalog(), sort_keys=False))
            own["SINEWGRID_POOLS"] = str(folder / "pools.yaml")
            # The Slurm pool is queued (docs/queues.md): the Cell lane's steps are admitted to it
            # through claims and records in the S3 root, as in production.
            (folder / "quotas.yaml").write_text(yaml.safe_dump(slurm.quotas(), sort_keys=False))
            own["SINEWGRID_QUOTAS"] = str(folder / "quotas.yaml")
        run_launcher = docker_run_launcher(folder, own) if image else DEFAULT_RUN_LAUNCHER
        (home / "dagster.yaml").write_text(yaml.safe_dump(runnable_here(yaml.safe_load(PRODUCTION_YAML.read_text()), postgres.port, run_launcher), sort_keys=False))
        stack = Stack(folder=folder, env={}, aws=aws, postgres=postgres, account=account, image=image, run_image=run_image or image, slurm=slurm)
        try:
            if image:
                # Runs in containers of their own, through podman's Docker API; the images run as an
                # unprivileged user (uid 10001): what they write here must be open to it.
                stack.services["podman-api"], socket_folder, docker_host = podman_api(folder)
                launches = {"mounts": [socket_folder], "extra_env": {"DOCKER_HOST": docker_host}}
                for writable in (home, folder / "node-cache"):
                    writable.mkdir(exist_ok=True)
                    writable.chmod(0o777)
            else:
                launches = {}
            # A process service: this shell's environment without any of its AWS, Dagster or Sinewgrid settings, then the stack's.
            env = {**{k: v for k, v in child_env().items() if not k.startswith(("AWS_", "DAGSTER_", "SINEWGRID_", "DOCKER_"))}, **own}
            stack.env = env
            service = launcher(folder, own, image)
            # The instance's tables, made once before any service opens it (they would race).
            migrated = subprocess.run([bin_path("dagster"), "instance", "migrate"], env=env, cwd=REPO, capture_output=True, text=True)
            if migrated.returncode != 0:
                raise StackError(f"`dagster instance migrate` on {home / 'dagster.yaml'} failed:\n{migrated.stdout[-2000:]}{migrated.stderr[-4000:]}")
            for name, module in LOCATIONS.items():
                command = ["dagster", "api", "grpc", "--module-name", module, "--host", "127.0.0.1", "--port", str(ports[name])]
                if image:  # the image its runs' containers start from, as the chart tells each user-code deployment
                    command += ["--container-image", run_image or image]
                code_server = service(f"code-server-{name}", command, env, port=ports[name])
                stack.services[code_server.name] = code_server.start()
            for name in LOCATIONS:
                wait_for_code_server(stack.services[f"code-server-{name}"])
            # The rehearsal's clock: the night falls every minute, but only once a test turns the schedule on.
            stack.set_schedule("robotics", "nightly_sweep_schedule", running=False)
            workspace = str(folder / "workspace.yaml")
            stack.services["daemon"] = service("daemon", ["dagster-daemon", "run", "-w", workspace], env, **launches).start()
            web_port = free_port()
            stack.services["webserver"] = service("webserver", ["dagster-webserver", "-w", workspace, "-h", "127.0.0.1", "-p", str(web_port)], env, **launches).start()
            stack.webserver_url = f"http://127.0.0.1:{web_port}"
            wait_for_webserver(stack.services["webserver"], stack.webserver_url)
            yield stack
        finally:
            for name, service in reversed(list(stack.services.items())):
                if name == "podman-api":  # the last: the run containers go first, through it
                    remove_run_containers(folder)
                service.stop()
