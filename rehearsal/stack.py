"""The production shape on this machine: `production_stack()` starts it, yields a `Stack`, stops it.

What runs, each for real:
- **PostgreSQL** (testbed/postgres_server.py): one database for the Dagster instance (runs,
  events, schedules, sensor cursors), one for the attempt ledger.
- **The S3 API** with IAM and KMS enforced (testbed/aws_server.py, moto on loopback): the
  platform's root in bucket `platform`, step logs in `dagster-logs`, each lab's root in its own
  bucket sealed with its own KMS key. The control plane signs as its own IAM user (the platform's
  buckets and the labs' roots, as deploy/tenancy/ grants it in a customer's account); each lab's
  workloads sign as that lab's user (the tenants catalog names its credentials), allowed its own
  bucket only; each lab's system uploads as a user allowed its landing prefix only.
- **Dagster as deployed**: deploy/dagster.yaml as the instance (PostgreSQL storage, the queued
  run coordinator with its per-lane limits, run monitoring, step logs on S3); one code server
  per location (`dagster api grpc`, as the chart's user-code deployments run them);
  `dagster-daemon run`, which ticks the sensors and schedules and dequeues runs; and
  `dagster-webserver`. Each in a container of the orchestration image (`make images`) on the
  host's network, or as processes of this checkout (`image=""`).

What stands in, and why: the run launcher is Dagster's DefaultRunLauncher (each run is a
process the code server starts) where production's K8sRunLauncher needs a Kubernetes API
server; PostgreSQL listens on a free port rather than 5432. Nothing else differs from
deploy/dagster.yaml (`runnable_here`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from control_plane.accounting.ledger import Ledger
from control_plane.settings import child_env
from testbed.aws_server import AwsServer, Principal, aws_server
from testbed.ports import free_port
from testbed.postgres_server import PostgresServer

REPO = Path(__file__).resolve().parent.parent
PRODUCTION_YAML = REPO / "deploy" / "dagster.yaml"
LOCATIONS = {"cell": "cell_lane.definitions", "robotics": "robotics_lane.definitions", "platform": "platform_location.definitions"}
LABS = ("lab-a", "lab-b")
PLATFORM_BUCKET, LOG_BUCKET = "platform", "dagster-logs"
PREFIX = "rehearsal"  # every root's prefix in its bucket
IMAGES_JSON = REPO / "build" / "images" / "images.json"  # what `make images` built
CONTAINERS_CONF = REPO / "build" / "containers" / "containers.conf"  # podman's settings for this machine, written by `make images`
START_TIMEOUT_S = 240.0  # a code server loads its location in ~20 s on a quiet 2-core machine
# Where the instance differs from deploy/dagster.yaml (see the module docstring), by config path.
STAND_INS = {("run_launcher",), ("storage", "postgres", "postgres_db", "port")}


class StackError(RuntimeError):
    """A part of the stack did not start; the message names it and ends with its log."""


def runnable_here(production: Mapping[str, Any], port: int) -> dict[str, Any]:
    """deploy/dagster.yaml with only what cannot run here replaced (STAND_INS)."""
    config = copy.deepcopy(dict(production))
    config["run_launcher"] = {"module": "dagster", "class": "DefaultRunLauncher"}
    config["storage"]["postgres"]["postgres_db"]["port"] = port
    return config


def lab_bucket(lab: str) -> str:
    return f"{lab}-data"


def lab_root(lab: str) -> str:
    """A lab's storage root, in its own bucket."""
    return f"s3://{lab_bucket(lab)}/{PREFIX}"


@dataclass
class Service:
    """One long-running process of the stack: its command, environment and log. With `container`,
    `argv` is a `podman run` of that name, and stopping or killing it acts on the container."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    container: str = ""
    port: int = 0  # a code server's gRPC port, asked before the server counts as started
    process: subprocess.Popen | None = None

    def start(self) -> Service:
        if self.container:
            _podman("rm", "-f", self.container)  # the one a kill left, or a killed earlier rehearsal's
        with self.log.open("ab") as log:
            # Its own process group: what it starts (a code server's run workers) stops with it.
            self.process = subprocess.Popen(self.argv, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self, group: bool = True) -> None:
        """SIGKILL, as a node's failure or the kernel's OOM killer would end it: no clean shutdown.
        `group=False` kills the service alone and leaves what it started (a code server's run
        workers, which in production are pods of their own) running."""
        if self.process is None:
            return
        if self.container:  # the container and all in it, as a node's failure would
            _podman("kill", self.container)
        else:
            with contextlib.suppress(ProcessLookupError):
                if group:
                    os.killpg(self.process.pid, signal.SIGKILL)
                else:
                    self.process.kill()
        self.process.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM to its group, SIGKILL after 20 s."""
        if self.process is None or self.process.poll() is not None:
            return
        if self.container:
            _podman("stop", "-t", "20", self.container)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill()

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@dataclass
class Stack:
    """The running stack: the control plane's environment, the servers, and each lab's uploader."""

    folder: Path
    env: dict[str, str]  # what the code servers, daemon and webserver run with
    aws: AwsServer
    postgres: PostgresServer
    uploaders: dict[str, Principal]  # each lab system's IAM user: its landing prefix only
    image: str = ""  # the orchestration image the services run in; "" for processes of this checkout
    services: dict[str, Service] = field(default_factory=dict)
    webserver_url: str = ""

    def restart(self, name: str) -> None:
        """Start service `name` again, as its supervisor (Kubernetes, systemd) would after it died."""
        service = self.services[name].start()
        if service.port:
            _wait_for_code_server(service)

    def logs(self) -> str:
        return "\n".join(f"--- {name} ---\n{service.tail(2000)}" for name, service in self.services.items())


