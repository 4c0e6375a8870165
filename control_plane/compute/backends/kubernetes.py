"""The Kubernetes backend: each attempt of a step is one pod, launched with dagster-k8s's
`PipesK8sClient`.

The pod takes its shape from the pool's `backend_settings` (namespace, node selector,
tolerations for spot taints, service account, image pull secrets, secrets as environment,
labels) and its image from the pool's runtime for the step (`runtimes.<runtime>: IMAGE`). It
asks for `spec.gpus` of the pool's `gpu_resource` (default: its accelerator's device resource,
`kubernetes_devices.py`) as limits and runs
`python -m <entry_point>`. The Dagster Pipes context travels in an environment variable and
the workload's reports come back in the pod log, as PipesK8sClient does it.

The storage root (`SINEWGRID_HOME` in the pod) must be one the pods reach: an object store
(`s3://...`, `gs://...`) with credentials from `env_from_secrets`, not a path on the Dagster host.

How an attempt ends:

- the container exits 0: succeeded;
- exit 75 (the workload saved a checkpoint on SIGTERM), an eviction or a preemption (a
  `DisruptionTarget` condition, `reason: Evicted`), or a pod that vanished (its node was
  lost): preempted, and the step resumes from its checkpoint;
- still Pending after the pool's `pending_deadline_seconds` (Unschedulable: no node with the
  selector, taints or GPUs free), or refused by a namespace quota: the pod is deleted and the
  pool counts as having refused the step, which moves on to the next pool;
- anything else: failed, with the last lines of the pod log.

On a pool with `backend_settings.kueue` the pod (a gang: its JobSet) names its team's Kueue
LocalQueue and its priority class, and a step of a tenant no team names is refused there before
anything is created (docs/queues_kubernetes.md).

While the pod exists it is recorded in `state/inflight/`; `status` and `cancel` find it again
from that record (the watcher sensor uses them for pods an orchestrator left behind).

A gang (`StepSpec.gang`) runs as one JobSet instead, all of its pods or none
(`kubernetes_gang.py`); a node it lost is cordoned (`drain_node`).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import dagster as dg
from dagster_k8s.pipes import PipesK8sClient, PipesK8sPodLogsMessageReader
from dagster_pipes import PIPES_PROTOCOL_VERSION_FIELD
from kubernetes.client import ApiException, CoreV1Api
from urllib3.exceptions import HTTPError

from control_plane.catalog.backends import KubernetesSettings, settings_for
from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.compute.backends.base import (
    AttemptOutcome,
    AttemptResult,
    Backend,
    JobHandle,
    JobState,
    JobStatus,
    outcome_of,
)
from control_plane.compute.backends.kubernetes_gang import (
    JobSetGangs,
    JobSetNotCreated,
)
from control_plane.compute.backends.kubernetes_pod import (
    BROKEN_START_REASONS,
    CONTAINER,
    LABEL,
    core_api,
    job_status,
    log_tail,
    pod_spec_for,
)
from control_plane.compute.causes import Cause
from control_plane.compute.inflight import attempt_owner, inflight_of
from control_plane.queues.kueue import NoTeamOnKueuePool
from workload_runtime.inputs import WorkloadInputs
from workload_runtime.messages import parse_messages
from workload_runtime.storage import write_bytes_atomic


# PipesK8sClient, with a pending deadline ----------------------------------------------------------
class PodNotScheduled(Exception):
    """The pod stayed Pending past the pool's deadline; it has been deleted."""


class PodCannotStart(Exception):
    """The pod's container cannot start without a fix (image, secret, command)."""


class PodGone(Exception):
    """The pod disappeared before it could be seen to end (node lost, preempted and deleted)."""


class _RememberingPodLogsReader(PipesK8sPodLogsMessageReader):
    """PipesK8sClient's pod-log reader, keeping its message handler after the session, so an
    attempt that failed or was preempted still yields what the workload reported."""

    handler: Any = None

    @contextmanager
    def read_messages(self, handler: Any) -> Iterator[Any]:
        self.handler = handler
        with super().read_messages(handler) as params:
            yield params


class _PodWatch:
    """Sleeps between PipesK8sClient's polls of the pod, and ends its wait when it should end.

    PipesK8sClient waits for a pod to start with no deadline of its own (its launch timeout,
    a day, is not a `run` argument) and waits out that day for a pod that vanished before it
    saw the pod end. Its Kubernetes client takes the function it sleeps with; this one checks
    the pod after each sleep: Pending past the pool's deadline -> delete it and raise
    PodNotScheduled; a container that cannot start -> PodCannotStart; gone -> PodGone.
    """

    def __init__(self, api: CoreV1Api, namespace: str, name: str, pending_deadline_seconds: float):
        self.api, self.namespace, self.name = api, namespace, name
        self.pending_deadline_seconds = pending_deadline_seconds
        self.deadline = time.time() + pending_deadline_seconds

    def __call__(self, seconds: float) -> None:
        time.sleep(seconds)
        try:
            pod = self.api.read_namespaced_pod(self.name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise PodGone(f"pod {self.namespace}/{self.name} is gone (deleted, or its node was lost)") from None
            raise
        state = job_status(pod)
        if state.state is not JobState.pending or time.time() < self.deadline:
            return
        waiting = next((c.state.waiting for c in pod.status.container_statuses or [] if c.state and c.state.waiting), None)
        if waiting is not None and waiting.reason in BROKEN_START_REASONS:
            raise PodCannotStart(f"pod {self.namespace}/{self.name} cannot start: {state.reason}")
        try:
            self.api.delete_namespaced_pod(self.name, self.namespace, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise
        raise PodNotScheduled(
            f"pod {self.namespace}/{self.name} still Pending after {self.pending_deadline_seconds:g}s (the pool's "
            f"`pending_deadline_seconds`): {(state.reason or 'not started').rstrip('. ')}; deleted it"
        )


class SinewgridPipesK8sClient(PipesK8sClient):
    """PipesK8sClient (env-var context, pod-log messages) with the pool's pending deadline,
    a callback once the pod exists, and the workload's messages kept on failure."""

    def __init__(self, settings: KubernetesSettings, pending_deadline_seconds: float, on_created: Callable[[str], None]):
        super().__init__(
            message_reader=_RememberingPodLogsReader(),
            kubeconfig_file=settings.kubeconfig,
            kube_context=settings.context,
            poll_interval=settings.poll_seconds,
        )
        self.pending_deadline_seconds = pending_deadline_seconds
        self.on_created = on_created

    @contextmanager
    def consume_pod_logs(self, context: Any, client: Any, namespace: str, pod_name: str, **kwargs: Any) -> Iterator[None]:
        # PipesK8sClient calls this right after it created the pod, and waits for the pod to
        # end inside it: the place to learn the pod's name and to watch the pending deadline.
        self.on_created(pod_name)
        client.sleeper = _PodWatch(client.core_api, namespace, pod_name, self.pending_deadline_seconds)
        with super().consume_pod_logs(context=context, client=client, namespace=namespace, pod_name=pod_name, **kwargs):
            yield

    def reported_messages(self) -> list[Any]:
        handler = self.message_reader.handler  # type: ignore[attr-defined]
        return list(handler.get_custom_messages()) if handler else []


# The backend --------------------------------------------------------------------------------------
def _without_pipes_messages(log: bytes) -> bytes:
    """The pod log minus the Pipes protocol lines (those reached Dagster as events already)."""
    kept = []
    for line in log.splitlines(keepends=True):
        if line.startswith(b"{") and PIPES_PROTOCOL_VERSION_FIELD.encode() in line:
            try:
                if PIPES_PROTOCOL_VERSION_FIELD in json.loads(line):
                    continue
            except ValueError:
                pass
        kept.append(line)
    return b"".join(kept)


class KubernetesBackend(Backend):
    """Runs each attempt as a pod on the pool's cluster, through PipesK8sClient."""

    kind = "kubernetes"
    runs_gangs = True  # as a JobSet (kubernetes_gang.py)

    def __init__(self) -> None:
        self.gangs = JobSetGangs()

    @staticmethod
    def handle_for(pool: Pool, pod_name: str) -> JobHandle:
        settings: KubernetesSettings = settings_for(pool)
        info = {"namespace": settings.namespace, "kubeconfig": settings.kubeconfig, "context": settings.context}
        return JobHandle("kubernetes", pool.name, pod_name, time.time(), info)

    def run_attempt(
        self, context: dg.AssetExecutionContext, pool: Pool, spec: StepSpec, inputs: WorkloadInputs
    ) -> AttemptResult:
        if (refused := self.gang_refusal(pool, spec)) is not None:
            return refused
        settings: KubernetesSettings = settings_for(pool)
        try:
            pod = pod_spec_for(pool, spec, storage_root=str(inputs.storage_root), run_id=context.run_id, attempt=inputs.attempt)
        except NoTeamOnKueuePool as exc:  # nothing created: another pool may take the step
            return AttemptResult(AttemptOutcome.refused, None, cause=Cause.refused, ended_at=time.time(), log_tail=str(exc))
        if spec.gang:
            try:
                return self.gangs.run_attempt(context, pool, spec, inputs, pod)
            except JobSetNotCreated as exc:
                return self._not_created(pool, settings, exc.__cause__, what="JobSet")
        inflight = inflight_of(inputs)
        handles: list[JobHandle] = []

        def created(pod_name: str) -> None:
            handles.append(self.handle_for(pool, pod_name))
            inflight.add(handles[0], **attempt_owner(context, spec, inputs))
            context.log.info(f"{spec.name}: pod {settings.namespace}/{pod_name} created on {pool.name}")

        client = SinewgridPipesK8sClient(settings, pool.pending_deadline_seconds, created)
        invocation, error = None, None
        try:
            invocation = client.run(
                context=context,
                extras=inputs.to_extras(),
                namespace=settings.namespace,
                base_pod_meta=pod["metadata"],
                base_pod_spec=pod["spec"],
                pod_wait_timeout=0,  # no limit on the run itself, as on every backend
                delete_pod_on_completion=False,  # read how it ended first
            )
        except dg.DagsterExecutionInterruptedError:
            if handles:
                context.log.warning(f"run cancelled: deleting pod {handles[0].job_id} (SIGTERM: the workload checkpoints)")
                self.cancel(handles[0])
                inflight.remove(handles[0])
            raise
        except Exception as exc:  # PipesK8sClient raises on any pod that did not succeed
            error = exc
        if not handles:
            return self._not_created(pool, settings, error)
        handle = handles[0]
        if error is None:
            status = JobStatus(JobState.succeeded, exit_code=0)
        elif isinstance(error, PodNotScheduled):
            status = JobStatus(JobState.cancelled, reason=str(error))
        elif isinstance(error, PodCannotStart):
            status = JobStatus(JobState.failed, reason=str(error))
        else:
            status = self.status(handle)
            if status.state is JobState.running:  # the client gave up on a pod that still runs
                status = JobStatus(JobState.failed, reason=f"lost track of the pod: {error}")
        log = _without_pipes_messages(self.collect(handle))
        self.cancel(handle)
        inflight.remove(handle)
        log_uri = inputs.log_uri
        if log_uri:
            write_bytes_atomic(log_uri, log)
        messages = parse_messages(invocation.get_custom_messages() if invocation else client.reported_messages())
        outcome, metadata = outcome_of(status), {}
        if invocation is not None:
            for result in invocation.get_results():
                metadata.update(getattr(result, "metadata", None) or {})
        tail = log_tail(log, outcome, status.reason)
        return AttemptResult(outcome, status.exit_code, messages, metadata, log_uri=log_uri, log_tail=tail)

    @staticmethod
    def _not_created(pool: Pool, settings: KubernetesSettings, error: BaseException | None, what: str = "pod") -> AttemptResult:
        """The API did not take the pod (or a gang's JobSet): a quota or an unreachable cluster is
        a refusal (try the next pool); anything else is a configuration to fix."""
        where = f"pool {pool.name}, namespace {settings.namespace}"
        if isinstance(error, ApiException) and error.status == 403 and "exceeded quota" in str(error.body):
            return AttemptResult(AttemptOutcome.refused, None, log_tail=f"{where}: the namespace's quota refused the {what}: {error.body}")
        if isinstance(error, HTTPError | ConnectionError):
            return AttemptResult(AttemptOutcome.refused, None, log_tail=f"{where}: the Kubernetes API is unreachable: {error}")
        crd = " (a JobSet needs the JobSet controller and its CRD installed: docs/gangs.md)" if what == "JobSet" else ""
        raise dg.Failure(
            description=(
                f"{where}: the Kubernetes API did not create the {what}: {error}{crd}. Check the pool's `backend_settings` "
                f"(namespace, kubeconfig: {settings.kubeconfig or 'default'}, context: {settings.context or 'current'}) "
                f"and the service account's rights to create {what}s there."
            )
        ) from error

    def drain_node(self, pool: Pool, node: str, reason: str) -> bool:
        """Cordon the node (`spec.unschedulable`, as `kubectl cordon`): its pods run on, no new pod lands there."""
        settings: KubernetesSettings = settings_for(pool)
        body = {"metadata": {"annotations": {f"{LABEL}/cordoned": reason[:250]}}, "spec": {"unschedulable": True}}
        try:
            core_api({"kubeconfig": settings.kubeconfig, "context": settings.context}).patch_node(node, body)
        except ApiException:
            return False
        return True

    # Finding, stopping and reading a pod again (the watcher, and the end of an attempt) ------------
    def status(self, handle: JobHandle) -> JobStatus:
        if handle.info.get("jobset"):
            return self.gangs.status(handle)
        try:
            pod = core_api(handle.info).read_namespaced_pod(handle.job_id, handle.info["namespace"])
        except ApiException as exc:
            if exc.status == 404:
                return job_status(None)
            raise
        return job_status(pod)

    def signal(self, handle: JobHandle, signum: int = signal.SIGTERM) -> None:
        """Kubernetes delivers only SIGTERM (by deleting the pod; SIGKILL follows after its
        `terminationGracePeriodSeconds`)."""
        if signum != signal.SIGTERM:
            raise ValueError(f"{handle.job_id}: Kubernetes can only send SIGTERM (by deleting the pod), not signal {signum}")
        self.cancel(handle)

    def cancel(self, handle: JobHandle) -> None:
        """Delete the pod (a gang: its JobSet): SIGTERM now (the workload checkpoints), SIGKILL after its grace period."""
        if handle.info.get("jobset"):
            return self.gangs.cancel(handle)
        try:
            core_api(handle.info).delete_namespaced_pod(handle.job_id, handle.info["namespace"])
        except ApiException as exc:
            if exc.status != 404:
                raise

    def collect(self, handle: JobHandle) -> bytes:
        """The pod log (stdout and stderr; a gang: rank 0's), or nothing once the pod is gone or never started."""
        if handle.info.get("jobset"):
            return self.gangs.collect(handle)
        try:
            response = core_api(handle.info).read_namespaced_pod_log(
                handle.job_id, handle.info["namespace"], container=CONTAINER, _preload_content=False
            )
        except ApiException as exc:
            if exc.status in (400, 404):
                return b""
            raise
        return response.data
