"""The Slurm backend: each attempt of a step is one batch job on the pool's partition.

A pool says `backend: slurm` and names its partition (and optionally account, qos, time
limit, GPU flag) under `backend_settings` (see `SlurmSettings`); with `accounts: teams` each
job runs under its step's team account and priority-class QOS instead (`slurm_accounts.py`). For every attempt this
backend renders `deploy/slurm/step.sbatch` (`slurm_batch.py`: a bare interpreter, or a container
of the workload image with `srun --container`), submits it with `sbatch --parsable`, follows
it with `scontrol show job` (and `sacct --completion` once Slurm has forgotten the job),
signals and cancels it with `scancel`, and reads its output file.

How Slurm's endings become outcomes (the engine loop maps the rest):

- `sbatch` rejected by the controller (partition down or unknown, QOS or account limits,
  no such node configuration), or the controller unreachable: the pool refused the step,
  nothing ran; the next pool in the plan gets it.
- requeued (partition preemption, `scontrol requeue`, node failure): preempted. The
  requeued job is cancelled rather than left to wait its turn, and the step resumes from
  its checkpoint on whichever pool placement picks (the same one or the next).
- the workload's exit 75 (it checkpointed on SIGTERM: a preemption notice, the time-limit
  notice, a cancelled Dagster run): preempted. Any other non-zero exit: failed.

Health, from Slurm's own node states (`qualify`, `node_problem`): a partition that is not UP,
or whose every node is drained, down, failing or not responding, does not qualify, and the
step goes to the next pool; a running job whose node is drained (what a health check such
as NHC, Slurm's `HealthCheckProgram`, does to a sick node: running jobs go on, nothing new
starts) or lost is reported, and the attempt loop moves the step. The problem texts carry
Slurm's `Reason=` for the node and the `scontrol` line that returns it to service. Reading
the node states is `control_plane.compute.backends.slurm_nodes`.
"""

from __future__ import annotations

import shlex
import signal as signals
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg

from control_plane.catalog.backends import SlurmSettings, settings_for
from control_plane.compute.backends.base import JobHandle, JobState, JobStatus, Refusal
from control_plane.compute.backends.engine import EngineBackend, Launch
from control_plane.compute.backends.slurm_accounts import SlurmAccountsError
from control_plane.compute.backends.slurm_batch import container_of, lost_node, render_batch_script
from control_plane.compute.backends.slurm_nodes import job_nodes_problem, partition_problem
from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.settings import child_env, workload_env
from control_plane.settings import settings as platform_settings

# What `sbatch` says when the controller turned the job down (capacity, limits, partition
# state) or could not be reached: the pool refuses, the step fails over. Anything else
# (`sbatch` rejecting its own arguments) is a catalog mistake and fails the step.
_REFUSALS = ("Batch job submission failed", "Unable to contact slurm controller", "Socket timed out", "Zero Bytes were transmitted")

_WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
_RUNNING = {"RUNNING", "CONFIGURING", "COMPLETING", "STAGE_OUT", "SIGNALING", "SUSPENDED", "RESIZING", "STOPPED", "SPECIAL_EXIT"}
_NEVER_RAN = {"BOOT_FAIL", "DEADLINE"}  # Slurm gave up before the workload started
# Job states in which the job holds its nodes and its workload may be running there.
_ON_NODES = _RUNNING - {"COMPLETING", "STAGE_OUT"}
# What `scontrol` says when it cannot reach slurmctld.
_UNREACHABLE = ("Unable to contact slurm controller", "Socket timed out", "Zero Bytes were transmitted", "Connection refused")


class SlurmCommandError(RuntimeError):
    """A Slurm client command failed in a way that is not about the job."""


def _exit_code(text: str) -> int | None:
    """Slurm's `code:signal` as one number: the exit code, or minus the signal that killed it."""
    code, _, sig = text.partition(":")
    if not code.isdigit():
        return None
    if sig.isdigit() and int(sig):
        return -int(sig)
    return int(code)


def _one_line(result: subprocess.CompletedProcess) -> str:
    return " ".join((result.stderr or result.stdout).split()) or f"exit status {result.returncode}"


class SlurmBackend(EngineBackend):
    """Runs each attempt as a Slurm batch job on the pool's partition."""

    kind = "slurm"
    runs_gangs = True  # srun starts every rank inside the batch job
    poll_seconds = 1.0

    # Slurm client commands --------------------------------------------------------------
    def _slurm(self, settings: SlurmSettings, args: list[str], pool: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(
                args, env=child_env(settings.env) if env is None else dict(env), capture_output=True, text=True, timeout=60
            )
        except FileNotFoundError:
            raise dg.Failure(
                description=(
                    f"pool {pool}: `{args[0]}` is not installed on this machine, and Slurm pools are driven "
                    "through the Slurm client commands. Install them (`make slurm-packages`, or your site's "
                    "Slurm client) or run Dagster on a host that can submit to the cluster."
                )
            ) from None
        except subprocess.TimeoutExpired as exc:
            raise SlurmCommandError(f"pool {pool}: `{shlex.join(args)}` did not answer in 60 s") from exc

    def _settings(self, handle: JobHandle) -> SlurmSettings:
        return SlurmSettings(**handle.info["settings"])

    def drain_node(self, pool: Pool, node: str, reason: str) -> bool:
        """`scontrol update NodeName=… State=DRAIN`: what a health checker does to a sick node."""
        settings = settings_for(pool)
        result = self._slurm(settings, ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason[:120]}"], pool.name)
        return result.returncode == 0

    def lost_node(self, handle: JobHandle, log: str) -> str | None:
        return lost_node(log)

    def exit_code_hidden(self, handle: JobHandle) -> bool:
        """Slurm reports a container's signalled step as terminated, not with the workload's exit 75."""
        return bool(handle.info.get("container"))

    def command(self, pool: Pool, spec: StepSpec) -> list[str]:
        container = container_of(pool, spec)
        return [container.python, "-m", spec.entry_point] if container else super().command(pool, spec)

    # The five engine calls -----------------------------------------------------------------
    def submit(self, pool: Pool, spec: StepSpec, launch: Launch) -> JobHandle:
        settings = settings_for(pool)
        # sbatch hands the job its own environment (`--export=ALL`, Slurm's default): an allow-list
        # (workload_runtime/allowed_env.py), never the control plane's, so that is all the job gets.
        env = workload_env(platform_credentials=launch.platform_credentials, extra=settings.env)
        script = Path(launch.output_path).with_name("step.sbatch")
        script.parent.mkdir(parents=True, exist_ok=True)
        try:
            script.write_text(render_batch_script(pool, spec, launch, settings, job_env=env))
        except SlurmAccountsError as exc:  # `accounts: teams`: a step of no team, or a class Slurm cannot take
            raise dg.Failure(description=str(exc)) from None
        container = container_of(pool, spec)
        info: dict[str, Any] = {
            "settings": settings.model_dump(),
            "output_path": launch.output_path,
            "script": str(script),
            "restarts": 0,
            "container": container.container if container else None,
        }
        result = self._slurm(settings, ["sbatch", "--parsable", "--export=ALL", *settings.extra_args, str(script)], pool.name, env=env)
        if result.returncode != 0:
            message = " ".join(result.stderr.split()) or f"sbatch exited {result.returncode}"
            if any(refusal in message for refusal in _REFUSALS):
                # Nothing was queued: a handle that reports "cancelled before it ran", which the
                # engine loop records as the pool refusing the step.
                info["refused"] = f"partition {settings.partition} turned the job down: {message}"
                return JobHandle(self.kind, pool.name, f"refused-{uuid.uuid4().hex[:8]}", time.time(), info)
            raise dg.Failure(
                description=(
                    f"pool {pool.name}: sbatch could not submit {launch.name} ({message}). The batch script is "
                    f"{script}; check the pool's `backend_settings` (partition, account, qos, time_limit, "
                    "extra_args) in the pool catalog."
                )
            )
        job_id = result.stdout.strip().split(";")[0]  # `id` or `id;cluster`
        return JobHandle(self.kind, pool.name, job_id, time.time(), info)

    def status(self, handle: JobHandle) -> JobStatus:
        if "refused" in handle.info:
            return JobStatus(JobState.cancelled, reason=handle.info["refused"])
        settings = self._settings(handle)
        try:
            job = self._show_job(settings, handle)
            if job is None:
                return self.status_from_completion_log(settings, handle)
        except SlurmCommandError as exc:
            # The controller is busy or restarting: report the last state seen, try again next poll.
            return JobStatus(JobState(handle.info.get("last_state", JobState.pending.value)), reason=str(exc))
        status = self._status_of(settings, handle, job)
        handle.info["last_state"] = status.state.value
        return status

    def signal(self, handle: JobHandle, signum: int = signals.SIGTERM) -> None:
        if "refused" in handle.info:
            return
        # Only a running job has processes to signal; `scancel --signal` on a pending job
        # retries for a minute before giving up (the caller cancels a pending job instead).
        job = self._show_job(self._settings(handle), handle)
        if job is None or job.get("JobState", "").split("+")[0] != "RUNNING":
            return
        name = signals.Signals(signum).name.removeprefix("SIG")
        # A bare step is the batch script's process (`--full` reaches it); a container's is a step
        # of `srun`, which would kill it on SIGTERM: signal the steps only (slurm_batch.py).
        self._scancel(handle, [f"--signal={name}", *([] if handle.info.get("container") else ["--full"])])

    def cancel(self, handle: JobHandle) -> None:
        if "refused" in handle.info:
            return
        self._scancel(handle, [])

    def collect(self, handle: JobHandle) -> bytes:
        path = Path(handle.info["output_path"])
        if "refused" in handle.info:
            return b""
        if not path.exists():
            return f"(Slurm job {handle.job_id} wrote no output to {path})\n".encode()
        return path.read_bytes()

    # Health -------------------------------------------------------------------------------
    def qualify(self, pool: Pool) -> str | None:
        """None when the pool's partition is UP and has a node that can take work; else why
        not, with Slurm's node states and reasons and the `scontrol` line that fixes it. A
        partition that is not UP or a controller that does not answer is a `Refusal` (the pool
        cools down); no node able to take work is a health problem (the pool is drained)."""
        settings = settings_for(pool)
        partition = settings.partition
        where = f"pool {pool.name}: Slurm partition `{partition}`"
        try:
            shown = self._slurm(settings, ["scontrol", "show", "partition", "--oneliner", partition], pool.name)
            if shown.returncode != 0 or not shown.stdout.strip():
                message = _one_line(shown)
                if any(s in message for s in _UNREACHABLE):
                    return Refusal(f"{where}: the Slurm controller did not answer ({message}); check slurmctld (`scontrol ping`){self._conf_hint(settings)}")
                if "not found" in message:
                    return (
                        f"{where} does not exist on the cluster ({message}){self._conf_hint(settings)}; "
                        f"fix `backend_settings.partition` of pool {pool.name} in the pool catalog (`sinfo -s` lists the partitions)"
                    )
                return f"{where}: `scontrol show partition {partition}` failed ({message})"
            fields = dict(word.partition("=")[::2] for word in shown.stdout.split() if "=" in word)
            state = fields.get("State", "UNKNOWN")
            if state != "UP":
                return Refusal(
                    f"{where} is {state} (Slurm starts no new jobs there{' and turns submissions down' if state == 'INACTIVE' else ''}); "
                    f"an operator brings it back with `scontrol update PartitionName={partition} State=UP`"
                )
            members = fields.get("Nodes", "(null)")
            if members in ("", "(null)"):
                return f"{where} has no nodes (`Nodes=(null)` in slurm.conf); give it nodes or take pool {pool.name} out of the catalog"
            listed = self._slurm(settings, ["scontrol", "show", "node", "--oneliner", *([] if members == "ALL" else [members])], pool.name)
        except SlurmCommandError as exc:
            return Refusal(f"{where}: the Slurm controller did not answer ({exc}); check slurmctld (`scontrol ping`){self._conf_hint(settings)}")
        if listed.returncode != 0:
            return f"{where}: `scontrol show node {members}` failed ({_one_line(listed)}); check slurmctld (`scontrol ping`)"
        return partition_problem(listed.stdout, partition, members, where)

    def node_problem(self, handle: JobHandle) -> str | None:
        """None while the job is pending, ended, or running on healthy nodes; else which of
        its nodes is drained, down, failing or not responding, and Slurm's reason."""
        if "refused" in handle.info:
            return None
        settings = self._settings(handle)
        try:
            job = self._show_job(settings, handle)
            if job is None or job.get("JobState", "").split("+")[0] not in _ON_NODES:
                return None
            nodelist = job.get("NodeList", "(null)")
            if nodelist in ("", "(null)", "None"):
                return None
            shown = self._slurm(settings, ["scontrol", "show", "node", "--oneliner", nodelist], handle.pool)
        except SlurmCommandError:
            return None  # the controller is busy: no verdict this poll; a lost job shows in `status`
        if shown.returncode != 0:
            return None
        return job_nodes_problem(shown.stdout, handle.job_id, handle.pool)

    @staticmethod
    def _conf_hint(settings: SlurmSettings) -> str:
        conf = settings.env.get("SLURM_CONF") or platform_settings().slurm_conf
        return f" (SLURM_CONF={conf})" if conf else ""

    # Reading Slurm's view of a job ---------------------------------------------------------
    def _show_job(self, settings: SlurmSettings, handle: JobHandle) -> dict[str, str] | None:
        """`scontrol show job` as a dict; None once Slurm has purged the job (after MinJobAge)."""
        result = self._slurm(settings, ["scontrol", "show", "job", "--oneliner", handle.job_id], handle.pool)
        if result.returncode != 0:
            if "Invalid job id" in result.stderr:
                return None
            raise SlurmCommandError(f"`scontrol show job {handle.job_id}` failed: {result.stderr.strip()}")
        fields = {}
        for word in result.stdout.split():
            key, sep, value = word.partition("=")
            if sep and key not in fields:
                fields[key] = value
        return fields

    def _status_of(self, settings: SlurmSettings, handle: JobHandle, job: dict[str, str]) -> JobStatus:
        state = job.get("JobState", "UNKNOWN").split("+")[0]
        reason = job.get("Reason", "None")
        reason = "" if reason == "None" else reason
        requeued = int(job.get("Restarts", "0") or 0) > handle.info["restarts"]
        exit_code = _exit_code(job.get("ExitCode", ""))
        if requeued:
            if state in _WAITING:
                # The old processes are gone (Slurm holds a requeued job in COMPLETING until they
                # are). Cancel the copy so the step resumes on the pool placement picks, not after
                # Slurm's requeue delay on this one.
                self._scancel(handle, [])
                return JobStatus(JobState.preempted, reason=f"Slurm requeued job {handle.job_id} (preempted or requeued by an operator); cancelled the requeued copy")
            if state == "CANCELLED":
                return JobStatus(JobState.preempted, reason=f"Slurm requeued job {handle.job_id}; the requeued copy was cancelled")
            if state in _RUNNING and state != "COMPLETING":
                self._scancel(handle, [])  # Slurm restarted it before we saw the requeue: stop it first
                return JobStatus(JobState.running, reason="requeued and restarted by Slurm; stopping it")
        if state in _WAITING:
            return JobStatus(JobState.pending, reason=reason)
        if state in _RUNNING:
            return JobStatus(JobState.running, reason=reason)
        if state == "COMPLETED":
            return JobStatus(JobState.succeeded, exit_code=0)
        if state == "PREEMPTED":
            return JobStatus(JobState.preempted, exit_code=exit_code, reason="preempted by a higher-priority partition")
        if state == "NODE_FAIL":
            return JobStatus(JobState.gone, reason=f"node failure ({job.get('NodeList', '?')})")
        if state in _NEVER_RAN:
            return JobStatus(JobState.cancelled, reason=f"Slurm ended it before it ran: {state} {reason}".rstrip())
        if state == "CANCELLED":
            ran = job.get("NodeList", "(null)") not in ("(null)", "", "None")
            return JobStatus(JobState.cancelled, exit_code=exit_code if ran else None, reason=f"cancelled {reason}".rstrip())
        if state == "TIMEOUT":
            return JobStatus(JobState.failed, exit_code=exit_code, reason=f"hit its time limit (--time={settings.time_limit})")
        return JobStatus(JobState.failed, exit_code=exit_code, reason=f"job {handle.job_id} {state}{f' ({reason})' if reason else ''}")

    def status_from_completion_log(self, settings: SlurmSettings, handle: JobHandle) -> JobStatus:
        """After MinJobAge the controller forgets a job; the job completion log (`sacct
        --completion`, JobCompType) still has how it ended."""
        result = self._slurm(
            settings, ["sacct", "--completion", "--jobs", handle.job_id, "--noheader", "--parsable2", "--format=JobID,State,ExitCode,NodeList"], handle.pool
        )
        records = [line.split("|") for line in result.stdout.splitlines() if line.split("|")[0] == handle.job_id]
        if result.returncode != 0 or not records:
            detail = " ".join(result.stderr.split())
            return JobStatus(JobState.gone, reason=f"Slurm no longer knows job {handle.job_id} (not in `scontrol show job` nor `sacct --completion`{': ' + detail if detail else ''})")
        _, state, exit_text, nodes = (records[-1] + ["", "", ""])[:4]
        job = {"JobState": state.split()[0], "ExitCode": exit_text, "NodeList": nodes or "(null)", "Restarts": str(len(records) - 1)}
        return self._status_of(settings, handle, job)

    def _scancel(self, handle: JobHandle, options: list[str]) -> None:
        result = self._slurm(self._settings(handle), ["scancel", *options, handle.job_id], handle.pool)
        message = result.stderr.strip()
        if result.returncode != 0 and not any(s in message for s in ("already completing or completed", "Invalid job id", "Job is pending execution")):
            raise dg.Failure(description=f"pool {handle.pool}: `scancel {' '.join(options)} {handle.job_id}` failed: {message}")
