"""The Ray backend: each attempt of a step is one Ray job, submitted through the Ray Jobs API.

A pool is a set of Ray nodes that carry a custom resource (`backend_settings.resources`,
e.g. `{pool_spot: 1}`); the job asks for it as `entrypoint_resources`, so Ray starts the
workload only on those nodes, and a job Ray cannot place stays PENDING until the pool's
`pending_deadline_seconds`, when it is stopped and the pool counts as having refused it.

A pool's runtime is either an interpreter path (as on local and Slurm pools) or a Ray
runtime environment (a mapping such as `{py_executable: .venv-isaaclab/bin/python,
env_vars: {...}}`). The pool's own `backend_settings.runtime_env` comes first, the
runtime's mapping second, and the Pipes bootstrap variables last, in `env_vars`.
The entrypoint is `cd <repository> && exec <python> -m <entry point>`; with a
`working_dir` in the runtime environment, Ray sets the folder and the `cd` is left out.

GPUs: `backend_settings.gpu_resource` names how a step's GPUs are asked for. `GPU` (the
default) sets `entrypoint_num_gpus`; another name asks for that custom resource; `null`
asks for none, for clusters whose pool resource already stands for a whole GPU node (and
for the CPU-only test cluster, whose nodes have no GPUs for Ray to count).

Endings: SUCCEEDED succeeded; FAILED with the entrypoint's exit code (Ray's
`driver_exit_code`; 75 means the workload checkpointed and yielded, so it resumes);
a job stopped by anyone but this backend (`ray job stop`, an operator, an autoscaler
draining a node) or whose supervisor died with its node is preempted and resumes from its
checkpoint. A job this backend stopped ends cancelled, also when Ray records the stop as a
start error (its supervisor lost the race with an entrypoint that was exiting). Stopping a
job sends SIGTERM to its process group and SIGKILL 3 s later (the head's
`RAY_JOB_STOP_WAIT_TIME_S`): the workload checkpoints within that.

Why the Jobs API and not dagster-ray: dagster-ray 0.4.8's `PipesRayJobClient.run` submits
and waits in one blocking call, raises the same RuntimeError for FAILED and STOPPED (so a
preemption, an exit 75 and a crash look alike), has no pending deadline, and reads Pipes
messages by tailing the job's stdout. The shared attempt loop (engine.py) needs separate
submit/status/stop calls, the entrypoint's exit code and Pipes files on a shared folder,
which `JobSubmissionClient` gives in a few lines, without another dependency to pin.
"""

from __future__ import annotations

import json
import shlex
import signal
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import dagster as dg

from control_plane.catalog.backends import RaySettings, settings_for
from control_plane.compute.backends.base import runtime_interpreter
from control_plane.compute.backends.base import JobHandle, JobState, JobStatus
from control_plane.compute.backends.engine import EngineBackend, Launch
from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.settings import REPO_ROOT

# How long the Jobs API may stay unreachable before a job counts as lost with its cluster.
UNREACHABLE_GRACE_SECONDS = 120.0

# Ray gave up placing the job: the pool had no capacity for it.
_NEVER_PLACED = {"JOB_SUPERVISOR_ACTOR_START_TIMEOUT", "JOB_SUPERVISOR_ACTOR_UNSCHEDULABLE"}
# The job's supervisor died with its node: the capacity was taken away.
_NODE_LOST = {"JOB_SUPERVISOR_ACTOR_DIED"}
# Ray 2.x: a stop that lands while the entrypoint exits fails the job with this error.
_STOP_RACED_EXIT = {"JOB_ENTRYPOINT_COMMAND_START_ERROR"}


def _cancel_marker(output_path: str) -> Path:
    return Path(output_path).with_name("cancelled")


def job_status(info: Any, *, stopped_by_us: bool) -> JobStatus:
    """What a Ray job's `JobDetails` mean for the attempt loop."""
    state = str(getattr(info.status, "value", info.status))
    message = (info.message or "").strip().splitlines()[0] if info.message else ""
    error_type = str(getattr(info.error_type, "value", info.error_type) or "")
    if state == "PENDING":
        if stopped_by_us:
            return JobStatus(JobState.cancelled, reason="stopped by Sinewgrid before Ray placed it")
        return JobStatus(JobState.pending, reason=message)
    if state == "RUNNING":
        return JobStatus(JobState.running)
    if state == "SUCCEEDED":
        return JobStatus(JobState.succeeded, exit_code=0)
    if state == "STOPPED":
        if stopped_by_us:
            return JobStatus(JobState.cancelled, reason="stopped by Sinewgrid")
        return JobStatus(JobState.preempted, reason="the Ray job was stopped outside Sinewgrid (ray job stop, a drained node)")
    # FAILED
    if info.driver_exit_code is not None:
        return JobStatus(JobState.failed, exit_code=int(info.driver_exit_code), reason=f"entrypoint exited {info.driver_exit_code}")
    if error_type in _NEVER_PLACED:
        return JobStatus(JobState.cancelled, reason=f"Ray could not place the job ({error_type}): {message}")
    if error_type in _NODE_LOST:
        return JobStatus(JobState.preempted, reason=f"the job's node was lost ({error_type}): {message}")
    if error_type in _STOP_RACED_EXIT and stopped_by_us:
        # Ray's supervisor looks the entrypoint up to signal it; when the entrypoint has just
        # exited (a cancelled attempt's marker check, a workload ending), the lookup raises and
        # Ray records a start error. The job was ours to stop, and it stopped.
        return JobStatus(JobState.cancelled, reason=f"stopped by Sinewgrid as its entrypoint exited ({error_type})")
    return JobStatus(JobState.failed, reason=f"{error_type or 'FAILED'}: {message}")


class RayBackend(EngineBackend):
    """Runs each attempt as a Ray job on the cluster at the pool's `backend_settings.address`."""

    kind = "ray"
    poll_seconds = 1.0
    runs_gangs = True  # a placement group of one bundle per node, a rank per actor (ray_gang.py)

    def __init__(self) -> None:
        self._clients: dict[str, Any] = {}
        self._stopped_by_us: set[str] = set()
        self._unreachable_since: dict[str, float] = {}

    def command(self, pool: Pool, spec: StepSpec) -> list[str]:
        """The workload's command; for a gang, `ray_gang.py` around it (the placement group and
        one actor per rank, each running the same command with its rank)."""
        command = super().command(pool, spec)
        if not spec.gang:
            return command
        ranks = spec.ranks_per_node or 1
        # GPUs in each rank's bundle only where the cluster counts them as Ray's `GPU` resource.
        gpus = spec.gpus // spec.world_size if settings_for(pool).gpu_resource == "GPU" else 0
        return [
            command[0], "-m", "workload_runtime.ray_gang",
            f"--nodes={spec.nodes}", f"--ranks={ranks}", f"--gpus={gpus}",
            f"--strategy={'STRICT_SPREAD' if spec.nodes > 1 else 'PACK'}", f"--wait={pool.pending_deadline_seconds:g}",
            "--", *command,
        ]  # fmt: skip

    def lost_node(self, handle: JobHandle, log: str) -> str | None:
        """The node `ray_gang.py` said it lost (`sinewgrid: lost node ray-…`)."""
        for line in log.splitlines():
            if line.startswith("sinewgrid: lost node "):
                return line.removeprefix("sinewgrid: lost node ").split()[0]
        return None

    def drain_node(self, pool: Pool, node: str, reason: str, timeout_seconds: float = 60.0) -> bool:
        """Ray's own drain of the gang's bad node (`workload_runtime/ray_drain.py`, run as a small job:
        only the cluster's GCS takes the call). False when the node is gone already (a lost
        node: Ray places nothing on a dead node) or the drain did not finish in time."""
        settings: RaySettings = settings_for(pool)
        if not self._alive(settings.address, node):
            return False  # a dead node takes no work: nothing to drain
        client = self._client(settings.address, pool.name)
        spec = StepSpec(name="drain", entry_point="workload_runtime.ray_drain", tenant="platform", gpus=0)
        runtime_env = self.runtime_env(pool, spec, {})
        command = shlex.join([self.interpreter(pool, spec), "-m", spec.entry_point, node, reason])
        job = client.submit_job(entrypoint=command if runtime_env.get("working_dir") else f"cd {shlex.quote(str(REPO_ROOT))} && exec {command}", runtime_env=runtime_env)
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            status = client.get_job_status(job)
            if status.is_terminal():
                return str(status) == "SUCCEEDED"
            time.sleep(0.2)
        return False

    @staticmethod
    def _alive(address: str, node: str) -> bool:
        """Whether the cluster lists `node` (`ray-<id prefix>`) alive, from the dashboard's state
        API; True when it cannot tell (the drain job then finds out)."""
        try:
            with urllib.request.urlopen(f"{address.rstrip('/')}/api/v0/nodes?limit=1000", timeout=10) as response:
                rows = json.loads(response.read()).get("data", {}).get("result", {}).get("result", [])
        except (OSError, ValueError):
            return True
        prefix = node.removeprefix("ray-")
        return any(row.get("node_id", "").startswith(prefix) and row.get("state") == "ALIVE" for row in rows)

    # Runtimes ------------------------------------------------------------------------
    def _runtime(self, pool: Pool, spec: StepSpec) -> str | dict[str, Any]:
        configured = pool.runtimes.get(spec.runtime, "")
        return configured if isinstance(configured, str) else dict(configured)

    def interpreter(self, pool: Pool, spec: StepSpec) -> str:
        """The Python that runs the entrypoint: the runtime's path, or its `py_executable`."""
        runtime = self._runtime(pool, spec)
        if isinstance(runtime, str):
            path = runtime_interpreter(pool, spec)
            return str(path) if path else sys.executable
        configured = str(runtime.get("py_executable") or "")
        if not configured:
            return sys.executable
        # In a runtime environment with a working_dir, Ray resolves relative paths there.
        if Path(configured).is_absolute() or runtime.get("working_dir"):
            return configured
        return str(REPO_ROOT / configured)

    def runtime_env(self, pool: Pool, spec: StepSpec, env: dict[str, str]) -> dict[str, Any]:
        """The job's Ray runtime environment: the pool's, then the runtime's, then `env`."""
        settings: RaySettings = settings_for(pool)
        runtime = self._runtime(pool, spec)
        merged: dict[str, Any] = {**settings.runtime_env}
        env_vars = {str(k): str(v) for k, v in dict(settings.runtime_env.get("env_vars") or {}).items()}
        if isinstance(runtime, dict):
            merged.update({k: v for k, v in runtime.items() if k != "env_vars"})
            env_vars.update({str(k): str(v) for k, v in dict(runtime.get("env_vars") or {}).items()})
            if runtime.get("py_executable"):
                # The workload's own Ray tasks and actors run on the same Python as its entrypoint.
                merged["py_executable"] = self.interpreter(pool, spec)
        env_vars.update(env)
        merged["env_vars"] = env_vars
        return merged

    @staticmethod
    def entrypoint(launch: Launch, *, in_working_dir: bool) -> str:
        """The shell command Ray runs: into the repository (unless Ray set a working_dir),
        skip if the attempt was cancelled before Ray placed it, then exec the workload so
        the SIGTERM of `stop_job` reaches Python, not a shell."""
        marker = shlex.quote(str(_cancel_marker(launch.output_path)))
        steps = [] if in_working_dir else [f"cd {shlex.quote(launch.workdir)} || exit 1"]
        steps.append(f"if [ -e {marker} ]; then echo 'sinewgrid: attempt cancelled before Ray placed it'; exit 0; fi")
        steps.append(f"exec {shlex.join(launch.command)}")
        return "; ".join(steps)

    # The five engine calls -------------------------------------------------------------
    def submit(self, pool: Pool, spec: StepSpec, launch: Launch) -> JobHandle:
        settings: RaySettings = settings_for(pool)
        runtime_env = self.runtime_env(pool, spec, launch.env)
        command = allow_listed(launch.command, keep=runtime_env["env_vars"], platform_credentials=launch.platform_credentials)
        entrypoint = self.entrypoint(replace(launch, command=command), in_working_dir=bool(runtime_env.get("working_dir")))
        resources = dict(settings.resources)
        gpus: dict[str, Any] = {}
        if spec.gpus and settings.gpu_resource == "GPU":
            gpus["entrypoint_num_gpus"] = spec.gpus
        elif spec.gpus and settings.gpu_resource:
            resources[settings.gpu_resource] = resources.get(settings.gpu_resource, 0) + spec.gpus
        client = self._client(settings.address, pool.name)
        try:
            job_id = client.submit_job(
                entrypoint=entrypoint,
                submission_id=launch.name,
                runtime_env=runtime_env,
                entrypoint_resources=resources or None,
                metadata={"sinewgrid_step": spec.name, "sinewgrid_pool": pool.name, "sinewgrid_attempt": launch.name},
                **gpus,
            )
        except Exception as exc:  # the Jobs API answers errors as RuntimeError with its own message
            raise dg.Failure(
                description=(
                    f"pool {pool.name}: the Ray Jobs API at {settings.address} refused job {launch.name}: {exc}. "
                    "Check the pool's `backend_settings` (runtime_env, resources) and the runtime "
                    f"`{spec.runtime}` in the pool catalog."
                )
            ) from exc
        return JobHandle(
            backend=self.kind,
            pool=pool.name,
            job_id=job_id,
            submitted_at=time.time(),
            info={"address": settings.address, "entrypoint": entrypoint, "output_path": launch.output_path},
        )

    def status(self, handle: JobHandle) -> JobStatus:
        try:
            info = self._client(handle.info["address"], handle.pool).get_job_info(handle.job_id)
        except RuntimeError as exc:
            if "does not exist" in str(exc) or "404" in str(exc):
                return JobStatus(JobState.gone, reason=f"the Ray cluster no longer knows job {handle.job_id}")
            return self._unreachable(handle, exc)
        except (OSError, dg.Failure) as exc:  # the head is down or restarting
            return self._unreachable(handle, exc)
        self._unreachable_since.pop(handle.job_id, None)
        return job_status(info, stopped_by_us=handle.job_id in self._stopped_by_us)

    def signal(self, handle: JobHandle, signum: int = signal.SIGTERM) -> None:
        """Stop the job: the Jobs API delivers SIGTERM (the head's `RAY_JOB_STOP_SIGNAL`), then
        SIGKILL after `RAY_JOB_STOP_WAIT_TIME_S` (3 s by default). It sends no other signal."""
        if signum not in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
            raise ValueError(f"Ray job {handle.job_id}: the Ray Jobs API can only stop a job, not send it {signal.Signals(signum).name}")
        self._stop_job(handle)

    def cancel(self, handle: JobHandle) -> None:
        self._stop_job(handle)

    def collect(self, handle: JobHandle) -> bytes:
        try:
            return self._client(handle.info["address"], handle.pool).get_job_logs(handle.job_id).encode()
        except Exception as exc:
            return f"[ray: could not read the logs of job {handle.job_id} from {handle.info['address']}: {exc}]\n".encode()

    # Helpers -------------------------------------------------------------------------
    def _stop_job(self, handle: JobHandle) -> None:
        self._stopped_by_us.add(handle.job_id)
        # Ray 2.60 queues `stop_job` for a job it has not placed yet (it stays PENDING until
        # RAY_JOB_START_TIMEOUT_SECONDS); should capacity appear first, the entrypoint finds
        # this marker and exits before the workload starts beside its successor.
        try:
            _cancel_marker(handle.info["output_path"]).touch()
        except (KeyError, OSError):
            pass
        try:
            self._client(handle.info["address"], handle.pool).stop_job(handle.job_id)
        except RuntimeError as exc:
            if "does not exist" not in str(exc):
                raise

    def _unreachable(self, handle: JobHandle, exc: Exception) -> JobStatus:
        first = self._unreachable_since.setdefault(handle.job_id, time.monotonic())
        if time.monotonic() - first > UNREACHABLE_GRACE_SECONDS:
            silent = f"the Ray Jobs API at {handle.info['address']} has not answered for {UNREACHABLE_GRACE_SECONDS:g}s"
            return JobStatus(JobState.gone, reason=f"{silent}: {exc}")
        return JobStatus(JobState.running, reason=f"the Ray Jobs API did not answer: {exc}")

    def _client(self, address: str, pool_name: str) -> Any:
        if address not in self._clients:
            from ray.job_submission import JobSubmissionClient

            try:
                self._clients[address] = JobSubmissionClient(address)
            except Exception as exc:
                raise dg.Failure(
                    description=(
                        f"pool {pool_name}: cannot reach the Ray Jobs API at {address} ({exc}). Check "
                        "`backend_settings.address` (the dashboard URL, e.g. http://HEAD:8265) and that the head is up."
                    )
                ) from exc
        return self._clients[address]


def allow_listed(command: list[str], *, keep: Mapping[str, str], platform_credentials: bool) -> list[str]:
    """The workload's command (after a gang launcher's `--`) behind `workload_runtime.allowed_env`.

    A Ray job's entrypoint and actors start from the raylet's environment, not the submitter's:
    the list is applied on the node, keeping besides it only the runtime env's own `env_vars`
    (the pool's, the runtime's, the Pipes bootstrap). A gang's launcher (`ray_gang.py`) runs
    unwrapped, as it needs Ray's own variables; each rank it starts is wrapped."""
    split = len(command) - command[::-1].index("--") if "--" in command else 0
    workload = command[split:]
    wrapper = [workload[0], "-m", "workload_runtime.allowed_env", f"--keep={','.join(sorted(keep))}"]
    if platform_credentials:
        wrapper.append("--platform-credentials")
    return [*command[:split], *wrapper, "--", *workload]
