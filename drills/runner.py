"""Run one failure drill: an uninterrupted baseline, the same run with a fault, the measurements.

A drill runs inside a Dagster asset (`platform/failure_drill`), so its runs show in the UI
like any other, and goes through the real `compute` resource: placement, qualification,
the backend (local processes or Slurm jobs), the attempt monitor, failover and the ledger.
Nothing in the platform knows it is being drilled; the only drill-specific pieces are the
pool catalog (two or three small pools, see `drill_catalog`) and the fault.
"""

from __future__ import annotations

import hashlib
import json
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import yaml

from drills import faults
from drills.goodput import loss_bound_steps, optimum_goodput
from drills.model import DrillResult, Timings
from drills.workloads import DrillWorkload, end_state_digest, prepare_inputs, workload
from shared_resources.runtime.checkpoints import CheckpointStore
from shared_resources.runtime.inputs import Failpoint
from shared_resources.compute.resource import ComputeResource
from shared_resources.compute.step_run import StepRun
from shared_resources.compute.health import Drains
from shared_resources.accounting.ledger import read_ledger
from shared_resources.catalog.pools import load_pools
from shared_resources.runtime.storage import Storage, glob_uris

BACKENDS = ("local", "slurm")
# Clusters a drill may fault, by backend; `sinewgrid drill --backend slurm` registers the one it starts.
ACTIVE_CLUSTERS: dict[str, Any] = {}


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    fault: str  # what is injected, in words
    notice: bool  # the workload gets to checkpoint before it goes
    workloads: tuple[str, ...]  # the workloads it makes sense for
    on_straggler: str = "report"


SCENARIOS: dict[str, Scenario] = {
    s.key: s
    for s in (
        Scenario("preempt-notice", "Preemption with notice", "SIGTERM to the workload mid-run (a spot reclaim notice)", True, ("pretrain", "rollouts", "policy")),
        Scenario("preempt-no-notice", "Preemption without notice", "SIGKILL of the workload mid-step (the node is gone)", False, ("pretrain", "rollouts", "policy")),
        Scenario("torn-checkpoint", "Torn checkpoint", "the workload dies (SIGKILL) while writing a checkpoint: tensors written, manifest not", False, ("pretrain", "policy")),
        Scenario("pool-loss", "Pool loss mid-run", "the pool stops taking work (local: every slot taken; Slurm: partition INACTIVE) and its running job is killed", False, ("pretrain", "rollouts", "policy")),
        Scenario("straggler", "Straggler", "the workload's node slows to a fifth of its speed (SIGSTOP/SIGCONT duty cycle)", True, ("pretrain", "policy"), on_straggler="replace"),
        Scenario("unhealthy-node", "Unhealthy node", "the node fails its health check mid-run (local: the pool's health check fails; Slurm: the node is drained, as NHC does)", True, ("pretrain", "rollouts", "policy")),
    )
}


@dataclass
class DrillSetup:
    """Where a drill runs: its root, its pool catalog and (for Slurm) the cluster."""

    storage_root: str
    drill_root: Path
    backend: str
    catalog: Path | None = None  # None: the drill writes its own (the preemption trace does)
    pools: list[str] = field(default_factory=list)  # placement order: the first pool, its peer, (the fallback)
    cluster: Any = None


