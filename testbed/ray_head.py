"""A real, single-node Ray 2.60 head for tests: started on free ports in its own temporary
folder, so it collides with no other Ray on the machine, and stopped by process id.

    head = start_ray_head(tmp_dir, resources={"pool_spot": 2, "pool_steady": 1})
    ...  # submit jobs to head.address (the Jobs API / dashboard URL)
    head.stop()

Teardown kills only this head's processes (its own session, plus anything whose command
line names its temp folder) instead of running `ray stop`, which stops every Ray on the
machine, including other people's.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from control_plane.settings import child_env
from testbed import leftovers
from testbed.ports import free_ports

RAY_CLI = str(Path(sys.executable).with_name("ray"))
START_TIMEOUT_SECONDS = 120.0
START_ATTEMPTS = 3
PREFIX = "sgray-"
DEFAULT_RESOURCES = {"pool_spot": 2, "pool_steady": 1}


class RayHeadError(RuntimeError):
    """The Ray head did not come up; the message carries its logs."""


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(missing)"


@dataclass
class RayHead:
    address: str  # the Jobs API / dashboard URL, e.g. http://127.0.0.1:41234
    gcs_address: str  # what `ray.init(address=...)` would take
    temp_dir: Path
    process: subprocess.Popen
    output: Path
    resources: dict[str, float] = field(default_factory=dict)

    def logs(self) -> str:
        """The last lines of the head's own logs, for an error message."""
        parts = [f"--- ray start output ({self.output}) ---\n{_tail(self.output)}"]
        logs = self.temp_dir / "session_latest" / "logs"
        for name in ("gcs_server.out", "raylet.out", "dashboard.log", "dashboard_agent.log"):
            parts.append(f"--- {logs / name} ---\n{_tail(logs / name, 15)}")
        return "\n".join(parts)

    def _processes(self) -> list[psutil.Process]:
        session = os.getsid(self.process.pid) if self.process.poll() is None else self.process.pid
        found = {}
        marker = str(self.temp_dir)
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if proc.pid == os.getpid():
                    continue
                if os.getsid(proc.pid) == session or any(marker in arg for arg in proc.info["cmdline"] or []):
                    found[proc.pid] = proc
            except (psutil.Error, ProcessLookupError, PermissionError):
                continue
        return list(found.values())

    def stop_running_jobs(self, timeout_s: float = 30.0) -> list[str]:
        """Stop every job not yet finished (a test left it behind) and wait until the running
        ones have ended; the ids stopped. Ray keeps a stopped job it never placed PENDING (the
        stop is queued until it is placed), so those are stopped but not waited for."""
        from ray.job_submission import JobStatus, JobSubmissionClient

        client = JobSubmissionClient(self.address)
        unfinished = [j for j in client.list_jobs() if not j.status.is_terminal() and j.submission_id]
        for job in unfinished:
            client.stop_job(job.submission_id)
        running = [j.submission_id for j in unfinished if j.status is JobStatus.RUNNING]
        deadline = time.monotonic() + timeout_s
        while running:
            running = [j for j in running if not client.get_job_status(j).is_terminal()]
            if running and time.monotonic() > deadline:
                raise RayHeadError(f"Ray jobs {running} did not stop within {timeout_s:g}s of `stop_job`.\n{self.logs()}")
            time.sleep(0.5)
        return [j.submission_id for j in unfinished]

    def stop(self) -> None:
        """Stop this head's processes (SIGTERM, then SIGKILL for stragglers) and remove its folder."""
        procs = self._processes()
        for proc in procs:
            try:
                proc.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=5)
        for proc in alive:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=5)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=5)
        subprocess.run(["rm", "-rf", str(self.temp_dir)], check=False)


