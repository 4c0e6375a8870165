"""A fake Kubernetes API server with a one-machine "kubelet", for the Kubernetes backend tests.

No Kubernetes API server can run on the test machines (no container engine, no
kube-apiserver package), so this module serves, on 127.0.0.1, the few endpoints the real
`kubernetes` Python client and dagster-k8s's `PipesK8sClient` call:

- `POST/GET /api/v1/namespaces/{ns}/pods` (create, list with `fieldSelector=metadata.name=`
  and `labelSelector=k=v,...`), `GET/DELETE /api/v1/namespaces/{ns}/pods/{name}`;
- `GET .../pods/{name}/log` with `follow`, `timestamps`, `sinceSeconds`, `tailLines`;
- `GET /api/v1/namespaces/{ns}/events` (always empty);
- `GET/PATCH /api/v1/nodes/{name}`: a patch may set `spec.unschedulable` (cordon) and annotations;
- the JobSet CRD (`jobset.x-k8s.io/v1alpha2`): `POST .../namespaces/{ns}/jobsets`, `GET/DELETE
  .../jobsets/{name}`, for JobSets of one replicated job of Indexed pods.

Any other request is answered 404 with a message that names it, so a client call this fake
lacks shows up as such rather than as a hang.

Behind the API, a "scheduler" and a "kubelet" act on each pod the way a cluster would:

- scheduling: a pod binds to the first schedulable (not cordoned) `FakeNode` whose labels match
  its `nodeSelector`, whose taints it tolerates and whose GPU capacity covers its GPU limit; with
  none, the pod stays Pending with `PodScheduled=False, reason=Unschedulable` and the scheduler's
  message;
- running: **the container's command runs as a local subprocess, whatever the image.** A
  command starting with `python` (or `python3`) runs with the interpreter running the tests
  (the project's virtual environment, `/work/main/.venv/bin/python`), in the repository root,
  with the container's `env` (plus PATH, HOME, LANG and HOSTNAME = the pod name). `envFrom`
  secrets and `secretKeyRef` are not resolved; the downward API's `fieldRef` to `spec.nodeName`,
  `metadata.name` and `metadata.namespace` is, and `$(VAR)` in the command expands from the
  container's env, as a kubelet does. Its stdout and stderr become the pod log, line by
  line, with RFC 3339 timestamps, so Dagster Pipes messages travel through the pod log
  exactly as they do on a cluster;
- phases: Pending (ContainerCreating) -> Running (ready) -> Succeeded / Failed, with the
  container's `terminated.exitCode`;
- deletion: SIGTERM to the process group, SIGKILL after the grace period, then the pod is gone;
- `evict()` (kubelet eviction, a spot node reclaimed): `DisruptionTarget` condition, SIGTERM,
  SIGKILL after the grace period, then the pod stays `Failed` with `reason: Evicted`;
- `preempt()` (scheduler preemption): `DisruptionTarget` condition, then a graceful delete;
- `lose_node()` (a node crashes): every container on it is killed with its process tree
  (SIGKILL: the pods end Failed, exit 137); the node comes back empty, schedulable unless
  cordoned. A SIGKILL after a grace period also takes the whole process tree, as a container
  runtime does (torchrun starts its ranks in sessions of their own).

A JobSet controller with Kueue-style admission stands in for the JobSet operator and Kueue:

- **all or nothing**: a JobSet's pods are created only when as many schedulable nodes as it has
  pods match their selector, tolerations, node affinity (`matchFields metadata.name`,
  `matchExpressions` on labels) and have the GPUs free (GPUs of the pods bound there are taken),
  one pod per node under the gang's pod anti-affinity on `kubernetes.io/hostname`. Until then
  no pod exists and the JobSet carries `Suspended=True` with the reason in its message (on a
  cluster, Kueue keeps it suspended and writes why on its Workload); it is admitted when
  capacity frees up, as Kueue re-queues it;
- the pods are named as JobSet names them (`<jobset>-<job>-<job index>-<pod index>-<suffix>`),
  carry its labels, `hostname`/`subdomain`, the completion index label and annotation and
  `JOB_COMPLETION_INDEX`, and are bound to the nodes admission chose;
- **DNS**: there is no cluster DNS here. A JobSet pod's host name in its headless service
  (`<jobset>-<job>-<j>-<i>.<jobset>[.<ns>.svc.cluster.local]`) in a command or env value is
  replaced by 127.0.0.1 (every pod runs on this machine), which stands in for the resolution;
- status: `terminalState` Completed once every pod succeeded; the first pod that fails fails the
  JobSet (`failurePolicy.maxRestarts: 0` is the only policy it implements), with a `Failed`
  condition naming the pod, and its other pods are deleted (SIGTERM, SIGKILL after their grace
  period) as JobSet deletes a failed JobSet's active jobs; the failed pod stays until the JobSet
  is deleted. Deleting a JobSet deletes its pods (graceful).

Nothing here pulls images, isolates processes, limits resources or exposes GPUs; no network
policy, no real DNS, no Kueue quotas (ClusterQueue, LocalQueue) and no JobSet webhooks.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import signal
import string
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import psutil
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_GRACE_SECONDS = 30


@dataclass
class FakeNode:
    """A node the fake scheduler can bind pods to."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)  # {key, value, effect}
    gpus: int = 0
    gpu_resource: str = "nvidia.com/gpu"
    unschedulable: bool = False  # cordoned
    annotations: dict[str, str] = field(default_factory=dict)

    def manifest(self) -> dict[str, Any]:
        labels = {"kubernetes.io/hostname": self.name, **self.labels}
        return {
            "kind": "Node", "apiVersion": "v1",
            "metadata": {"name": self.name, "labels": labels, "annotations": dict(self.annotations)},
            "spec": {"unschedulable": self.unschedulable, "taints": [dict(t) for t in self.taints]},
            "status": {"capacity": {self.gpu_resource: str(self.gpus)}, "allocatable": {self.gpu_resource: str(self.gpus)}},
        }  # fmt: skip


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _now_precise() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _Clock:
    """RFC 3339 timestamps with nanoseconds, strictly increasing (as a kubelet's are in
    practice): PipesK8sClient joins log lines that share a timestamp into one item."""

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def stamp(self) -> tuple[int, str]:
        with self._lock:
            ns = max(time.time_ns(), self._last + 1)
            self._last = ns
        seconds, frac = divmod(ns, 1_000_000_000)
        return ns, datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


