"""The Kubernetes backend: the pods it asks for, and how attempts end, through PipesK8sClient.

The pod specs are checked against the official `kubernetes` client models. The attempts run
for real through dagster-k8s's PipesK8sClient and the `kubernetes` client, against the fake
API server of tests/engines/fake_kube_api.py, whose "kubelet" runs each pod's command as a
local process (no real API server, scheduler, kubelet, images or GPUs run here).
"""

from __future__ import annotations

import hashlib
import json
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pytest
import torch
import yaml
from dagster_k8s.pipes import build_pod_body
from kubernetes.client import ApiClient

from control_plane.accounting.ledger import read_ledger
from control_plane.catalog.pools import load_pools
from control_plane.compute.backends.base import (
    AttemptOutcome,
    JobHandle,
    JobState,
    outcome_of,
)
from control_plane.compute.backends.kubernetes import KubernetesBackend
from control_plane.compute.backends.kubernetes_pod import (
    core_api,
    job_status,
    label_value,
    pod_spec_for,
)
from control_plane.compute.health import Drains, Qualifications
from control_plane.compute.inflight import InFlight
from control_plane.settings import REPO_ROOT
from testbed.counting_step import counting_spec, materialize_counting, result_metadata
from tests.engines.fake_kube_api import FakeKubeAPI, FakeNode
from workload_runtime.checkpoints import CheckpointStore
from workload_runtime.inputs import Failpoint
from workload_runtime.storage import Storage

# Pods run the workloads for real (as local processes): tier `e2e`. A wait the backend fails
# to end fails the test, not the suite.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

DEPLOY_POOLS = REPO_ROOT / "deploy" / "pools"
SPOT_TAINT = {"key": "sinewgrid.test/spot", "value": "true", "effect": "NoSchedule"}
NODES = [
    FakeNode("spot-node-1", labels={"sinewgrid.test/capacity": "spot"}, taints=[SPOT_TAINT], gpus=4),
    FakeNode("on-demand-node-1", labels={"sinewgrid.test/capacity": "on-demand"}, gpus=4),
]
IMAGE = "registry.example.com/sinewgrid/workload:test"