def start_ray_head(resources: dict[str, float] | None = None, *, num_cpus: int = 2, ip: str = "127.0.0.1") -> RayHead:
    """Start a Ray head on `ip` (loopback) with these custom resources; wait until its Jobs API answers.

    A head that will take more nodes (`add_worker_node`) needs a loopback address other than
    127.0.0.1, e.g. 127.0.0.2: Ray lets a second node join only with
    `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1`, and then swaps 127.0.0.1 (and only that) for the
    machine's outside address.

    Heads a killed earlier run left behind are stopped first. A head that cannot start is
    tried again on new ports (another process may take a chosen port before Ray binds it);
    raises RayHeadError, with the head's logs, after START_ATTEMPTS.
    """
    leftovers.sweep(PREFIX, "/tmp")
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            return _start_once(dict(DEFAULT_RESOURCES if resources is None else resources), num_cpus, ip)
        except RayHeadError:
            if attempt == START_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def _start_once(resources: dict[str, float], num_cpus: int, ip: str) -> RayHead:
    # Ray puts Unix sockets under the temp folder, whose paths must stay under ~107 characters.
    temp_dir = Path(tempfile.mkdtemp(prefix=PREFIX, dir="/tmp"))
    leftovers.claim(temp_dir)
    output = temp_dir / "ray-start.out"
    # Ports Ray would otherwise take at fixed defaults (6379, 8265, 10001, 52365), chosen
    # together so no two match; the node's other ports Ray picks itself.
    dashboard_port, gcs_port, client_port, agent_port = free_ports(4)
    worker_base = random.randrange(20000, 29000, 100)
    command = [
        RAY_CLI, "start", "--head", "--block",
        f"--node-ip-address={ip}",
        f"--num-cpus={num_cpus}",
        f"--resources={json.dumps(resources)}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard_port}",
        f"--port={gcs_port}",
        f"--ray-client-server-port={client_port}",
        f"--dashboard-agent-listen-port={agent_port}",
        f"--min-worker-port={worker_base}",
        f"--max-worker-port={worker_base + 99}",
        f"--temp-dir={temp_dir}",
        "--object-store-memory=100000000",
        "--disable-usage-stats",
        "--include-dashboard=true",
        # Jobs write their own log files, read through the Jobs API; the log monitor only streams
        # worker output to an attached driver, which the tests never are (10 CPU-seconds a run).
        "--include-log-monitor=false",
    ]  # fmt: skip
    # The dashboard agent's reporter walks every process on the machine every 5 s (psutil) for
    # node metrics nobody reads here; once a minute keeps it from costing the suite CPU.
    env = child_env({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "REPORTER_UPDATE_INTERVAL_MS": "60000"})
    env.pop("RAY_ADDRESS", None)
    with output.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    head = RayHead(
        address=f"http://127.0.0.1:{dashboard_port}",
        gcs_address=f"{ip}:{gcs_port}",
        temp_dir=temp_dir,
        process=process,
        output=output,
        resources=resources,
    )
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            logs = head.logs()
            head.stop()
            raise RayHeadError(f"`ray start --head` exited with code {process.returncode} before its Jobs API answered.\n{logs}")
        if _jobs_api_answers(head.address):
            return head
        time.sleep(1.0)
    logs = head.logs()
    head.stop()
    raise RayHeadError(
        f"the Ray head's Jobs API at {head.address} did not answer within {START_TIMEOUT_SECONDS:g}s. "
        f"Is the machine out of memory or ports? Its logs:\n{logs}"
    )


def add_worker_node(head: RayHead, *, ip: str = "127.0.0.3", num_cpus: int = 2, resources: dict[str, float] | None = None, timeout: float = 60.0) -> str:
    """Start one more Ray node on this machine in `head`'s cluster (as Ray's own tests do: a
    second raylet, here on its own loopback address and ports); stopped with the head. The head
    must not be on 127.0.0.1 (see `start_ray_head`). Returns the new node's id."""
    deadline = time.monotonic() + timeout
    while not (before := _node_ids(head)):  # the head lists itself a few seconds after its Jobs API answers
        if time.monotonic() > deadline:
            raise RayHeadError(f"the Ray head at {head.address} lists no live node; cannot add one.\n{head.logs()}")
        time.sleep(0.5)
    (agent_port,) = free_ports(1)
    worker_base = random.randrange(30000, 39000, 100)
    command = [
        RAY_CLI, "start", "--block", f"--address={head.gcs_address}", f"--node-ip-address={ip}",
        f"--num-cpus={num_cpus}", f"--resources={json.dumps(resources or {})}",
        f"--dashboard-agent-listen-port={agent_port}", f"--min-worker-port={worker_base}", f"--max-worker-port={worker_base + 99}",
        f"--temp-dir={head.temp_dir}", "--object-store-memory=100000000", "--disable-usage-stats", "--include-log-monitor=false",
    ]  # fmt: skip
    # `ray start` refuses a second node on one host (the check meant for laptops) unless told to.
    env = child_env({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_USAGE_STATS_ENABLED": "0", "REPORTER_UPDATE_INTERVAL_MS": "60000"})
    env.pop("RAY_ADDRESS", None)
    with (head.temp_dir / f"ray-worker-{agent_port}.out").open("wb") as out:
        subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        added = _node_ids(head) - before
        if added:
            return added.pop()
        time.sleep(1.0)
    raise RayHeadError(f"a Ray worker node did not join {head.gcs_address} within {timeout:g}s.\n{head.logs()}")


def _node_ids(head: RayHead) -> set[str]:
    """The ids of the cluster's live nodes, from the dashboard's state API."""
    try:
        with urllib.request.urlopen(f"{head.address}/api/v0/nodes?limit=100", timeout=10) as response:
            data = json.loads(response.read())
    except OSError:
        return set()
    rows = data.get("data", {}).get("result", {}).get("result", [])
    return {row["node_id"] for row in rows if row.get("state") == "ALIVE"}


def _jobs_api_answers(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"{address}/api/jobs/", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


@dataclass
class RayNodes:
    """A Ray cluster of several nodes on this machine: a head that runs job drivers only (no
    CPUs, so no rank lands there) and worker nodes on loopback addresses of their own. Faults
    kill a whole node; `restore_nodes` puts a fresh node in place of a dead or drained one, as
    Ray's autoscaler replaces a node it drained. Stop it with `stop()`."""

    head: RayHead
    workers: dict[str, str]  # loopback address -> node id
    entry_resources: dict[str, float] = field(default_factory=dict)  # what a job's entrypoint asks of the head

    @property
    def address(self) -> str:
        return self.head.address

    def _ip(self, node: str) -> str:
        prefix = node.removeprefix("ray-")
        found = [ip for ip, node_id in self.workers.items() if node_id.startswith(prefix)]
        if not found:
            raise RayHeadError(f"{node} is not a worker node of this cluster ({', '.join(self.workers.values())})")
        return found[0]

    def kill_node(self, node: str) -> list[int]:
        """SIGKILL a worker node (`ray-<id prefix>`): its raylet, workers and their children (the
        node's whole session), as a machine that loses power. Returns the pids."""
        ip = self._ip(node)
        sessions = set()
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmdline = " ".join(proc.info["cmdline"] or [])
            if f"--node-ip-address={ip}" in cmdline or f"--node_ip_address={ip}" in cmdline:
                try:
                    sessions.add(os.getsid(proc.pid))
                except ProcessLookupError:
                    pass
        killed = []
        for proc in psutil.process_iter(["pid"]):
            try:
                if os.getsid(proc.pid) in sessions and proc.pid != os.getpid():
                    proc.kill()
                    killed.append(proc.pid)
            except (psutil.Error, ProcessLookupError):
                pass
        return killed

    def restore_nodes(self, nodes: list[str]) -> None:
        """A fresh node in place of each of `nodes` (dead, or drained: Ray has no undrain)."""
        for node in nodes:
            try:
                ip = self._ip(node)
            except RayHeadError:
                continue
            self.kill_node(node)
            deadline = time.monotonic() + 60
            while self.workers[ip] in _node_ids(self.head) and time.monotonic() < deadline:
                time.sleep(0.5)  # the head marks the node dead before its address is used again
            self.workers[ip] = add_worker_node(self.head, ip=ip, num_cpus=1)

    def stop(self) -> None:
        self.head.stop()


def start_ray_nodes(workers: int = 3, entry_resources: dict[str, float] | None = None) -> RayNodes:
    """A head on 127.0.0.2 and `workers` nodes of one CPU on 127.0.0.3, 127.0.0.4, …"""
    resources = dict(entry_resources or {"drill_head": 100})
    head = start_ray_head(resources, num_cpus=0, ip="127.0.0.2")
    try:
        nodes = {f"127.0.0.{3 + i}": "" for i in range(workers)}
        for ip in nodes:
            nodes[ip] = add_worker_node(head, ip=ip, num_cpus=1)
    except BaseException:
        head.stop()
        raise
    return RayNodes(head, nodes, {next(iter(resources)): 1})