class _Pod:
    def __init__(self, manifest: dict[str, Any]):
        self.manifest = manifest
        self.process: subprocess.Popen | None = None
        self.lines: list[tuple[int, str, bytes]] = []  # (ns, timestamp, line with newline)
        self.log_closed = False
        self.eviction: tuple[str, str] | None = None  # (reason, message) once evicted
        self.deleting = False
        self.gone = False

    @property
    def name(self) -> str:
        return self.manifest["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.manifest["metadata"]["namespace"]

    @property
    def status(self) -> dict[str, Any]:
        return self.manifest["status"]

    @property
    def container(self) -> dict[str, Any]:
        return self.manifest["spec"]["containers"][0]


class FakeKubeAPI:
    """The fake API server and kubelet; use as a context manager (it stops every process it
    started and its server on exit)."""

    def __init__(self, nodes: list[FakeNode], *, python: str = sys.executable, workdir: Path = REPO_ROOT):
        self.nodes = nodes
        self.python = python
        self.workdir = workdir
        self._pods: dict[tuple[str, str], _Pod] = {}
        self._jobsets: dict[tuple[str, str], dict[str, Any]] = {}
        self._changed = threading.Condition()
        self._clock = _Clock()
        self._server: ThreadingHTTPServer | None = None
        self._stopping = False
        self.kubeconfig: Path | None = None
        self.exit_codes: dict[str, int] = {}  # pod name -> its container's exit code, kept after deletion
        self.created: dict[str, dict[str, str]] = {}  # pod name -> its labels, for every pod ever created

    # Life cycle -----------------------------------------------------------------------
    def __enter__(self) -> FakeKubeAPI:
        handler = type("Handler", (_Handler,), {"api": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="fake-kube-api", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping = True
        with self._changed:
            pods = list(self._pods.values())
            self._changed.notify_all()
        for pod in pods:
            if pod.process and pod.process.poll() is None:
                _kill_tree(pod.process)
                pod.process.wait(10)
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    @property
    def host(self) -> str:
        assert self._server, "the fake API is not started: use it as a context manager"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def write_kubeconfig(self, path: Path) -> Path:
        """Write a kubeconfig whose current context points at this server; also kept as `self.kubeconfig`."""
        self.kubeconfig = path
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.host}}],
                    "users": [{"name": "fake", "user": {"token": "fake-token"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                    "current-context": "fake",
                }
            )
        )
        return path

    # What tests look at and do ----------------------------------------------------------
    def pods(self, labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """Copies of the pods the API holds now (deleted pods are gone, as on a cluster)."""
        with self._changed:
            return [copy.deepcopy(p.manifest) for p in self._pods.values() if _labels_match(p.manifest, labels or {})]

    def wait_for(self, predicate: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                value = predicate()
                if value:
                    return value
                if time.monotonic() > deadline:
                    raise AssertionError(f"fake Kubernetes API: timed out after {timeout:g}s waiting for {what}")
                self._changed.wait(0.2)

    def wait_for_log(self, text: str, labels: dict[str, str] | None = None, timeout: float = 120.0) -> str:
        """The name of a running pod (matching `labels`) whose log contains `text`."""

        def found() -> str | None:
            for pod in self._pods.values():
                if pod.process and not pod.log_closed and _labels_match(pod.manifest, labels or {}):
                    if any(text.encode() in line for _, _, line in pod.lines):
                        return pod.name
            return None

        return self.wait_for(found, f"a running pod whose log contains {text!r}", timeout)

    def evict(self, name: str, namespace: str, *, message: str = "The node was reclaimed (spot interruption).", grace_seconds: float = DEFAULT_GRACE_SECONDS) -> None:
        """Evict a pod as a kubelet does: DisruptionTarget, SIGTERM, and the pod stays Failed/Evicted."""
        pod = self._pod(namespace, name)
        with self._changed:
            pod.eviction = ("Evicted", message)
            _set_condition(pod.status, "DisruptionTarget", "True", "TerminationByKubelet", message)
            self._changed.notify_all()
        self._terminate(pod, grace_seconds, remove=False)

    def preempt(self, name: str, namespace: str, *, grace_seconds: float = DEFAULT_GRACE_SECONDS) -> None:
        """Preempt a pod as the scheduler does: DisruptionTarget, then a graceful delete."""
        pod = self._pod(namespace, name)
        with self._changed:
            _set_condition(pod.status, "DisruptionTarget", "True", "PreemptionByScheduler", "preempted by a higher-priority pod")
            self._changed.notify_all()
        self._delete(pod, grace_seconds)

    def lose_node(self, name: str) -> list[str]:
        """The node crashes: every container on it dies at once with its processes (SIGKILL; the
        pods end Failed, exit 137). The node comes back empty; the names of the pods it ran."""
        with self._changed:
            pods = [p for p in self._pods.values() if p.manifest["spec"].get("nodeName") == name and p.process and p.process.poll() is None]
        for pod in pods:
            _kill_tree(pod.process)
        return [p.name for p in pods]

    def node(self, name: str) -> FakeNode:
        found = next((n for n in self.nodes if n.name == name), None)
        if found is None:
            raise _ApiError(404, "NotFound", f'nodes "{name}" not found')
        return found

    def jobsets(self) -> list[dict[str, Any]]:
        """Copies of the JobSets the API holds now."""
        with self._changed:
            return [self._jobset_view(js) for js in self._jobsets.values()]

    # API ------------------------------------------------------------------------------
    def _pod(self, namespace: str, name: str) -> _Pod:
        with self._changed:
            pod = self._pods.get((namespace, name))
        if pod is None:
            raise _ApiError(404, "NotFound", f'pods "{name}" not found')
        return pod

    def create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        meta = body.setdefault("metadata", {})
        name = meta.get("name")
        containers = (body.get("spec") or {}).get("containers") or []
        if not name:
            raise _ApiError(422, "Invalid", "Pod is invalid: metadata.name: Required value")
        if not containers or not all(c.get("name") and c.get("image") for c in containers):
            raise _ApiError(422, "Invalid", f'Pod "{name}" is invalid: spec.containers: every container needs a name and an image')
        if len(containers) > 1 or body["spec"].get("initContainers"):
            raise _ApiError(422, "Invalid", "the fake kubelet runs pods of exactly one container")
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now(), resourceVersion="1")
        body.setdefault("kind", "Pod")
        body.setdefault("apiVersion", "v1")
        body["status"] = {"phase": "Pending", "conditions": []}
        pod = _Pod(body)
        with self._changed:
            if (namespace, name) in self._pods:
                raise _ApiError(409, "AlreadyExists", f'pods "{name}" already exists')
            self._pods[(namespace, name)] = pod
            self.created[name] = dict(meta.get("labels") or {})
            created = copy.deepcopy(body)
        threading.Thread(target=self._kubelet, args=(pod,), name=f"kubelet-{name}", daemon=True).start()
        return created

    def read(self, namespace: str, name: str) -> dict[str, Any]:
        pod = self._pod(namespace, name)
        with self._changed:
            return copy.deepcopy(pod.manifest)

    def list(self, namespace: str, query: dict[str, list[str]]) -> dict[str, Any]:
        names = [s.split("=", 1)[1] for s in query.get("fieldSelector", [""])[0].split(",") if s.startswith("metadata.name=")]
        labels = dict(s.split("=", 1) for s in query.get("labelSelector", [""])[0].split(",") if "=" in s)
        with self._changed:
            items = [
                copy.deepcopy(p.manifest)
                for (ns, name), p in self._pods.items()
                if ns == namespace and (not names or name in names) and _labels_match(p.manifest, labels)
            ]
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}

    def delete(self, namespace: str, name: str, grace_seconds: float | None) -> dict[str, Any]:
        pod = self._pod(namespace, name)
        if grace_seconds is None:
            grace_seconds = float(pod.manifest["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS))
        self._delete(pod, grace_seconds)
        with self._changed:
            return copy.deepcopy(pod.manifest)

    def patch_node(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        node = self.node(name)
        with self._changed:
            if "unschedulable" in (body.get("spec") or {}):
                node.unschedulable = bool(body["spec"]["unschedulable"])
            node.annotations.update((body.get("metadata") or {}).get("annotations") or {})
            self._changed.notify_all()
            return node.manifest()

    def create_jobset(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = (body.get("metadata") or {}).get("name")
        jobs = (body.get("spec") or {}).get("replicatedJobs") or []
        if not name:
            raise _ApiError(422, "Invalid", "JobSet is invalid: metadata.name: Required value")
        if len(jobs) != 1:
            raise _ApiError(422, "Invalid", f'JobSet "{name}": the fake JobSet controller runs exactly one replicated job')
        job = jobs[0]["template"]["spec"]
        if job.get("completionMode") != "Indexed" or job.get("parallelism") != job.get("completions"):
            raise _ApiError(422, "Invalid", f'JobSet "{name}": the fake runs Indexed jobs whose parallelism equals their completions')
        if (body["spec"].get("failurePolicy") or {}).get("maxRestarts", 0) != 0:
            raise _ApiError(422, "Invalid", f'JobSet "{name}": the fake implements only failurePolicy.maxRestarts 0')
        body["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now(), resourceVersion="1")
        body["status"] = {"conditions": []}
        with self._changed:
            if (namespace, name) in self._jobsets:
                raise _ApiError(409, "AlreadyExists", f'jobsets.jobset.x-k8s.io "{name}" already exists')
            self._jobsets[(namespace, name)] = body
            created = copy.deepcopy(body)
        threading.Thread(target=self._admit, args=(namespace, name), name=f"jobset-{name}", daemon=True).start()
        return created

    def _jobset(self, namespace: str, name: str) -> dict[str, Any]:
        with self._changed:
            jobset = self._jobsets.get((namespace, name))
        if jobset is None:
            raise _ApiError(404, "NotFound", f'jobsets.jobset.x-k8s.io "{name}" not found')
        return jobset

    def read_jobset(self, namespace: str, name: str) -> dict[str, Any]:
        jobset = self._jobset(namespace, name)
        with self._changed:
            return self._jobset_view(jobset)

    def _jobset_view(self, jobset: dict[str, Any]) -> dict[str, Any]:
        """A copy with `status.replicatedJobsStatus` counted from its pods now."""
        view = copy.deepcopy(jobset)
        pods = [p.manifest for p in self._jobset_pods(jobset)]
        phases = [p["status"].get("phase") for p in pods]
        job = jobset["spec"]["replicatedJobs"][0]
        view["status"]["replicatedJobsStatus"] = [{
            "name": job["name"], "ready": phases.count("Running"), "succeeded": phases.count("Succeeded"),
            "failed": phases.count("Failed"), "active": phases.count("Pending") + phases.count("Running"), "suspended": 0 if pods else 1,
        }]  # fmt: skip
        return view

    def delete_jobset(self, namespace: str, name: str, grace_seconds: float | None) -> dict[str, Any]:
        jobset = self._jobset(namespace, name)
        with self._changed:
            self._jobsets.pop((namespace, name), None)
            pods = self._jobset_pods(jobset)
            self._changed.notify_all()
        for pod in pods:
            grace = grace_seconds if grace_seconds is not None else float(pod.manifest["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS))
            self._delete(pod, grace)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": {"name": name, "kind": "jobsets"}}

    def log_lines(self, namespace: str, name: str, query: dict[str, list[str]]) -> tuple[_Pod, int]:
        """The pod and the index of its first log line to send."""
        pod = self._pod(namespace, name)
        container = query.get("container", [None])[0]
        if container and container != pod.container["name"]:
            raise _ApiError(400, "BadRequest", f'container {container} is not valid for pod {name}')
        with self._changed:
            if pod.process is None and not pod.log_closed:
                waiting = (pod.status.get("containerStatuses") or [{}])[0].get("state", {}).get("waiting", {}).get("reason", "ContainerCreating")
                raise _ApiError(400, "BadRequest", f'container "{pod.container["name"]}" in pod "{name}" is waiting to start: {waiting}')
            start = 0
            if "sinceSeconds" in query:
                since_ns = time.time_ns() - int(query["sinceSeconds"][0]) * 1_000_000_000
                start = next((i for i, (ns, _, _) in enumerate(pod.lines) if ns >= since_ns), len(pod.lines))
            if "tailLines" in query:
                start = max(start, len(pod.lines) - int(query["tailLines"][0]))
            return pod, start

    # Scheduler and kubelet --------------------------------------------------------------
    def _schedule(self, pod: _Pod) -> tuple[FakeNode | None, str]:
        spec = pod.manifest["spec"]
        selector = spec.get("nodeSelector") or {}
        tolerations = spec.get("tolerations") or []
        limits = (pod.container.get("resources") or {}).get("limits") or {}
        problems: dict[str, int] = {}
        for node in self.nodes:
            if node.unschedulable:
                why = "node(s) were unschedulable"
            elif any(node.labels.get(k) != v for k, v in selector.items()):
                why = "node(s) didn't match Pod's node affinity/selector"
            elif untolerated := [t for t in node.taints if t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(tolerations, t)]:
                why = f"node(s) had untolerated taint {{{untolerated[0]['key']}: {untolerated[0].get('value', '')}}}"
            elif int(limits.get(node.gpu_resource, 0)) > node.gpus:
                why = f"Insufficient {node.gpu_resource}"
            else:
                return node, ""
            problems[why] = problems.get(why, 0) + 1
        detail = ", ".join(f"{n} {why}" for why, n in problems.items())
        return None, f"0/{len(self.nodes)} nodes are available: {detail}. preemption: not eligible."

    # JobSet controller and Kueue-style admission ------------------------------------------
    def _jobset_pods(self, jobset: dict[str, Any]) -> list[_Pod]:
        namespace, name = jobset["metadata"]["namespace"], jobset["metadata"]["name"]
        return [p for p in self._pods.values() if p.namespace == namespace and _labels_match(p.manifest, {JOBSET_LABEL: name})]

    def _free_gpus(self, node: FakeNode) -> int:
        taken = sum(
            int(((p.container.get("resources") or {}).get("limits") or {}).get(node.gpu_resource, 0))
            for p in self._pods.values()
            if p.manifest["spec"].get("nodeName") == node.name and not p.log_closed
        )
        return node.gpus - taken

    def _unfit(self, node: FakeNode, spec: dict[str, Any], limits: dict[str, Any]) -> str:
        """Why `node` cannot take a pod of `spec` now ("" if it can)."""
        labels = {"kubernetes.io/hostname": node.name, **node.labels}
        if node.unschedulable:
            return "node(s) were unschedulable"
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()) or not _node_affinity_allows(spec, node.name, labels):
            return "node(s) didn't match Pod's node affinity/selector"
        if untolerated := [t for t in node.taints if t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(spec.get("tolerations") or [], t)]:
            return f"node(s) had untolerated taint {{{untolerated[0]['key']}: {untolerated[0].get('value', '')}}}"
        if int(limits.get(node.gpu_resource, 0)) > self._free_gpus(node):
            return f"Insufficient {node.gpu_resource}"
        return ""

    def _place(self, jobset: dict[str, Any]) -> tuple[list[FakeNode], str]:
        """A node for each pod of the JobSet, or none and why (all or nothing)."""
        job = jobset["spec"]["replicatedJobs"][0]
        needed = job.get("replicas", 1) * job["template"]["spec"]["parallelism"]
        spec = job["template"]["spec"]["template"]["spec"]
        limits = (spec["containers"][0].get("resources") or {}).get("limits") or {}
        fitting, problems = [], {}
        for node in self.nodes:
            if why := self._unfit(node, spec, limits):
                problems[why] = problems.get(why, 0) + 1
            else:
                fitting.append(node)
        one_per_node = any(t.get("topologyKey") == "kubernetes.io/hostname" for t in (spec.get("affinity") or {}).get("podAntiAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", []))
        if len(fitting) >= needed or (fitting and not one_per_node):
            return [fitting[i % len(fitting)] for i in range(needed)], ""
        detail = ", ".join(f"{n} {why}" for why, n in problems.items())
        return [], (
            f"all or nothing: {len(fitting)} of {len(self.nodes)} nodes can take a pod of it and it needs {needed} at once "
            f"(one per node){': ' + detail if detail else ''}; no pod created"
        )

    def _admit(self, namespace: str, name: str) -> None:
        """Keep the JobSet suspended until all its pods fit at once, then create them bound to their nodes."""
        with self._changed:
            while not self._stopping:
                jobset = self._jobsets.get((namespace, name))
                if jobset is None:
                    return
                nodes, why = self._place(jobset)
                if nodes:
                    _set_condition(jobset["status"], "Suspended", "False", "ResumeJobs", "jobset is resumed")
                    for index, node in enumerate(nodes):
                        self.create(namespace, self._jobset_pod(jobset, index, node))
                    self._changed.notify_all()
                    return
                if (jobset["status"].get("conditions") or [{}])[-1].get("message") != why:
                    _set_condition(jobset["status"], "Suspended", "True", "WaitingForAdmission", why)
                    self._changed.notify_all()
                self._changed.wait(0.5)

    @staticmethod
    def _jobset_pod(jobset: dict[str, Any], index: int, node: FakeNode) -> dict[str, Any]:
        """Pod `index` of the JobSet's one job, as JobSet and the Job controller make it."""
        name, job = jobset["metadata"]["name"], jobset["spec"]["replicatedJobs"][0]
        template = copy.deepcopy(job["template"]["spec"]["template"])
        host = f"{name}-{job['name']}-0-{index}"
        suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        labels = {
            **(template.get("metadata") or {}).get("labels", {}), JOBSET_LABEL: name, "jobset.sigs.k8s.io/replicatedjob-name": job["name"],
            "jobset.sigs.k8s.io/job-index": "0", "job-name": f"{name}-{job['name']}-0", "batch.kubernetes.io/job-name": f"{name}-{job['name']}-0",
            INDEX_LABEL: str(index),
        }  # fmt: skip
        annotations = {**(template.get("metadata") or {}).get("annotations", {}), INDEX_LABEL: str(index)}
        spec = template["spec"]
        spec.update(hostname=host, subdomain=name, nodeName=node.name)
        for container in spec["containers"]:
            container["env"] = [*container.get("env", []), {"name": "JOB_COMPLETION_INDEX", "value": str(index)}]
        return {"metadata": {"name": f"{host}-{suffix}", "labels": labels, "annotations": annotations}, "spec": spec}

    def _jobset_pod_ended(self, pod: _Pod, exit_code: int) -> list[_Pod]:
        """The JobSet controller's answer to a pod that ended: complete or fail the JobSet; the
        pods to delete (a failed JobSet's others). Called with the lock held."""
        name = (pod.manifest["metadata"].get("labels") or {}).get(JOBSET_LABEL)
        jobset = self._jobsets.get((pod.namespace, name or ""))
        if jobset is None or jobset["status"].get("terminalState"):
            return []
        pods = self._jobset_pods(jobset)
        if exit_code != 0:
            jobset["status"]["terminalState"] = "Failed"
            message = f"jobset failed: pod {pod.name} exited {exit_code} and failurePolicy.maxRestarts (0) is reached"
            _set_condition(jobset["status"], "Failed", "True", "ReachedMaxRestarts", message)
            self._changed.notify_all()
            return [p for p in pods if p is not pod and not p.log_closed]
        needed = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"]
        if sum(p.status.get("phase") == "Succeeded" for p in pods) >= needed:
            jobset["status"]["terminalState"] = "Completed"
            _set_condition(jobset["status"], "Completed", "True", "AllJobsCompleted", "jobset completed successfully")
            self._changed.notify_all()
        return []

    def _kubelet(self, pod: _Pod) -> None:
        bound = pod.manifest["spec"].get("nodeName")
        node, unschedulable = (self.node(bound), "") if bound else self._schedule(pod)
        with self._changed:
            if pod.gone:
                return
            if node is None:
                _set_condition(pod.status, "PodScheduled", "False", "Unschedulable", unschedulable)
                self._changed.notify_all()
                return  # stays Pending until deleted, as with no autoscaler
            pod.manifest["spec"]["nodeName"] = node.name
            _set_condition(pod.status, "PodScheduled", "True")
            pod.status["containerStatuses"] = [self._container_status(pod, {"waiting": {"reason": "ContainerCreating"}}, ready=False)]
            self._changed.notify_all()
        container = pod.container
        own = {e["name"]: _env_value(e, pod.manifest) for e in container.get("env") or [] if _env_value(e, pod.manifest) is not None}
        own = {k: self._resolve_hosts(pod.namespace, v) for k, v in own.items()}
        command = [self._resolve_hosts(pod.namespace, _expand(a, own)) for a in list(container.get("command") or []) + list(container.get("args") or [])]
        if command and command[0] in ("python", "python3"):
            command[0] = self.python
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "HOSTNAME": pod.manifest["spec"].get("hostname") or pod.name,
            **own,
        }
        with self._changed:
            if pod.gone or pod.deleting:
                return
            try:
                pod.process = subprocess.Popen(
                    command, cwd=self.workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
                )
            except OSError as exc:
                pod.status["containerStatuses"] = [self._container_status(pod, {"waiting": {"reason": "RunContainerError", "message": str(exc)}}, ready=False)]
                self._changed.notify_all()
                return
            started = _now()
            pod.status.update(phase="Running", podIP="127.0.0.1", hostIP="127.0.0.1", startTime=started)
            _set_condition(pod.status, "Ready", "True")
            pod.status["containerStatuses"] = [self._container_status(pod, {"running": {"startedAt": started}}, ready=True)]
            self._changed.notify_all()
        assert pod.process.stdout is not None
        for line in iter(pod.process.stdout.readline, b""):
            ns, stamp = self._clock.stamp()
            with self._changed:
                pod.lines.append((ns, stamp, line if line.endswith(b"\n") else line + b"\n"))
                self._changed.notify_all()
        code = pod.process.wait()
        exit_code = code if code >= 0 else 128 - code  # a signal, as a container runtime reports it
        with self._changed:
            pod.log_closed = True
            self.exit_codes[pod.name] = exit_code
            reason = "Completed" if exit_code == 0 else "Error"
            terminated = {"exitCode": exit_code, "reason": reason, "startedAt": started, "finishedAt": _now_precise()}
            pod.status["containerStatuses"] = [self._container_status(pod, {"terminated": terminated}, ready=False)]
            pod.status["phase"] = "Succeeded" if exit_code == 0 and not pod.eviction else "Failed"
            if pod.eviction:
                pod.status["reason"], pod.status["message"] = pod.eviction
            _set_condition(pod.status, "Ready", "False", "PodCompleted")
            if pod.deleting:
                self._remove(pod)
            peers = self._jobset_pod_ended(pod, exit_code)
            self._changed.notify_all()
        for peer in peers:  # as JobSet deletes a failed JobSet's active jobs, and with them their pods
            self._delete(peer, float(peer.manifest["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)))

    def _resolve_hosts(self, namespace: str, text: str) -> str:
        """Stands in for cluster DNS: a JobSet pod's name in its headless service is this machine."""
        for (ns, name) in list(self._jobsets):
            if ns == namespace and name in text:
                text = re.sub(rf"\b{re.escape(name)}-[a-z0-9-]+-\d+-\d+\.{re.escape(name)}(\.{re.escape(ns)}(\.svc(\.cluster\.local)?)?)?\b", "127.0.0.1", text)
        return text

    @staticmethod
    def _container_status(pod: _Pod, state: dict[str, Any], *, ready: bool) -> dict[str, Any]:
        return {
            "name": pod.container["name"],
            "image": pod.container["image"],
            "imageID": f"fake://{pod.container['image']}",
            "ready": ready,
            "started": "running" in state,
            "restartCount": 0,
            "state": state,
        }

    def _terminate(self, pod: _Pod, grace_seconds: float, *, remove: bool) -> None:
        with self._changed:
            process = pod.process
            running = process is not None and process.poll() is None
            if remove:
                pod.deleting = True
                pod.manifest["metadata"]["deletionTimestamp"] = _now()
                pod.manifest["metadata"]["deletionGracePeriodSeconds"] = int(grace_seconds)
                if not running:
                    self._remove(pod)  # never started, or already ended: gone at once
            self._changed.notify_all()
        if running:
            _signal_group(process, signal.SIGTERM)
            threading.Thread(target=self._kill_after, args=(process, grace_seconds), daemon=True).start()

    def _delete(self, pod: _Pod, grace_seconds: float) -> None:
        self._terminate(pod, grace_seconds, remove=True)

    @staticmethod
    def _kill_after(process: subprocess.Popen, grace_seconds: float) -> None:
        try:
            process.wait(grace_seconds)
        except subprocess.TimeoutExpired:
            _kill_tree(process)

    def _remove(self, pod: _Pod) -> None:
        pod.gone = True
        self._pods.pop((pod.namespace, pod.name), None)


# HTTP --------------------------------------------------------------------------------------
class _ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


_POD = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)$")
_POD_LOG = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/log$")
_PODS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods$")
_EVENTS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/events$")
_NODE = re.compile(r"^/api/v1/nodes/(?P<name>[^/]+)$")
_JOBSETS = re.compile(r"^/apis/jobset\.x-k8s\.io/v1alpha2/namespaces/(?P<ns>[^/]+)/jobsets$")
_JOBSET = re.compile(r"^/apis/jobset\.x-k8s\.io/v1alpha2/namespaces/(?P<ns>[^/]+)/jobsets/(?P<name>[^/]+)$")
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    api: FakeKubeAPI

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # quiet: the tests read outcomes, not access logs

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}") if length else {}

    def _send(self, code: int, payload: dict[str, Any] | bytes, content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method: str) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        try:
            if method == "POST" and (m := _PODS.match(url.path)):
                self._send(201, self.api.create(m["ns"], self._body()))
            elif method == "GET" and (m := _PODS.match(url.path)):
                self._send(200, self.api.list(m["ns"], query))
            elif method == "GET" and (m := _POD.match(url.path)):
                self._send(200, self.api.read(m["ns"], m["name"]))
            elif method == "DELETE" and (m := _POD.match(url.path)):
                body = self._body()
                grace = query.get("gracePeriodSeconds", [body.get("gracePeriodSeconds")])[0]
                self._send(200, self.api.delete(m["ns"], m["name"], None if grace is None else float(grace)))
            elif method == "GET" and (m := _POD_LOG.match(url.path)):
                self._log(m["ns"], m["name"], query)
            elif method == "POST" and (m := _JOBSETS.match(url.path)):
                self._send(201, self.api.create_jobset(m["ns"], self._body()))
            elif method == "GET" and (m := _JOBSET.match(url.path)):
                self._send(200, self.api.read_jobset(m["ns"], m["name"]))
            elif method == "DELETE" and (m := _JOBSET.match(url.path)):
                body = self._body()
                grace = query.get("gracePeriodSeconds", [body.get("gracePeriodSeconds")])[0]
                self._send(200, self.api.delete_jobset(m["ns"], m["name"], None if grace is None else float(grace)))
            elif method == "GET" and (m := _NODE.match(url.path)):
                self._send(200, self.api.node(m["name"]).manifest())
            elif method == "PATCH" and (m := _NODE.match(url.path)):
                self._send(200, self.api.patch_node(m["name"], self._body()))
            elif method == "GET" and _EVENTS.match(url.path):
                self._send(200, {"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": []})
            else:
                raise _ApiError(404, "NotFound", f"the fake Kubernetes API does not implement {method} {url.path}")
        except _ApiError as exc:
            self._send(exc.code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": exc.message, "reason": exc.reason, "code": exc.code})

    def _log(self, namespace: str, name: str, query: dict[str, list[str]]) -> None:
        pod, index = self.api.log_lines(namespace, name, query)
        timestamps = query.get("timestamps", ["false"])[0].lower() == "true"  # the Python client sends `True`
        follow = query.get("follow", ["false"])[0].lower() == "true"

        def render(lines: list[tuple[int, str, bytes]]) -> bytes:
            return b"".join((stamp.encode() + b" " + line) if timestamps else line for _, stamp, line in lines)

        changed = self.api._changed
        if not follow:
            with changed:
                lines = pod.lines[index:]
            self._send(200, render(lines), "text/plain")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            while True:
                with changed:
                    while index >= len(pod.lines) and not pod.log_closed and not self.api._stopping:
                        changed.wait(0.5)
                    lines, index = pod.lines[index:], len(pod.lines)
                    ended = (pod.log_closed or self.api._stopping) and index == len(pod.lines)
                if lines:
                    data = render(lines)
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                if ended:
                    break
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802 - http.server's names
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._route("DELETE")

    def do_PATCH(self) -> None:  # noqa: N802
        self._route("PATCH")


# Helpers -----------------------------------------------------------------------------------
def _labels_match(manifest: dict[str, Any], labels: dict[str, str]) -> bool:
    have = manifest["metadata"].get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


def _tolerates(tolerations: list[dict[str, Any]], taint: dict[str, str]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t["key"] == taint["key"]):
            return True
        if t.get("operator", "Equal") == "Equal" and t.get("key") == taint["key"] and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def _set_condition(status: dict[str, Any], kind: str, value: str, reason: str | None = None, message: str | None = None) -> None:
    conditions = [c for c in status.setdefault("conditions", []) if c["type"] != kind]
    condition = {"type": kind, "status": value, "lastTransitionTime": _now()}
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    status["conditions"] = [*conditions, condition]


def _env_value(entry: dict[str, Any], pod: dict[str, Any]) -> str | None:
    """An env entry's value, with the downward API's `fieldRef` resolved (None: not resolvable here)."""
    if "valueFrom" not in entry:
        return str(entry.get("value", ""))
    path = (entry["valueFrom"].get("fieldRef") or {}).get("fieldPath")
    values = {"spec.nodeName": pod["spec"].get("nodeName"), "metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"].get("namespace")}
    return values.get(path or "")


def _expand(text: str, env: dict[str, str]) -> str:
    """`$(VAR)` from the container's env, as a kubelet expands a command (`$$` escapes; unknown stays)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def _node_affinity_allows(spec: dict[str, Any], name: str, labels: dict[str, str]) -> bool:
    """`requiredDuringScheduling` node affinity: any term whose expressions and fields all hold."""
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []

    def holds(requirement: dict[str, Any], value: str | None) -> bool:
        op, values = requirement["operator"], requirement.get("values") or []
        return {"In": value in values, "NotIn": value not in values, "Exists": value is not None, "DoesNotExist": value is None}[op]

    return not terms or any(
        all(holds(r, labels.get(r["key"])) for r in t.get("matchExpressions") or [])
        and all(holds(r, name if r["key"] == "metadata.name" else None) for r in t.get("matchFields") or [])
        for t in terms
    )


def _kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL a container's process and everything under it (ranks in sessions of their own too)."""
    try:
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    _signal_group(process, signal.SIGKILL)
    for child in tree:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass
