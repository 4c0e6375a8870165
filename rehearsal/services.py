"""The stack's long-running services (rehearsal/stack.py): how each starts, as a process of this
checkout or in a container of the orchestration image, how it is stopped or killed, and how the
stack knows it is up.

In containers, runs get containers of their own too: `podman system service` serves podman's
Docker-compatible API on a socket in the stack's folder, and Dagster's `DockerRunLauncher` (in
the daemon, which launches queued runs, and the webserver, which terminates them) starts each
run's worker in a container of the orchestration image through it, as the `K8sRunLauncher`
starts a Job per run in production.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from control_plane.settings import child_env

REPO = Path(__file__).resolve().parent.parent
IMAGES_JSON = REPO / "build" / "images" / "images.json"  # what `make images` built
CONTAINERS_CONF = REPO / "build" / "containers" / "containers.conf"  # podman's settings for this machine, written by `make images`
START_TIMEOUT_S = 240.0  # a code server loads its location in ~20 s on a quiet 2-core machine
IMAGE_USER_GID = 10001  # the images' unprivileged user and its group (deploy/docker/*.Dockerfile)
RUN_LABEL = "sinewgrid.rehearsal"  # on every run container the stack's launcher starts: its folder


class StackError(RuntimeError):
    """A part of the stack did not start; the message names it and ends with its log."""


def bin_path(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def podman_env() -> dict[str, str]:
    return {**child_env(), "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman(*args: str) -> str:
    """Run `podman args`; its output (nothing is raised: a cleanup must go on)."""
    return subprocess.run(["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=60).stdout


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
            podman("rm", "-f", self.container)  # the one a kill left, or a killed earlier rehearsal's
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
            podman("kill", self.container)
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
            podman("stop", "-t", "20", self.container)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill()

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def wait_for_code_server(service: Service, timeout_s: float = START_TIMEOUT_S) -> None:
    port = service.port
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not service.alive:
            raise StackError(f"code server {service.name} exited while loading:\n{service.tail()}")
        probe = subprocess.run([bin_path("dagster"), "api", "grpc-health-check", "--port", str(port), "--host", "127.0.0.1"],
                               env=service.env, capture_output=True, text=True)
        if probe.returncode == 0:
            return
        time.sleep(2)
    raise StackError(f"code server {service.name} did not answer on port {port} within {timeout_s:.0f} s:\n{service.tail()}")


def wait_for_webserver(service: Service, url: str, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not service.alive:
            raise StackError(f"the webserver exited:\n{service.tail()}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{url}/server_info", timeout=5):
                return
        time.sleep(2)
    raise StackError(f"the webserver did not answer at {url} within {timeout_s:.0f} s:\n{service.tail()}")


def built_image(name: str) -> str:
    """The tag of image `name` (orchestration, workload) `make images` built last (build/images/images.json)."""
    try:
        built = json.loads(IMAGES_JSON.read_text())
    except FileNotFoundError:
        raise StackError(f"no images built: {IMAGES_JSON} is missing. Run `make images` first (as root; ~7 minutes the first time).") from None
    return next(i["tag"] for i in built if i["name"] == name)


def launcher(folder: Path, own_env: Mapping[str, str], image: str):
    """How a service starts: from this checkout's virtualenv, or in a container of `image`
    (host network, the stack's folder mounted at the same path, only the stack's own variables,
    and what `mounts` and `extra_env` add for this one service)."""

    def service(name: str, command: list[str], host_env: dict[str, str], port: int = 0,
                mounts: Sequence[Path] = (), extra_env: Mapping[str, str] | None = None) -> Service:
        log = folder / f"{name}.log"
        extra_env = dict(extra_env or {})
        if not image:
            return Service(name, [bin_path(command[0]), *command[1:]], {**host_env, **extra_env}, log, port=port)
        container = f"sinewgrid-rehearsal-{name}"
        variables = [arg for k, v in {**own_env, **extra_env}.items() for arg in ("-e", f"{k}={v}")]
        volumes = [arg for path in (folder, *mounts) for arg in ("-v", f"{path}:{path}")]
        argv = ["podman", "run", "--rm", "--name", container, "--network", "host", *volumes, *variables, image, *command]
        return Service(name, argv, {**host_env, "CONTAINERS_CONF": str(CONTAINERS_CONF)}, log, container=container, port=port)

    return service


def podman_api(folder: Path) -> tuple[Service, Path, str]:
    """`podman system service` on a socket of its own folder beside the stack's (never inside it:
    the stack's folder is mounted into every container, runs included), open to the images'
    user's group; the service, the socket's folder (mount it where the API is needed) and its
    `DOCKER_HOST`. Whoever reaches the socket can start containers on this host: only the
    daemon (it launches runs) and the webserver (it terminates them) are given it, as in
    production only Dagster's service account may create Jobs in the runs' namespace."""
    where = folder.with_name(f"{folder.name}-podman-api")
    where.mkdir(exist_ok=True)
    socket = where / "podman.sock"
    socket.unlink(missing_ok=True)
    service = Service("podman-api", ["podman", "system", "service", "--time=0", f"unix://{socket}"], podman_env(), folder / "podman-api.log").start()
    deadline = time.monotonic() + 30
    while not socket.exists():
        if not service.alive or time.monotonic() > deadline:
            raise StackError(f"podman's API did not open {socket}:\n{service.tail()}")
        time.sleep(0.2)
    os.chown(socket, 0, IMAGE_USER_GID)
    socket.chmod(0o660)
    return service, where, f"unix://{socket}"


def remove_run_containers(folder: Path) -> list[str]:
    """The run containers the stack's launcher started (finished or not), removed; their ids."""
    ids = podman("ps", "-aq", "--filter", f"label={RUN_LABEL}={folder}").split()
    if ids:
        podman("rm", "-f", *ids)
    return ids