def drill_catalog(drill_root: Path, backend: str, cluster=None) -> tuple[Path, list[str]]:
    """Small pools for the drill, ranked by price: the pool the fault hits first, then its peer.

    Cool-downs are 0 so that after a plain preemption the step resumes on the same pool
    (as a spot pool that gets capacity back does); a pool that goes bad is drained instead.
    """
    def local(name: str, price: float) -> dict[str, Any]:
        return {
            "provider": "drill", "region": "local", "backend": "local", "purchasing": "spot" if price < 2 else "on_demand",
            "accelerator": "local", "gpus_per_node": 1, "price_per_gpu_hour": price, "max_concurrent_steps": 1,
            "cooldown_seconds": 0, "drain_seconds": 600, "health_check_interval_seconds": 0.5,
            "health_check": faults.health_check_for(drill_root, name),
        }

    if backend == "local":
        pools = {"drill-local-a": local("drill-local-a", 1.0), "drill-local-b": local("drill-local-b", 2.0)}
    elif backend == "slurm":
        if cluster is None:
            raise ValueError("a Slurm drill needs a cluster: `sinewgrid drill --backend slurm` starts a single-node one")
        pools = {}
        for partition, price in (("spot", 1.0), ("gpu", 2.0)):
            pools[f"drill-slurm-{partition}"] = {
                "provider": "drill", "region": "local", "backend": "slurm",
                "backend_settings": {"partition": partition, "env": cluster.env, "time_limit": "00:20:00"},
                "purchasing": "spot" if partition == "spot" else "on_demand", "accelerator": "local", "gpus_per_node": 2,
                "price_per_gpu_hour": price, "cooldown_seconds": 0, "drain_seconds": 600, "health_check_interval_seconds": 0.5,
            }
        pools["drill-local-b"] = local("drill-local-b", 3.0)  # where a step goes when the whole cluster is out
    else:
        raise ValueError(f"unknown drill backend {backend!r}; use one of {', '.join(BACKENDS)}")
    path = drill_root / f"pools-{backend}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"pools": pools}, sort_keys=False))
    return path, list(pools)


# Running -------------------------------------------------------------------------------------


def run_step(context: dg.AssetExecutionContext, setup: DrillSetup, w: DrillWorkload, drill: str, inputs: dict[str, str], **spec_overrides) -> tuple[StepRun, str]:
    storage = Storage.at(setup.storage_root)
    output_uri = storage.uri("drills", "outputs", drill)
    spec = w.spec(drill.replace("/", "."), inputs, output_uri, **spec_overrides)
    compute = ComputeResource(storage_root=setup.storage_root, pools_file=str(setup.catalog))
    step = compute.run(context, spec, lineage=f"drills/{drill}")
    return step, end_state_digest(w, step.checkpoint_uri, output_uri)


def baseline_name(w: DrillWorkload, inputs: dict[str, str]) -> str:
    """The drill name of the uninterrupted run of `w` on `inputs` (its outputs live under it)."""
    key = hashlib.sha256(json.dumps([w.name, w.total, w.checkpoint_every, inputs], sort_keys=True).encode()).hexdigest()[:12]
    return f"baseline/{w.name}-{key}"


def baseline(context: dg.AssetExecutionContext, setup: DrillSetup, w: DrillWorkload, inputs: dict[str, str]) -> str:
    """The uninterrupted run's end-state digest, run once per workload, size and inputs (on
    whichever backend asks first: the end state is the same on every backend)."""
    cache = setup.drill_root / "baselines" / f"{baseline_name(w, inputs).split('/', 1)[1]}.json"
    if cache.exists():
        return json.loads(cache.read_text())["digest"]
    _, digest = run_step(context, setup, w, baseline_name(w, inputs), inputs)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"digest": digest, "workload": w.name}))
    return digest


def _progress(storage: Storage, w: DrillWorkload, checkpoint_uri: str, output_uri: str) -> int:
    if w.name == "rollouts":
        return len(glob_uris(output_uri.rstrip("/") + "/trials/seed-*.json"))
    store = CheckpointStore(checkpoint_uri)
    fs = storage.fs
    done = [s for s in store.steps() if fs.exists(store.step_uri(s).removeprefix("file://") + "/manifest.json")]
    return max(done, default=0)