def _control_plane_policy() -> list[dict[str, Any]]:
    """The control plane's own IAM user: the platform's root, the step-log bucket and each lab's
    root (it ingests, validates and registers a lab's data, as deploy/tenancy/'s control-plane
    policy grants in a customer's account); a lab's *workloads* get that lab's user instead."""
    buckets = (PLATFORM_BUCKET, LOG_BUCKET, *map(lab_bucket, LABS))
    return [
        {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
         "Resource": [f"arn:aws:s3:::{b}/*" for b in buckets]},
        {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:HeadBucket"], "Resource": [f"arn:aws:s3:::{b}" for b in buckets]},
    ]


def _uploader_policy(lab: str) -> list[dict[str, Any]]:
    """A lab system's IAM user: it writes under its landing prefix, and reads nothing else."""
    return [{"Effect": "Allow", "Action": ["s3:PutObject", "s3:AbortMultipartUpload"],
             "Resource": [f"arn:aws:s3:::{lab_bucket(lab)}/{PREFIX}/landing/*"]}]


def _env_name(lab: str) -> str:
    return lab.upper().replace("-", "_")


def _tenants_catalog(aws: AwsServer, keys: Mapping[str, str]) -> dict[str, Any]:
    return {
        "tenants": {
            lab: {
                "lane": "cell",
                "storage": lab_root(lab),
                "credentials": {"env": _env_name(lab)},
                "key": {"kind": "aws-kms", "key_id": keys[lab], "endpoint": aws.endpoint, "region": "us-east-1"},
            }
            for lab in LABS
        }
    }


def _wait_for_code_server(service: Service, timeout_s: float = START_TIMEOUT_S) -> None:
    port = service.port
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not service.alive:
            raise StackError(f"code server {service.name} exited while loading:\n{service.tail()}")
        probe = subprocess.run([_bin("dagster"), "api", "grpc-health-check", "--port", str(port), "--host", "127.0.0.1"],
                               env=service.env, capture_output=True, text=True)
        if probe.returncode == 0:
            return
        time.sleep(2)
    raise StackError(f"code server {service.name} did not answer on port {port} within {timeout_s:.0f} s:\n{service.tail()}")


def _wait_for_webserver(service: Service, url: str, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not service.alive:
            raise StackError(f"the webserver exited:\n{service.tail()}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{url}/server_info", timeout=5):
                return
        time.sleep(2)
    raise StackError(f"the webserver did not answer at {url} within {timeout_s:.0f} s:\n{service.tail()}")


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _podman(*args: str) -> None:
    subprocess.run(["podman", *args], env={**child_env(), "CONTAINERS_CONF": str(CONTAINERS_CONF)}, capture_output=True, timeout=60)


def built_orchestration_image() -> str:
    """The orchestration image `make images` built last (build/images/images.json): its tag."""
    try:
        built = json.loads(IMAGES_JSON.read_text())
    except FileNotFoundError:
        raise StackError(f"no images built: {IMAGES_JSON} is missing. Run `make images` first (as root; ~7 minutes the first time).") from None
    return next(i["tag"] for i in built if i["name"] == "orchestration")


def _launcher(folder: Path, own_env: Mapping[str, str], image: str):
    """How a service starts: from this checkout's virtualenv, or in a container of `image`
    (host network, the stack's folder mounted at the same path, only the stack's own variables)."""

    def service(name: str, command: list[str], host_env: dict[str, str], port: int = 0) -> Service:
        log = folder / f"{name}.log"
        if not image:
            return Service(name, [_bin(command[0]), *command[1:]], host_env, log, port=port)
        container = f"sinewgrid-rehearsal-{name}"
        variables = [arg for k, v in own_env.items() for arg in ("-e", f"{k}={v}")]
        argv = ["podman", "run", "--rm", "--name", container, "--network", "host", "-v", f"{folder}:{folder}", *variables, image, *command]
        return Service(name, argv, {**host_env, "CONTAINERS_CONF": str(CONTAINERS_CONF)}, log, container=container, port=port)

    return service


@contextlib.contextmanager
def production_stack(folder: Path | None = None, image: str = "") -> Iterator[Stack]:
    """Start everything (see the module docstring), yield it, stop it all on exit. With `image`
    (the orchestration image's tag), the code servers, daemon and webserver each run in a
    container of it, as the chart runs them; without, as processes of this checkout."""
    folder = Path(folder or tempfile.mkdtemp(prefix="sinewgrid-rehearsal-"))
    folder.mkdir(parents=True, exist_ok=True)
    with PostgresServer() as postgres, aws_server() as aws:
        postgres.enable_tls()  # deploy/dagster.yaml asks for `sslmode: require`, as managed PostgreSQL serves
        dagster_db = postgres.create_database("dagster")
        ledger_url = postgres.create_database("ledger")
        Ledger(ledger_url).engine  # its schema through its migrations, once, before any run books an attempt
        s3 = aws.client("s3", aws.admin)
        for bucket in (PLATFORM_BUCKET, LOG_BUCKET, *map(lab_bucket, LABS)):
            s3.create_bucket(Bucket=bucket)
        control_plane = aws.principal("sinewgrid-control-plane", _control_plane_policy())
        tenants = {lab: aws.tenant_principal(f"{lab}-workloads", lab_bucket(lab)) for lab in LABS}
        keys = {lab: aws.kms_key(tenants[lab], f"{lab}'s key") for lab in LABS}
        uploaders = {lab: aws.principal(f"{lab}-lab-system", _uploader_policy(lab)) for lab in LABS}

        home = folder / "dagster-home"
        home.mkdir(exist_ok=True)
        (home / "dagster.yaml").write_text(yaml.safe_dump(runnable_here(yaml.safe_load(PRODUCTION_YAML.read_text()), postgres.port), sort_keys=False))
        (folder / "tenants.yaml").write_text(yaml.safe_dump(_tenants_catalog(aws, keys), sort_keys=False))
        ports = {name: free_port() for name in LOCATIONS}
        (folder / "workspace.yaml").write_text(yaml.safe_dump({"load_from": [
            {"grpc_server": {"host": "127.0.0.1", "port": ports[name], "location_name": name}} for name in LOCATIONS]}))

        own = dict(aws.env(control_plane))  # the stack's own variables: what a container is given
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
        })
        for lab, principal in tenants.items():
            own[f"{_env_name(lab)}_AWS_ACCESS_KEY_ID"] = principal.access_key_id
            own[f"{_env_name(lab)}_AWS_SECRET_ACCESS_KEY"] = principal.secret_access_key
        # A process service: this shell's environment without any of its AWS, Dagster or Sinewgrid settings, then the stack's.
        env = {**{k: v for k, v in child_env().items() if not k.startswith(("AWS_", "DAGSTER_", "SINEWGRID_"))}, **own}
        service = _launcher(folder, own, image)
        if image:  # the images run as an unprivileged user (uid 10001): what they write here must be open to it
            for writable in (home, folder / "node-cache"):
                writable.mkdir(exist_ok=True)
                writable.chmod(0o777)

        stack = Stack(folder=folder, env=env, aws=aws, postgres=postgres, uploaders=uploaders, image=image)
        try:
            # The instance's tables, made once before any service opens it (they would race).
            migrated = subprocess.run([_bin("dagster"), "instance", "migrate"], env=env, cwd=REPO, capture_output=True, text=True)
            if migrated.returncode != 0:
                raise StackError(f"`dagster instance migrate` on {home / 'dagster.yaml'} failed:\n{migrated.stdout[-2000:]}{migrated.stderr[-4000:]}")
            for name, module in LOCATIONS.items():
                command = ["dagster", "api", "grpc", "--module-name", module, "--host", "127.0.0.1", "--port", str(ports[name])]
                code_server = service(f"code-server-{name}", command, env, port=ports[name])
                stack.services[code_server.name] = code_server.start()
            for name in LOCATIONS:
                _wait_for_code_server(stack.services[f"code-server-{name}"])
            workspace = str(folder / "workspace.yaml")
            stack.services["daemon"] = service("daemon", ["dagster-daemon", "run", "-w", workspace], env).start()
            web_port = free_port()
            stack.services["webserver"] = service("webserver", ["dagster-webserver", "-w", workspace, "-h", "127.0.0.1", "-p", str(web_port)], env).start()
            stack.webserver_url = f"http://127.0.0.1:{web_port}"
            _wait_for_webserver(stack.services["webserver"], stack.webserver_url)
            yield stack
        finally:
            for service in reversed(list(stack.services.values())):
                service.stop()
