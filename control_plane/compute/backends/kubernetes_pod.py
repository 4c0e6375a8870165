"""The pod one attempt runs as on a Kubernetes pool, and what a pod's status says about it.

Shared by the single-pod path (`kubernetes.py`, through PipesK8sClient) and the gang path
(`kubernetes_gang.py`, a JobSet whose pod template is this pod).
"""

from __future__ import annotations

import math
import re
from typing import Any

import dagster as dg
import kubernetes
from kubernetes.client import CoreV1Api

from control_plane.catalog.backends import KubernetesSettings, settings_for
from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.compute.backends.base import AttemptOutcome, JobState, JobStatus
from control_plane.compute.backends.kubernetes_devices import device_limits, node_selector, topology_annotations
from control_plane.queues.kueue import workload_labels
from control_plane.settings import settings

CONTAINER = "workload"
LABEL = "sinewgrid.io"
# Pod `status.reason` values that mean the platform took the pod away, not that it failed.
DISRUPTION_REASONS = {"Evicted", "Preempting", "NodeLost", "Shutdown", "NodeShutdown", "Terminated"}
# Waiting reasons of a container that will not start without a fix (image, secret, command).
BROKEN_START_REASONS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "RunContainerError"}


# The pod ---------------------------------------------------------------------------------------
def label_value(text: str) -> str:
    """`text` as a Kubernetes label value: at most 63 of [A-Za-z0-9._-], alphanumeric at both ends."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", str(text))[:63].strip("._-") or "none"


def image_for(pool: Pool, spec: StepSpec) -> str:
    """The container image the pool runs the step's runtime with."""
    image = pool.runtimes.get(spec.runtime)
    if not isinstance(image, str) or not image:
        raise dg.Failure(
            description=(
                f"pool {pool.name} (kubernetes) has no container image for the `{spec.runtime}` runtime that "
                f"{spec.name} needs (got {image!r}). Set `runtimes.{spec.runtime}` for this pool in the pool "
                f"catalog to an image, e.g. `registry.example.com/sinewgrid/workload:0.1.0`."
            )
        )
    return image


def pod_spec_for(pool: Pool, spec: StepSpec, *, storage_root: str, run_id: str, attempt: int) -> dict[str, Any]:
    """The pod for one attempt of `spec` on `pool`, as `{"metadata": ..., "spec": ...}` in the
    API's own (camelCase) field names: the `base_pod_meta` and `base_pod_spec` handed to
    PipesK8sClient, which adds the pod's name and the Pipes variables. On a pool with `kueue: true`
    the pod names its team's LocalQueue (raises `NoTeamOnKueuePool` for a tenant of no team)."""
    settings: KubernetesSettings = settings_for(pool)
    labels = {
        **{k: label_value(v) for k, v in settings.labels.items()},
        f"{LABEL}/run-id": label_value(run_id),
        f"{LABEL}/step": label_value(spec.name),
        f"{LABEL}/attempt": str(attempt),
        f"{LABEL}/pool": label_value(pool.name),
        **workload_labels(pool, spec),  # Kueue's queue and priority class, where the pool's Kueue enforces the quotas
    }
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image_for(pool, spec),
        "command": ["python", "-m", spec.entry_point],
        "env": [
            {"name": "SINEWGRID_HOME", "value": storage_root},
            {"name": "SINEWGRID_POOL", "value": pool.name},
            {"name": "PYTHONUNBUFFERED", "value": "1"},  # the log shows the workload's output as it comes
        ],
    }
    if settings.env_from_secrets:
        container["envFrom"] = [{"secretRef": {"name": name}} for name in settings.env_from_secrets]
    if limits := device_limits(pool, spec, settings):  # per pod: one node's share (kubernetes_devices.py)
        container["resources"] = {"limits": limits}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # a failed attempt is the platform's to retry, elsewhere if need be
        # Time for the workload to save its checkpoint after SIGTERM (eviction, spot reclaim).
        "terminationGracePeriodSeconds": max(30, math.ceil(2 * spec.checkpoint_seconds + 10)),
        "containers": [container],
    }
    if selector := node_selector(pool, settings):
        pod_spec["nodeSelector"] = selector
    if settings.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in settings.tolerations]
    if settings.service_account:
        pod_spec["serviceAccountName"] = settings.service_account
    if settings.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in settings.image_pull_secrets]
    annotations = {f"{LABEL}/step": spec.name, f"{LABEL}/run-id": run_id, **topology_annotations(pool, spec)}  # Kueue TAS: a gang's template
    metadata = {"labels": labels, "annotations": annotations}
    return {"metadata": metadata, "spec": pod_spec}


def job_status(pod: Any | None) -> JobStatus:
    """What a pod (a `V1Pod`, or None when the API no longer has it) says about the attempt."""
    if pod is None:
        return JobStatus(JobState.gone, reason="the pod is gone (deleted, or its node was lost)")
    status = pod.status
    terminated = next((c.state.terminated for c in status.container_statuses or [] if c.state and c.state.terminated), None)
    exit_code = terminated.exit_code if terminated else None
    disruption = next((c for c in status.conditions or [] if c.type == "DisruptionTarget" and c.status == "True"), None)
    words = "; ".join(
        w
        for w in (
            f"{status.reason}: {status.message}" if status.reason else "",
            f"{disruption.reason}: {disruption.message}" if disruption else "",
            f"container {terminated.reason}" if terminated and terminated.reason not in (None, "Completed", "Error") else "",
        )
        if w
    )
    if status.phase == "Pending":
        unscheduled = next((c for c in status.conditions or [] if c.type == "PodScheduled" and c.status == "False"), None)
        waiting = next((c.state.waiting for c in status.container_statuses or [] if c.state and c.state.waiting), None)
        if unscheduled:
            words = f"{unscheduled.reason}: {unscheduled.message}"
        elif waiting:
            words = f"{waiting.reason}: {waiting.message}" if waiting.message else str(waiting.reason)
        return JobStatus(JobState.pending, reason=words)
    if status.phase == "Running":
        return JobStatus(JobState.running, reason=words)
    if status.phase == "Succeeded" or exit_code == 0:
        return JobStatus(JobState.succeeded, exit_code=0)
    if disruption or status.reason in DISRUPTION_REASONS:
        return JobStatus(JobState.preempted, exit_code=exit_code, reason=words)
    return JobStatus(JobState.failed, exit_code=exit_code, reason=words)


# The client ---------------------------------------------------------------------------------------
def core_api(info: dict[str, Any]) -> CoreV1Api:
    """A Kubernetes client for a pool's (or a job handle's) kubeconfig and context; in a
    cluster with neither, the in-cluster service account."""
    kubeconfig, context = info.get("kubeconfig"), info.get("context")
    if kubeconfig or context or not settings().in_kubernetes:
        return CoreV1Api(kubernetes.config.new_client_from_config(config_file=kubeconfig, context=context))
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_incluster_config(client_configuration=configuration)
    return CoreV1Api(kubernetes.client.ApiClient(configuration))


def log_tail(log: bytes, outcome: AttemptOutcome, reason: str) -> str:
    """The attempt's last words: the pod's last log lines, or why nothing ran (a refusal)."""
    tail = "\n".join(log.decode("utf-8", errors="replace").rstrip().splitlines()[-25:])
    if outcome is AttemptOutcome.refused:
        return reason
    return f"[kubernetes: {reason}]\n{tail}" if reason else tail