class Injector(threading.Thread):
    """Waits until the faulted run has a checkpoint at or past the trigger, then injects."""

    def __init__(self, action: Callable[[], None], ready: Callable[[], bool], delay: float):
        super().__init__(daemon=True, name="drill-injector")
        self.action, self.ready, self.delay = action, ready, delay
        self.fault_at: float | None = None
        self.error: BaseException | None = None
        self.cancelled = threading.Event()

    def run(self) -> None:
        try:
            while not self.cancelled.is_set() and not self.ready():
                time.sleep(0.02)
            if self.cancelled.is_set():
                return
            time.sleep(self.delay)
            self.fault_at = time.time()
            self.action()
        except BaseException as exc:  # noqa: BLE001 - reported by the drill
            self.error = exc


def run_scenario(context: dg.AssetExecutionContext, setup: DrillSetup, scenario_key: str, workload_name: str, size: str = "small") -> DrillResult:
    """Run `scenario` against `workload` on the setup's backend and measure the recovery."""
    scenario = SCENARIOS[scenario_key]
    if workload_name not in scenario.workloads:
        raise dg.Failure(f"the {scenario.title.lower()} drill does not apply to {workload_name}: use one of {', '.join(scenario.workloads)}")
    w = workload(workload_name, size)
    storage = Storage.at(setup.storage_root)
    tag = f"{setup.backend}-{size}"
    inputs = prepare_inputs(setup.drill_root)
    if w.name == "policy":
        rollouts = workload("rollouts", size)
        baseline(context, setup, rollouts, inputs)
        inputs = prepare_inputs(setup.drill_root, storage.uri("drills", "outputs", baseline_name(rollouts, inputs)), size)
    expected = baseline(context, setup, w, inputs)

    drill = f"{tag}/{scenario.key}-{w.name}-{context.run_id[:8]}"
    step_name = f"drills.{drill.replace('/', '.')}.{w.name}"
    output_uri = storage.uri("drills", "outputs", drill)
    checkpoint_uri = storage.checkpoints(f"drills/{drill}")
    first_pool = setup.pools[0]
    pools = load_pools(setup.catalog)
    ready_unit = w.trigger
    held: dict[str, Any] = {}

    def pids() -> list[int]:
        return faults.workload_pids(storage, step_name, setup.cluster)

    def target() -> list[int]:
        """The workload's processes, waiting out a moment where the engine cannot list them."""
        deadline = time.time() + 10
        while not (found := pids()):
            if time.time() > deadline:
                raise RuntimeError(f"found no process of {step_name} to fault in its in-flight records within 10 s")
            time.sleep(0.02)
        return found

    def ready() -> bool:
        return _progress(storage, w, checkpoint_uri, output_uri) >= ready_unit and bool(pids())

    def inject() -> None:
        if scenario.key == "preempt-notice":
            faults.signal_workload(target(), signal.SIGTERM)
        elif scenario.key == "preempt-no-notice":
            faults.signal_workload(target(), signal.SIGKILL)
        elif scenario.key == "pool-loss":
            if setup.backend == "local":
                holder = faults.SlotHolder(pools[first_pool])
                holder.start()
                held["holder"] = holder
                time.sleep(0.1)  # the holder now waits on the busy slot
            else:
                setup.cluster.set_partition_state("spot", "INACTIVE")
            faults.signal_workload(target(), signal.SIGKILL)
        elif scenario.key == "straggler":
            throttle = faults.Throttle(target())
            throttle.start()
            held["throttle"] = throttle
        elif scenario.key == "unhealthy-node":
            if setup.backend == "local":
                marker = faults.unhealthy_marker(setup.drill_root, first_pool)
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text("drill: the node's health check fails\n")
            else:
                setup.cluster.drain_node("sinewgrid drill: health check failed")

    def restore() -> None:
        if "holder" in held:
            held["holder"].release()
        if "throttle" in held:
            held["throttle"].stop()
        faults.unhealthy_marker(setup.drill_root, first_pool).unlink(missing_ok=True)
        if setup.backend == "slurm" and setup.cluster is not None:
            setup.cluster.set_partition_state("spot", "UP")
            setup.cluster.resume_node()
        drains = Drains(storage)
        for pool in setup.pools:
            drains.undrain(pool)

    marker = setup.drill_root / "faults" / f"torn-{context.run_id}.json"
    injector: Injector | None = None
    failpoint: Failpoint | None = None
    try:
        if scenario.key == "torn-checkpoint":
            marker.parent.mkdir(parents=True, exist_ok=True)
            failpoint = Failpoint(kind="torn-checkpoint", at_step=w.trigger, marker=str(marker))
        else:
            injector = Injector(inject, ready, delay=_mid_interval_delay(w))
            injector.start()
        step, digest = run_step(context, setup, w, drill, inputs, on_straggler=scenario.on_straggler, name=step_name, failpoint=failpoint)
    finally:
        if injector is not None:
            injector.cancelled.set()
            injector.join(timeout=10)
        restore()
    if injector is not None and injector.error is not None:
        raise dg.Failure(f"the drill could not inject its fault: {injector.error!r}")
    fault_at = injector.fault_at if injector is not None else (json.loads(marker.read_text())["at"] if marker.exists() else None)
    if fault_at is None:
        raise dg.Failure(
            f"the {scenario.title.lower()} fault never fired: the run finished before reaching {w.unit} {w.trigger}. "
            "Use a larger drill size."
        )
    if len(step.timeline) == 1 and step.timeline[0]["outcome"] == "succeeded" and step.timeline[0].get("flags"):
        raise dg.Failure(
            f"the {scenario.title.lower()} drill is void: the platform flagged the run ({step.timeline[0]['flags'][0]['cause']}) "
            "but the workload finished before the stop reached it, so there was nothing to recover. Use a larger drill size."
        )
    return measure(scenario, setup, w, step, fault_at, digest, expected, storage)


def _mid_interval_delay(w: DrillWorkload) -> float:
    """Inject a moment after the trigger checkpoint, so the run is mid-interval (work at risk)."""
    return 0.0 if w.name == "rollouts" else 0.15


# Measuring -------------------------------------------------------------------------------------


def measure(scenario: Scenario, setup: DrillSetup, w: DrillWorkload, step: StepRun, fault_at: float, digest: str, expected: str, storage: Storage) -> DrillResult:
    """Recovery timings, work lost and goodput of a faulted run, from the platform's own records."""
    timeline = step.timeline
    hit = next((t for t in timeline if t["outcome"] not in ("succeeded",) and (t["ended_at"] or 0) >= fault_at - 0.05), None)
    later = timeline[timeline.index(hit) + 1 :] if hit else []
    replacement = next((t for t in later if t["running_at"] is not None and t["outcome"] not in ("refused", "disqualified")), None)
    acted = next((f for f in (hit or {}).get("flags", []) if f["action"] == "replace"), None)

    def since(value: float | None) -> float | None:
        return round(value - fault_at, 3) if value is not None else None

    timings = Timings(
        detect=since(acted["at"] if acted else (hit or {}).get("ended_at")),
        contain=since((hit or {}).get("contained_at")),
        replace=since(replacement["running_at"]) if replacement else None,
        resume=since(replacement["resumed_at"]) if replacement else None,
    )
    # Rollouts commit each finished episode: the one in flight is lost time, never a unit redone.
    notice = scenario.notice or w.name == "rollouts"
    reached = units_done_at(hit, fault_at, notice=notice, cadence=w.checkpoint_every) if hit else 0
    resumed = (replacement or {}).get("resumed_step") or 0
    work_lost = max(reached - resumed, 0)
    bound = 0 if w.name == "rollouts" else loss_bound_steps(w.checkpoint_every, scenario.notice)
    writes = [t for t in timeline if t.get("checkpoints")]
    count = sum(t["checkpoints"] for t in writes)
    checkpoint_s = sum(t["checkpoint_seconds"] for t in writes) / count if count else 0.0
    wall = step.wall_seconds
    optimum = best_goodput(step.productive_seconds, checkpoint_s, wall, timeline)
    ledger = read_ledger(storage, run_id=step.attempts[0].run_id) if step.attempts else None
    causes: dict[str, float] = {}
    if ledger is not None and not ledger.empty:
        mine = ledger[ledger["step"] == step.spec.name]
        causes = {str(k or "succeeded"): round(float(v), 3) for k, v in mine.groupby("cause")["lost_seconds"].sum().items()}
    pools_used = list(dict.fromkeys(t["pool"] for t in timeline))
    return DrillResult(
        scenario=scenario.key,
        title=scenario.title,
        backend=setup.backend,
        workload=w.name,
        fault=scenario.fault,
        fault_at=fault_at,
        timings=timings,
        recovered=bool(step.result),
        identical=bool(digest) and digest == expected,
        digest=digest,
        baseline_digest=expected,
        unit=w.unit,
        work_lost=work_lost,
        loss_bound=bound,
        goodput=round(step.goodput, 4),
        optimum_goodput=round(optimum, 4),
        checkpoint_seconds=round(checkpoint_s, 4),
        fault_rate_per_hour=round(3600.0 / wall, 3) if wall else 0.0,
        action=_action(timeline, hit, replacement, pools_used),
        attempts=[{k: v for k, v in t.items() if k not in ("flags",)} | {"flags": "; ".join(f"{f['cause']}: {f['detail']}" for f in t["flags"])} for t in timeline],
        ledger_causes=causes,
        run_id=step.attempts[0].run_id if step.attempts else "",
    )