def _pool(name: str, price: float, purchasing: str, node_selector: dict[str, str], kubeconfig: Path, **fields: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {"namespace": "sinewgrid", "node_selector": node_selector, "kubeconfig": str(kubeconfig), "poll_seconds": 0.2}
    if purchasing == "spot":
        settings["tolerations"] = [{"key": SPOT_TAINT["key"], "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    return {
        name: {
            "provider": "test",
            "region": "local",
            "backend": "kubernetes",
            "backend_settings": settings,
            "purchasing": purchasing,
            "accelerator": "l4",
            "gpus_per_node": 4,
            "price_per_gpu_hour": price,
            "runtimes": {"default": IMAGE},
            # The fake API server's stand-in kubelet runs pods as local processes, with no GPU for
            # the qualification probe to find: these pools land steps unqualified.
            "qualify": False,
            **fields,
        }
    }


@pytest.fixture
def kube(tmp_path: Path):
    with FakeKubeAPI(NODES) as api:
        api.write_kubeconfig(tmp_path / "kubeconfig")
        yield api
    # Every pod an attempt created is deleted once the attempt has been read.
    assert api.pods() == [], f"pods left behind: {[p['metadata']['name'] for p in api.pods()]}"


def _catalog(tmp_path: Path, *pools: dict[str, Any]) -> Path:
    path = tmp_path / "pools.yaml"
    path.write_text(yaml.safe_dump({"pools": {k: v for p in pools for k, v in p.items()}}))
    return path


def _spot(kube) -> dict[str, Any]:
    return _pool("k8s-spot", 0.3, "spot", {"sinewgrid.test/capacity": "spot"}, kube.kubeconfig, interruption_rate_per_hour=0.1)


def _on_demand(kube) -> dict[str, Any]:
    return _pool("k8s-on-demand", 1.0, "on_demand", {"sinewgrid.test/capacity": "on-demand"}, kube.kubeconfig)


def expected_digest(steps: int, seed: int) -> str:
    """The counting workload's result, computed here without any backend."""
    value = torch.tensor([float(seed)], dtype=torch.float64)
    for step in range(steps):
        value = (value * 31 + step) % 1_000_003
    return hashlib.sha256(value.numpy().tobytes()).hexdigest()[:16]


def _ledger(home: Path) -> list[dict[str, Any]]:
    return read_ledger(Storage.at(str(home)).ledger()).to_dict("records")


# The pods it asks for ------------------------------------------------------------------------
def _validated_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod PipesK8sClient would create from `pod`, after a round trip through the official
    models: any field the models do not know fails here, in build_pod_body or the comparison."""
    body = build_pod_body(
        pod_name="dagster-run-counting-0123456789",
        image=None,
        command=None,
        env_vars={"DAGSTER_PIPES_CONTEXT": "e30=", "DAGSTER_PIPES_MESSAGES": "e30="},
        base_pod_meta=pod["metadata"],
        base_pod_spec=pod["spec"],
    )
    api = ApiClient()
    serialized = api.sanitize_for_serialization(body)
    reparsed = api._ApiClient__deserialize(json.loads(json.dumps(serialized)), "V1Pod")  # type: ignore[attr-defined]
    assert api.sanitize_for_serialization(reparsed) == serialized
    for key, value in pod["spec"].items():  # nothing we wrote was dropped on the way
        assert serialized["spec"][key] == value or key == "containers"
    return serialized


@pytest.mark.parametrize("catalog", ["aws.yaml", "gcp.yaml"])
def test_pod_specs_for_deploy_pools_validate_against_the_kubernetes_models(catalog: str) -> None:
    # NVIDIA pools (the TPU, Trainium and AMD pools' pods: tests/test_accelerator_specs.py)
    pools = [p for p in load_pools(DEPLOY_POOLS / catalog).values() if p.backend == "kubernetes" and p.family == "nvidia"]
    assert pools, f"{catalog} has no kubernetes pools"
    for pool in pools:
        for runtime in ("default", "isaaclab"):
            spec = counting_spec(runtime=runtime, gpus=pool.gpus_per_node)
            pod = _validated_pod(pod_spec_for(pool, spec, storage_root="s3://sinewgrid-prod", run_id="0f1e2d3c-run", attempt=2))
            settings = pool.backend_settings
            container = pod["spec"]["containers"][0]
            assert pod["spec"]["nodeSelector"] == settings["node_selector"]
            assert pod["spec"].get("tolerations", []) == settings.get("tolerations", [])
            assert pod["spec"]["restartPolicy"] == "Never"
            assert container["image"] == pool.runtimes[runtime]
            assert container["command"] == ["python", "-m", spec.entry_point]
            assert container["resources"]["limits"] == {"nvidia.com/gpu": str(pool.gpus_per_node)}
            env = {e["name"]: e["value"] for e in container["env"]}
            assert env["SINEWGRID_HOME"] == "s3://sinewgrid-prod" and env["SINEWGRID_POOL"] == pool.name
            assert "DAGSTER_PIPES_CONTEXT" in env
            labels = pod["metadata"]["labels"]
            assert labels["sinewgrid.io/run-id"] == "0f1e2d3c-run"
            assert labels["sinewgrid.io/step"] == "test.counting" and labels["sinewgrid.io/attempt"] == "2"
    spot = [p for p in pools if p.purchasing.value == "spot"]
    assert spot and all(_validated_pod(pod_spec_for(p, counting_spec(), storage_root="s3://x", run_id="r", attempt=1))["spec"]["tolerations"] for p in spot)


def test_a_pool_without_an_image_for_the_runtime_is_a_clear_failure(tmp_path: Path) -> None:
    pool = load_pools(_catalog(tmp_path, _pool("k8s-bare", 1.0, "on_demand", {}, tmp_path / "kubeconfig", runtimes={})))["k8s-bare"]
    with pytest.raises(dg.Failure, match=r"pool k8s-bare .*`isaaclab` runtime.*Set `runtimes.isaaclab`"):
        pod_spec_for(pool, counting_spec(runtime="isaaclab"), storage_root="s3://x", run_id="r", attempt=1)


@pytest.mark.parametrize(
    ("status", "state", "exit_code"),
    [
        ({"phase": "Succeeded", "containerStatuses": [{"terminated": {"exitCode": 0}}]}, JobState.succeeded, 0),
        ({"phase": "Failed", "containerStatuses": [{"terminated": {"exitCode": 75}}]}, JobState.failed, 75),  # exit 75: preempted
        ({"phase": "Failed", "reason": "Evicted", "message": "node low on memory", "containerStatuses": [{"terminated": {"exitCode": 137}}]}, JobState.preempted, 137),
        ({"phase": "Failed", "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}], "containerStatuses": [{"terminated": {"exitCode": 143}}]}, JobState.preempted, 143),
        ({"phase": "Failed", "containerStatuses": [{"terminated": {"exitCode": 137, "reason": "OOMKilled"}}]}, JobState.failed, 137),
        ({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available"}]}, JobState.pending, None),
    ],
)
def test_pod_status_maps_to_how_the_attempt_ended(status: dict[str, Any], state: JobState, exit_code: int | None) -> None:
    for container in status.get("containerStatuses", []):
        container.update(name="workload", image=IMAGE, imageID="", ready=False, restartCount=0, state={"terminated": container.pop("terminated")})
    pod = ApiClient()._ApiClient__deserialize({"metadata": {"name": "p"}, "status": status}, "V1Pod")  # type: ignore[attr-defined]
    got = job_status(pod)
    assert (got.state, got.exit_code) == (state, exit_code)
    if state is JobState.pending:
        assert "Unschedulable" in got.reason
    expected = {JobState.succeeded: AttemptOutcome.succeeded, JobState.pending: None}.get(state)
    if exit_code == 75 or state is JobState.preempted:
        expected = AttemptOutcome.preempted
    elif state is JobState.failed:
        expected = AttemptOutcome.failed
    if expected:
        assert outcome_of(got) is expected
    assert job_status(None).state is JobState.gone and outcome_of(job_status(None)) is AttemptOutcome.preempted


# Attempts through PipesK8sClient against the fake API ---------------------------------------------
def test_counting_workload_runs_in_a_pod_and_reports_through_the_pod_log(home: Path, tmp_path: Path, kube) -> None:
    spec = counting_spec(config={"steps": 20})
    result = materialize_counting(home, _catalog(tmp_path, _spot(kube), _on_demand(kube)), spec)
    md = result_metadata(result)
    assert md["digest"] == expected_digest(20, 7)
    assert (md["pool"], md["backend"], md["attempts"], md["preemptions"]) == ("k8s-spot", "kubernetes", 1, 0)
    assert md["hostname_pool"] == "k8s-spot"  # the pool reached the pod, in the workload inputs
    (attempt,) = _ledger(home)
    assert (attempt["outcome"], attempt["exit_code"]) == ("succeeded", 0)
    assert attempt["productive_seconds"] > 0  # checkpoint messages came back through the pod log
    assert InFlight(Storage.at(str(home))).records() == []


@pytest.mark.parametrize("how", ["kubelet eviction", "scheduler preemption"])
def test_a_pod_taken_away_mid_run_resumes_from_its_checkpoint(home: Path, tmp_path: Path, kube, how: str) -> None:
    # The workload waits after step 7 (its `hold` failpoint) until it is taken away: the fault
    # lands mid-run, at the same step, however fast the machine is.
    held = tmp_path / "held.json"
    spec = counting_spec(config={"steps": 40, "step_seconds": 0.02}, failpoint=Failpoint(kind="hold", at_step=7, marker=str(held)))
    backend = KubernetesBackend()
    seen: dict[str, Any] = {}

    def take_the_pod_away() -> None:
        try:
            name = kube.wait_for_log('"event": "checkpoint"', labels={"sinewgrid.io/attempt": "1"})
            kube.wait_for(held.exists, "the workload to be held at step 7")
            (record,) = InFlight(Storage.at(str(home))).records()  # the watcher's view of it
            handle = JobHandle.from_json(record["handle"])
            seen.update(pod=name, handle=handle.job_id, status=backend.status(handle).state, owner=record["owner"])
            (kube.evict if how == "kubelet eviction" else kube.preempt)(name, "sinewgrid", grace_seconds=20)
        except BaseException as exc:  # reported by the main thread
            seen["error"] = exc

    helper = threading.Thread(target=take_the_pod_away, daemon=True)
    helper.start()
    result = materialize_counting(home, _catalog(tmp_path, _spot(kube), _on_demand(kube)), spec)
    helper.join(10)
    assert "error" not in seen, seen.get("error")
    assert (seen["handle"], seen["status"], seen["owner"]["attempt"]) == (seen["pod"], JobState.running, 1)

    md = result_metadata(result)
    assert md["digest"] == expected_digest(40, 7)  # the same result as uninterrupted
    assert md["resumed_from"] == 7  # the checkpoint written on SIGTERM, at the step it was held at
    assert (md["preemptions"], md["pools_tried"]) == (1, "k8s-spot, k8s-on-demand")
    ledger = _ledger(home)
    assert [(a["pool"], a["outcome"]) for a in ledger] == [("k8s-spot", "preempted"), ("k8s-on-demand", "succeeded")]
    if how == "kubelet eviction":
        assert ledger[0]["exit_code"] == 75  # the workload saved its checkpoint on SIGTERM
    else:
        assert pd.isna(ledger[0]["exit_code"])  # a deleted pod leaves no exit code: gone means preempted
    assert ledger[0]["productive_seconds"] > 0
    assert InFlight(Storage.at(str(home))).records() == []


def test_an_unschedulable_pool_is_refused_and_the_step_lands_on_the_next(home: Path, tmp_path: Path, kube, instance) -> None:
    nowhere = _pool("k8s-nowhere", 0.1, "on_demand", {"sinewgrid.test/capacity": "a100-reserved"}, kube.kubeconfig, pending_deadline_seconds=2)
    result = materialize_counting(home, _catalog(tmp_path, nowhere, _on_demand(kube)), counting_spec(config={"steps": 10}), instance=instance)
    md = result_metadata(result)
    assert (md["pools_tried"], md["pool"], md["digest"]) == ("k8s-nowhere, k8s-on-demand", "k8s-on-demand", expected_digest(10, 7))
    assert [(a["pool"], a["outcome"]) for a in _ledger(home)] == [("k8s-nowhere", "refused"), ("k8s-on-demand", "succeeded")]
    warnings = [e.user_message for e in instance.all_logs(result.run_id) if "refused" in (e.user_message or "")]
    assert any("Unschedulable" in w and "didn't match Pod's node affinity/selector" in w and "pending_deadline_seconds" in w for w in warnings), warnings


def test_an_unreachable_cluster_is_refused_and_the_step_lands_on_the_next(home: Path, tmp_path: Path, kube) -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    unreachable = tmp_path / "unreachable-kubeconfig"
    unreachable.write_text(kube.kubeconfig.read_text().replace(kube.host, f"http://127.0.0.1:{closed_port}"))
    dark = _pool("k8s-dark", 0.1, "on_demand", {}, unreachable)
    result = materialize_counting(home, _catalog(tmp_path, dark, _on_demand(kube)), counting_spec(config={"steps": 5}))
    assert result_metadata(result)["pools_tried"] == "k8s-dark, k8s-on-demand"
    assert [(a["pool"], a["outcome"]) for a in _ledger(home)] == [("k8s-dark", "refused"), ("k8s-on-demand", "succeeded")]


def test_a_user_code_failure_fails_the_step_without_a_retry(home: Path, tmp_path: Path, kube) -> None:
    spec = counting_spec(config={"steps": 20, "fail_at_step": 3})
    with pytest.raises(dg.Failure) as failure:
        materialize_counting(home, _catalog(tmp_path, _spot(kube), _on_demand(kube)), spec)
    assert "told to fail at step 3" in failure.value.description and "k8s-spot" in failure.value.description
    assert [(a["pool"], a["outcome"], a["exit_code"]) for a in _ledger(home)] == [("k8s-spot", "failed", 1)]


# The run worker of a cancelled run: `dagster run cancel` interrupts it (SIGINT, in-process).
# It runs as its own process, so the test interrupts that process, never the test runner.
RUN_WORKER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import dagster as dg
    from testbed.counting_step import counting_spec, materialize_counting
    home, pools, spec = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
    try:
        materialize_counting(home, pools, counting_spec(**spec))
    except (dg.DagsterExecutionInterruptedError, KeyboardInterrupt) as exc:
        print(f"run interrupted: {type(exc).__name__}", flush=True)
        sys.exit(3)
    print("run finished", flush=True)
    """
)


def test_a_cancelled_run_deletes_its_pod_and_the_workload_checkpoints(home: Path, tmp_path: Path, kube) -> None:
    held = tmp_path / "held.json"  # the workload waits after step 5 until it is stopped
    spec = {
        "config": {"steps": 400, "step_seconds": 0.05},
        "checkpoint_every_steps": 1000,
        "failpoint": Failpoint(kind="hold", at_step=5, marker=str(held)).model_dump(),
    }
    log = tmp_path / "run-worker.log"
    with log.open("ab") as out:
        worker = subprocess.Popen(
            [sys.executable, "-c", RUN_WORKER, str(home), str(_catalog(tmp_path, _on_demand(kube))), json.dumps(spec)],
            cwd=REPO_ROOT, stdout=out, stderr=out,
        )
    try:
        kube.wait_for(lambda: held.exists() or worker.poll() is not None, "the workload to run in its pod, held at step 5")
        assert worker.poll() is None, log.read_text()[-3000:]
        (pod,) = [p["metadata"]["name"] for p in kube.pods()]
        worker.send_signal(signal.SIGINT)  # what `dagster run cancel` amounts to in the run worker
        assert worker.wait(timeout=60) == 3, log.read_text()[-3000:]
    finally:
        worker.kill()
    assert "run interrupted" in log.read_text()
    kube.wait_for(lambda: not kube.pods(), "the cancelled run's pod to be deleted")
    assert InFlight(Storage.at(str(home))).records() == []
    kube.wait_for(lambda: pod in kube.exit_codes, "the cancelled pod's container to exit")
    assert kube.exit_codes[pod] == 75  # it got SIGTERM and saved a checkpoint first
    assert CheckpointStore(Storage.at(str(home)).checkpoints("counting")).latest_valid().step == 5


def test_a_qualifying_kubernetes_pool_runs_its_probe_as_a_pod_and_the_verdict_decides(home: Path, tmp_path: Path, kube) -> None:
    """Qualification on: before the step lands, a probe pod runs on the pool (runtime, storage,
    the pool's health check; CPU pools, so no GPU check, whatever the machine). The spot pool's
    health check fails: it is drained with the probe's words and the step moves on; the
    on-demand pool's passes: the pass is remembered and the step runs there."""
    qualifying = {"qualify": True, "accelerator": "cpu"}
    sick = _pool("k8s-spot", 0.3, "spot", {"sinewgrid.test/capacity": "spot"}, kube.kubeconfig, health_check=["false"], **qualifying)
    fine = _pool("k8s-on-demand", 1.0, "on_demand", {"sinewgrid.test/capacity": "on-demand"}, kube.kubeconfig, health_check=["true"], **qualifying)
    catalog = _catalog(tmp_path, sick, fine)
    result = materialize_counting(home, catalog, counting_spec(config={"steps": 10}))

    md = result_metadata(result)
    assert (md["pool"], md["digest"]) == ("k8s-on-demand", expected_digest(10, 7))
    probes = {labels["sinewgrid.io/pool"]: name for name, labels in kube.created.items() if labels["sinewgrid.io/step"] == label_value("test.counting.qualify")}
    assert sorted(probes) == ["k8s-on-demand", "k8s-spot"], kube.created
    assert (kube.exit_codes[probes["k8s-spot"]], kube.exit_codes[probes["k8s-on-demand"]]) == (1, 0)
    storage = Storage.at(str(home))
    drain = Drains(storage).active("k8s-spot")
    assert drain is not None and "health_check check failed" in drain.reason and "`false`" in drain.reason
    pools = load_pools(catalog)
    assert Qualifications(storage).fresh(pools["k8s-spot"], "default", ["numpy"]) is None
    passed = Qualifications(storage).fresh(pools["k8s-on-demand"], "default", ["numpy"])
    assert passed is not None and passed["checks"]["health_check"] == "passed" and "round trip" in passed["checks"]["storage"]
    assert [(a["pool"], a["outcome"]) for a in _ledger(home)] == [("k8s-on-demand", "succeeded")]  # a disqualified pool ran no step


def test_status_collect_and_cancel_find_a_pod_from_its_handle(tmp_path: Path, kube) -> None:
    """What the watcher does with an in-flight record: look at the pod, read its log, stop it
    (SIGTERM: the workload saves a checkpoint before it goes)."""
    pool = load_pools(_catalog(tmp_path, _on_demand(kube)))["k8s-on-demand"]
    spec = counting_spec(config={"steps": 100_000, "step_seconds": 0.02})
    pod = pod_spec_for(pool, spec, storage_root=str(tmp_path), run_id="orphaned-run", attempt=1)
    checkpoints = str(tmp_path / "checkpoints")
    extras = {"config": spec.config, "checkpoint_uri": checkpoints, "checkpoint_every_steps": 1_000_000}
    body = build_pod_body("orphan", None, None, {"SINEWGRID_WORKLOAD_EXTRAS": json.dumps(extras)}, pod["metadata"], pod["spec"])
    backend = KubernetesBackend()
    handle = backend.handle_for(pool, "orphan")
    core_api(handle.info).create_namespaced_pod("sinewgrid", body)
    kube.wait_for_log("counting from step 0", labels={"sinewgrid.io/run-id": "orphaned-run"})
    assert backend.status(handle).state is JobState.running
    assert b"counting from step 0" in backend.collect(handle)
    backend.cancel(handle)
    kube.wait_for(lambda: not kube.pods(), "the cancelled pod to be gone")
    assert backend.status(handle).state is JobState.gone
    assert CheckpointStore(checkpoints).latest_valid() is not None  # saved on SIGTERM
