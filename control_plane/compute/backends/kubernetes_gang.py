"""A gang on a Kubernetes pool: one JobSet, all of its pods or none.

A step of `nodes: N` × `ranks_per_node: R` becomes a JobSet (`jobset.x-k8s.io/v1alpha2`) with one
replicated job of N indexed pods (`completionMode: Indexed`, parallelism = completions = N,
`backoffLimit: 0`). Each pod is the pod a single attempt would be (`pod_spec_for`: image, env,
node selector, tolerations, secrets, one node's share of the devices, Kueue's topology annotations
for a tightly coupled gang: kubernetes_devices.py), running `torchrun --nnodes N --node-rank
$(JOB_COMPLETION_INDEX) --nproc-per-node R` (the command the local backend's nodes run,
`gang.torchrun_command`), with:

- the rendezvous at rank 0's pod by its DNS name in the JobSet's headless service
  (`<jobset>-nodes-0-0.<jobset>`, `network.enableDNSHostnames`), on a port derived from the
  JobSet's name (a relaunch never meets the old gang's port on a host network);
- `SINEWGRID_NODE` = the node's name (downward API), so telemetry names each rank's node;
- a pod anti-affinity on `kubernetes.io/hostname` (one pod per node) and a node affinity
  `metadata.name NotIn` the nodes the step no longer uses (`StepSpec.exclude_nodes`);
- `failurePolicy.maxRestarts: 0`: the platform, not JobSet, decides where the gang runs again;
  `successPolicy: All`;
- `kueue.x-k8s.io/queue-name` when the pool names a `queue`, or its team's LocalQueue and
  `kueue.x-k8s.io/priority-class` when the pool has `kueue: true` (docs/queues_kubernetes.md):
  Kueue then admits all N pods or none, and the JobSet waits suspended until it does.

Only rank 0 talks to Dagster Pipes: the context travels in every pod's environment, and the
messages are read from rank 0's pod log (as PipesK8sPodLogsMessageReader reads a single pod's),
which is also kept as the attempt's log, since a failed JobSet's pods are deleted with it.

How an attempt ends: every pod succeeded: succeeded. A pod failed: the JobSet fails and its
other pods get SIGTERM; once none runs, the first pod that failed says how (its exit code, 137
read as SIGKILL; an eviction or lost node as a preemption), and its node is the one the gang lost
(`AttemptResult.node`: the platform cordons it, `drain_node`, and relaunches on a spare).
Still pending (not admitted, pods unschedulable) after the pool's `pending_deadline_seconds`:
the JobSet is deleted, nothing ran, the pool refused the step.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import signal
import threading
import time
import uuid
from typing import Any

import dagster as dg
from dagster_k8s.pipes import PipesK8sPodLogsMessageReader
from dagster_pipes import PIPES_PROTOCOL_VERSION_FIELD
from kubernetes.client import ApiException, CoreV1Api, CustomObjectsApi

from control_plane.catalog.backends import KubernetesSettings, settings_for
from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.compute.backends.base import (
    AttemptOutcome,
    AttemptResult,
    JobHandle,
    JobState,
    JobStatus,
    ending_cause,
    outcome_of,
    rendezvous_port,
)
from control_plane.compute.backends.gang import torchrun_command
from control_plane.compute.backends.kubernetes_devices import TOPOLOGY_ANNOTATIONS
from control_plane.compute.backends.kubernetes_pod import (
    CONTAINER,
    core_api,
    job_status,
    log_tail,
)
from control_plane.compute.causes import Cause
from control_plane.compute.inflight import attempt_owner, inflight_of
from control_plane.compute.monitor import AttemptMonitor
from control_plane.queues.kueue import PRIORITY_LABEL, QUEUE_LABEL
from workload_runtime.inputs import WorkloadInputs
from workload_runtime.messages import Preemption, of_kind, parse_messages
from workload_runtime.storage import write_bytes_atomic
from workload_runtime.workload import PREEMPTED_EXIT_CODE

GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
REPLICATED_JOB = "nodes"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
HOSTNAME_KEY = "kubernetes.io/hostname"
# A container killed by a signal reads as 128 + the signal; the OOM killer's SIGKILL is the workload's own doing.
SIGNAL_EXIT_CODES = {128 + signal.SIGKILL: -signal.SIGKILL, 128 + signal.SIGTERM: -signal.SIGTERM}


class JobSetNotCreated(Exception):
    """The API did not take the JobSet (quota, no JobSet CRD, unreachable); `__cause__` says why."""


# The JobSet -------------------------------------------------------------------------------------
def jobset_name(spec: StepSpec, attempt: int) -> str:
    """A DNS label short enough for the names JobSet derives from it (pods' host names)."""
    step = re.sub(r"[^a-z0-9-]+", "-", spec.name.lower()).strip("-")[:24].strip("-") or "step"
    return f"{step}-a{attempt}-{uuid.uuid4().hex[:6]}"


def rank_zero_host(name: str) -> str:
    """Rank 0's pod in the JobSet's headless service: `<jobset>-<job>-<job index>-<pod index>.<subdomain>`."""
    return f"{name}-{REPLICATED_JOB}-0-0.{name}"


def master_port(name: str) -> int:
    """Rank 0's port, from the JobSet's name: two gangs whose pods share a node's network (the
    local stand-in, `hostNetwork` pods) do not pick the same one."""
    return rendezvous_port(int(hashlib.sha256(name.encode()).hexdigest()[:8], 16))


def gang_affinity(name: str, exclude_nodes: list[str]) -> dict[str, Any]:
    """One pod of the gang per node, and none on the nodes the step no longer uses."""
    affinity: dict[str, Any] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {JOBSET_LABEL: name}}, "topologyKey": HOSTNAME_KEY}]
        }
    }
    if exclude_nodes:
        term = {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": list(exclude_nodes)}]}
        affinity["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    return affinity


def jobset_for(pod: dict[str, Any], spec: StepSpec, settings: KubernetesSettings, *, name: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The JobSet for one attempt of the gang `spec`, from the pod a single attempt would be."""
    template = copy.deepcopy(pod)
    container = template["spec"]["containers"][0]
    container["command"] = torchrun_command("python", spec, "$(JOB_COMPLETION_INDEX)", master_port(name), master_addr=rank_zero_host(name))
    container["env"] = [
        *container.get("env", []),
        {"name": "SINEWGRID_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        *({"name": k, "value": v} for k, v in (env or {}).items()),
    ]
    template["spec"]["affinity"] = gang_affinity(name, spec.exclude_nodes)
    labels = dict(template["metadata"]["labels"])
    for kueue in (QUEUE_LABEL, PRIORITY_LABEL):  # Kueue admits the JobSet whole: its pods carry no queue of their own
        template["metadata"]["labels"].pop(kueue, None)
    if settings.queue:
        labels[QUEUE_LABEL] = settings.queue
    # Kueue reads its topology annotations on the pod template only: the JobSet carries the others.
    annotations = {k: v for k, v in (template["metadata"].get("annotations") or {}).items() if k not in TOPOLOGY_ANNOTATIONS}
    job = {"completionMode": "Indexed", "parallelism": spec.nodes, "completions": spec.nodes, "backoffLimit": 0, "template": template}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {
            "network": {"enableDNSHostnames": True},
            "failurePolicy": {"maxRestarts": 0},
            "successPolicy": {"operator": "All"},
            "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1, "template": {"spec": job}}],
        },
    }


# Reading a JobSet back -----------------------------------------------------------------------------
def _condition(jobset: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (jobset.get("status") or {}).get("conditions") or [] if c.get("type") == kind and c.get("status") == "True"), None)


def _index(pod: Any) -> int:
    return int((pod.metadata.labels or {}).get(INDEX_LABEL, "0"))


def _finished_at(pod: Any) -> tuple[float, int]:
    terminated = next((c.state.terminated for c in pod.status.container_statuses or [] if c.state and c.state.terminated), None)
    at = terminated.finished_at.timestamp() if terminated is not None and terminated.finished_at else float("inf")
    return at, _index(pod)


def first_failed(pods: list[Any]) -> Any | None:
    """The pod whose failure ended the gang: the first to end Failed (its peers were stopped after it)."""
    failed = [p for p in pods if p.status.phase == "Failed"]
    return min(failed, key=_finished_at) if failed else None


class _RankZeroLog(PipesK8sPodLogsMessageReader):
    """PipesK8sClient's pod-log reader, following rank 0's pod once it runs: Pipes messages go
    to the session, every other line is kept as the attempt's log."""

    def __init__(self) -> None:
        super().__init__()
        self.log = bytearray()
        self.thread: threading.Thread | None = None
        self.pod: str | None = None

    def follow(self, core: CoreV1Api, namespace: str, pod: str, container: str) -> None:
        handler = self._handler
        self.pod = pod

        def read() -> None:
            try:
                response = core.read_namespaced_pod_log(pod, namespace, container=container, follow=True, _preload_content=False)
                rest = b""
                for chunk in response.stream(4096):
                    *lines, rest = (rest + chunk).split(b"\n")
                    for line in lines:
                        self._take(handler, line)
                if rest:
                    self._take(handler, rest)
            except Exception as exc:  # noqa: BLE001 - the pod went away under the stream: keep what came
                self.log += f"[sinewgrid: stopped reading pod {pod}'s log: {exc}]\n".encode()

        self.thread = threading.Thread(target=read, name=f"rank0-log-{pod}", daemon=True)
        self.thread.start()

    def _take(self, handler: Any, line: bytes) -> None:
        if line.startswith(b"{") and PIPES_PROTOCOL_VERSION_FIELD.encode() in line:
            try:
                message = json.loads(line)
            except ValueError:
                message = None
            if isinstance(message, dict) and PIPES_PROTOCOL_VERSION_FIELD in message:
                handler.handle_message(message)
                return
        self.log += line + b"\n"

    def join(self, timeout: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout)


class JobSetGangs:
    """Runs a gang's attempt as a JobSet, and finds, stops and reads one again from its handle."""

    # Reading -------------------------------------------------------------------------------------
    def _jobset(self, handle: JobHandle) -> dict[str, Any] | None:
        custom = CustomObjectsApi(core_api(handle.info).api_client)
        try:
            return custom.get_namespaced_custom_object(GROUP, VERSION, handle.info["namespace"], PLURAL, handle.job_id)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def pods(self, handle: JobHandle) -> list[Any]:
        listed = core_api(handle.info).list_namespaced_pod(handle.info["namespace"], label_selector=f"{JOBSET_LABEL}={handle.job_id}")
        return sorted(listed.items, key=_index)

    def status(self, handle: JobHandle) -> JobStatus:
        return self._status(self._jobset(handle), self.pods(handle), handle)

    def _status(self, jobset: dict[str, Any] | None, pods: list[Any], handle: JobHandle) -> JobStatus:
        alive = [p for p in pods if p.status.phase in ("Pending", "Running")]
        if jobset is None:
            if alive:
                return JobStatus(JobState.running, reason=f"JobSet {handle.job_id} deleted; {len(alive)} pod(s) still stopping")
            return JobStatus(JobState.gone, reason=f"JobSet {handle.job_id} is gone (deleted)")
        if (jobset.get("status") or {}).get("terminalState") == "Completed":
            return JobStatus(JobState.succeeded, exit_code=0)
        failed = _condition(jobset, "Failed")
        if failed is not None:
            words = f"JobSet {handle.job_id} failed: {failed.get('message') or failed.get('reason')}"
            if alive:  # the gang is over only once none of its ranks still writes (a checkpoint, say)
                return JobStatus(JobState.running, reason=f"{words}; {len(alive)} pod(s) still stopping")
            first = first_failed(pods)
            if first is None:
                return JobStatus(JobState.failed, reason=words)
            ended = job_status(first)
            code = ended.exit_code
            oom = any(c.state.terminated.reason == "OOMKilled" for c in first.status.container_statuses or [] if c.state and c.state.terminated)
            code = code if oom or code is None else SIGNAL_EXIT_CODES.get(code, code)
            state = ended.state if ended.state in (JobState.preempted, JobState.failed) else JobState.failed
            detail = f"; {ended.reason}" if ended.reason else ""
            return JobStatus(state, code, f"{words}; first to fail: pod {first.metadata.name} on node {first.spec.node_name} (exit {ended.exit_code}{detail})")
        suspended = _condition(jobset, "Suspended")
        needed = handle.info.get("pods", 1)
        if suspended is not None or len(pods) < needed:
            why = (suspended or {}).get("message") or f"{len(pods)} of {needed} pods created"
            return JobStatus(JobState.pending, reason=f"JobSet {handle.job_id} not admitted: {why}")
        waiting = [job_status(p) for p in pods if p.status.phase == "Pending"]
        if waiting:
            return JobStatus(JobState.pending, reason=f"{len(waiting)} of {needed} pods pending: {waiting[0].reason}".rstrip(": "))
        return JobStatus(JobState.running)

    def lost_node(self, handle: JobHandle) -> str | None:
        """The node of the pod that failed first: the node the gang lost."""
        first = first_failed(self.pods(handle))
        return first.spec.node_name if first is not None else None

    def collect(self, handle: JobHandle) -> bytes:
        """Rank 0's pod log while the pod exists (the attempt keeps what it read as it ran)."""
        rank_zero = next((p for p in self.pods(handle) if _index(p) == 0), None)
        if rank_zero is None:
            return b""
        try:
            response = core_api(handle.info).read_namespaced_pod_log(
                rank_zero.metadata.name, handle.info["namespace"], container=CONTAINER, _preload_content=False
            )
        except ApiException as exc:
            if exc.status in (400, 404):
                return b""
            raise
        return response.data

    # Stopping ------------------------------------------------------------------------------------
    def cancel(self, handle: JobHandle) -> None:
        """Delete the JobSet and with it every pod: SIGTERM now (the ranks checkpoint), SIGKILL after their grace period."""
        custom = CustomObjectsApi(core_api(handle.info).api_client)
        try:
            custom.delete_namespaced_custom_object(GROUP, VERSION, handle.info["namespace"], PLURAL, handle.job_id, propagation_policy="Background")
        except ApiException as exc:
            if exc.status != 404:
                raise

    # One attempt ---------------------------------------------------------------------------------
    def run_attempt(
        self, context: dg.AssetExecutionContext, pool: Pool, spec: StepSpec, inputs: WorkloadInputs, pod: dict[str, Any]
    ) -> AttemptResult:
        settings: KubernetesSettings = settings_for(pool)
        name = jobset_name(spec, inputs.attempt)
        info = {"namespace": settings.namespace, "kubeconfig": settings.kubeconfig, "context": settings.context, "jobset": True, "pods": spec.nodes}
        handle = JobHandle("kubernetes", pool.name, name, time.time(), info)
        core = core_api(info)
        reader = _RankZeroLog()
        inflight = inflight_of(inputs)
        with dg.open_pipes_session(context=context, context_injector=dg.PipesEnvContextInjector(), message_reader=reader, extras=inputs.to_extras()) as session:
            body = jobset_for(pod, spec, settings, name=name, env=session.get_bootstrap_env_vars())
            try:
                CustomObjectsApi(core.api_client).create_namespaced_custom_object(GROUP, VERSION, settings.namespace, PLURAL, body)
            except Exception as exc:
                raise JobSetNotCreated(str(exc)) from exc
            inflight.add(handle, **attempt_owner(context, spec, inputs))
            context.log.info(f"{spec.name}: JobSet {settings.namespace}/{name} created on {pool.name} ({spec.nodes} node(s) × {spec.ranks_per_node or 1} rank(s))")
            monitor = AttemptMonitor(pool, spec, messages=session.get_custom_messages, node_problem=lambda: None, log=context.log.warning)
            try:
                status, started_at, lost = self._watch(context, pool, handle, reader, monitor, settings.poll_seconds)
            except dg.DagsterExecutionInterruptedError:
                context.log.warning(f"run cancelled: deleting JobSet {name} (SIGTERM to every rank: they checkpoint)")
                self.cancel(handle)
                inflight.remove(handle)
                raise
            reader.join(timeout=30)
        ended_at = time.time()
        self.cancel(handle)
        inflight.remove(handle)
        log = bytes(reader.log)
        if inputs.log_uri:
            write_bytes_atomic(inputs.log_uri, log)
        messages = parse_messages(session.get_custom_messages())
        outcome = outcome_of(status)
        cause = ending_cause(outcome, status.exit_code, monitor.acted)
        node = monitor.acted.node if monitor.acted is not None else ((lost or "") if cause == Cause.lost_node else "")
        if outcome is AttemptOutcome.failed and of_kind(messages, Preemption):
            outcome = AttemptOutcome.preempted  # every rank checkpointed on SIGTERM and exited 75
            cause = ending_cause(outcome, PREEMPTED_EXIT_CODE, monitor.acted)
        metadata: dict[str, Any] = {}
        if outcome is AttemptOutcome.succeeded:
            for result in session.get_results():
                metadata.update(getattr(result, "metadata", None) or {})
        tail = log_tail(log, outcome, status.reason)
        return AttemptResult(
            outcome, status.exit_code, messages, metadata, log_uri=inputs.log_uri, log_tail=tail,
            queue_seconds=max((started_at or ended_at) - handle.submitted_at, 0.0), running_at=started_at, ended_at=ended_at,
            cause=cause, flags=[f.to_json() for f in monitor.flags], node=node,
        )  # fmt: skip

    def _watch(
        self, context: dg.AssetExecutionContext, pool: Pool, handle: JobHandle, reader: _RankZeroLog, monitor: AttemptMonitor, poll_seconds: float
    ) -> tuple[JobStatus, float | None, str | None]:
        """Poll until the gang ends: how it ended, when it was first seen running, the node it lost.
        Follows rank 0's log once its pod runs; deletes the JobSet at the pending deadline, or when
        the monitor asks for the gang to stop (SIGTERM: the ranks checkpoint)."""
        deadline = handle.submitted_at + pool.pending_deadline_seconds
        started_at: float | None = None
        stopped = False
        last: JobState | None = None
        while True:
            pods = self.pods(handle)
            status = self._status(self._jobset(handle), pods, handle)
            rank_zero = next((p for p in pods if _index(p) == 0), None)
            if reader.thread is None and rank_zero is not None and rank_zero.status.phase != "Pending":
                reader.follow(core_api(handle.info), handle.info["namespace"], rank_zero.metadata.name, CONTAINER)
            if status.state != last:
                context.log.debug(f"JobSet {handle.job_id}: {status.state.value} {status.reason}".rstrip())
                last = status.state
            if status.state is not JobState.pending and started_at is None:
                started_at = time.time()
            if status.state.ended:
                lost = first.spec.node_name if (first := first_failed(pods)) is not None else None
                if stopped and status.state is not JobState.succeeded and monitor.acted is not None:
                    status = JobStatus(JobState.preempted, status.exit_code, f"stopped by Sinewgrid: {monitor.acted.detail}")
                return status, started_at, lost
            if status.state is JobState.running and not stopped and monitor.poll() is not None:
                self.cancel(handle)  # deleting the JobSet is how Kubernetes sends SIGTERM to every rank (SIGKILL after their grace)
                stopped = True
            if status.state is JobState.pending and time.time() > deadline:
                self.cancel(handle)
                return JobStatus(
                    JobState.cancelled,
                    reason=(
                        f"pool {pool.name}: {status.reason or 'not admitted'}; still pending after {pool.pending_deadline_seconds:g}s "
                        f"(the pool's `pending_deadline_seconds`): deleted the JobSet before its gang could start"
                    ),
                ), None, None
            time.sleep(poll_seconds)