def units_done_at(attempt: dict, fault_at: float, *, notice: bool, cadence: int) -> int:
    """Units the faulted attempt had done when the fault hit.

    With notice, the checkpoint it wrote on SIGTERM says it exactly. Without, the process
    could not say: the count is its last checkpoint plus the time from that checkpoint to
    the fault at its median step time (never less than the last step it reported, never past
    the next checkpoint on its cadence, which it did not publish).
    """
    reported = attempt.get("last_step") or 0
    if notice or attempt.get("last_checkpoint_at") is None or not attempt.get("step_seconds"):
        return reported
    since = max(min(fault_at, attempt.get("ended_at") or fault_at) - attempt["last_checkpoint_at"], 0.0)
    estimate = min(int(attempt["last_checkpoint_step"] + since / attempt["step_seconds"]), attempt["last_checkpoint_step"] + cadence)
    return max(reported, estimate)


def best_goodput(work_s: float, checkpoint_s: float, wall_s: float, timeline: list[dict]) -> float:
    """The most goodput this run could have had: Daly's model at the Young/Daly interval for the
    measured checkpoint cost, one fault per run (M = the run's wall time) and the measured
    restart cost (start, imports, data, reading the checkpoint), plus the first start-up."""
    starts = [t["resumed_at"] - t["running_at"] for t in timeline if t.get("resumed_at") and t.get("running_at")]
    if wall_s <= 0 or work_s <= 0 or not starts:
        return 0.0
    restart = sum(starts) / len(starts)
    _, daly = optimum_goodput(checkpoint_s, wall_s, restart_s=restart)
    return work_s / (work_s / daly + starts[0]) if daly > 0 else 0.0


def _action(timeline: list[dict], hit: dict | None, replacement: dict | None, pools: list[str]) -> str:
    if hit is None:
        return "nothing: no attempt ended after the fault"
    words = [f"attempt {hit['attempt']} on {hit['pool']} ended {hit['outcome']} ({hit['cause'] or 'no cause'})"]
    for t in timeline[timeline.index(hit) + 1 :]:
        if t is replacement:
            break
        words.append(f"{t['pool']} {t['outcome']} ({t['cause']})")
    if replacement is not None:
        words.append(f"resumed from {replacement['resumed_step']} on {replacement['pool']}")
    return "; ".join(words)
