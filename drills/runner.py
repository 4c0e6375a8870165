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
import time
from pathlib import Path
from typing import Any

import dagster as dg

from drills import faults
from drills.scenarios import BACKENDS, GANG_ENTRY_POINT, SCENARIOS, DrillSetup, Scenario, drill_catalog  # noqa: F401 - the drill matrix, read from here too
from drills.goodput import loss_bound_steps, optimum_goodput
from drills.model import DrillResult, Timings
from drills.workloads import DrillWorkload, end_state_digest, prepare_inputs, workload
from workload_runtime.inputs import Failpoint
from control_plane.compute.monitor import BASELINE_REPORTS
from shared_resources.compute import ComputeResource
from control_plane.compute.step_run import StepRun
from control_plane.compute.backends.gang import kill_node
from control_plane.compute.health import Drains, Qualifications
from control_plane.accounting.ledger import read_ledger
from control_plane.catalog.pools import load_pools
from workload_runtime.storage import Storage

# Clusters a drill may fault, by backend ("slurm-gang" for the multi-node one the gang scenarios
# need); `sinewgrid drill` registers the ones it starts.
ACTIVE_CLUSTERS: dict[str, Any] = {}


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


def fault_unit(w: DrillWorkload) -> int:
    """The unit a fault lands at: the middle of the interval after the trigger checkpoint (work
    at risk, for training), or right after the trigger episode is committed (rollouts)."""
    return w.trigger + w.checkpoint_every // 2


# The longest a held workload waits for its fault, or for the platform to stop it: past this,
# the drill has failed (its injector died, or the platform never reacted) and the run goes on.
HOLD_SECONDS = 120.0
# The straggler drill flags a step 8x slower than its start: its throttle makes ~20x, a busy machine alone 5x and more.
STRAGGLER_DRILL_FACTOR = 8.0


def run_scenario(context: dg.AssetExecutionContext, setup: DrillSetup, scenario_key: str, workload_name: str, size: str = "small") -> DrillResult:
    """Run `scenario` against `workload` on the setup's backend and measure the recovery.

    The fault fires on events, never on a guess about how long the run takes: the workload is
    armed with a failpoint that either is the fault (a torn checkpoint) or holds the workload at
    the fault's unit until the fault has landed (everything else), and the fault goes to a job
    the platform's in-flight records show running. A drill whose run is too small for its fault,
    or whose run finished with nothing for the platform to recover, is an error, not a pass.
    """
    scenario = SCENARIOS[scenario_key]
    if workload_name not in scenario.workloads:
        raise dg.Failure(f"the {scenario.title.lower()} drill does not apply to {workload_name}: use one of {', '.join(scenario.workloads)}")
    if setup.backend not in scenario.backends:
        raise dg.Failure(f"the {scenario.title.lower()} drill does not run on {setup.backend}: use one of {', '.join(scenario.backends)}")
    w = workload(workload_name, size)
    unit = w.trigger if scenario.key == "torn-checkpoint" else fault_unit(w)
    if unit >= w.total:
        raise dg.Failure(
            f"the {scenario.title.lower()} drill is too small for its fault: a {size} {w.name} run does {w.total} {w.unit}, "
            f"and the fault lands at {w.unit} {unit}. Use a larger drill size."
        )
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
    first_pool = setup.pools[0]
    pools = load_pools(setup.catalog)
    held: dict[str, Any] = {}

    def target() -> list[int]:
        """The workload's processes, from the platform's in-flight records (the held workload is
        running, so its record exists; an engine may take a moment to list a job's processes)."""
        deadline = time.time() + 10
        while not (found := faults.workload_pids(storage, step_name, setup.cluster)):
            if time.time() > deadline:
                raise RuntimeError(f"found no process of {step_name} to fault in its in-flight records within 10 s")
            time.sleep(0.02)
        return found

    def held_rank() -> int:
        """The pid of the rank the hold failpoint stopped (it wrote the marker)."""
        return int(json.loads(Path(failpoint.marker).read_text())["pid"])

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
                deadline = time.time() + 10
                while not holder.queued():  # in line for the busy slot: the platform cannot retake it
                    if time.time() > deadline or not holder.is_alive():
                        raise RuntimeError(f"the slot holder did not queue for {first_pool}'s busy slot within 10 s")
                    time.sleep(0.005)
            else:
                setup.cluster.set_partition_state("spot", "INACTIVE")
            faults.signal_workload(target(), signal.SIGKILL)
        elif scenario.key == "straggler":
            # A twentieth: far past the drill's 8× threshold even when a busy machine slowed the
            # attempt's first steps (its baseline) too, and slow enough that the run cannot finish
            # before the monitor has seen the reports it needs.
            throttle = faults.Throttle(target(), share=0.05)
            throttle.start()
            held["throttle"] = throttle
        elif scenario.key == "node-loss":
            rank, node = faults.rank_process(1, GANG_ENTRY_POINT, peer=held_rank())
            held["node"] = node
            if setup.backend == "local":
                kill_node(rank.parent().pid)  # its torchrun agent and its rank
            elif setup.backend == "slurm":
                faults.signal_workload([p for p in setup.cluster.node_pids(node) if faults.is_python(p)], signal.SIGKILL)
            else:
                setup.cluster.kill_node(node)
        elif scenario.key == "slow-rank":
            rank, node = faults.rank_process(1, GANG_ENTRY_POINT, peer=held_rank())
            held["quota"] = faults.CpuQuota([rank.pid], share=0.02)
            held["node"] = node
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
        if "quota" in held:
            held["quota"].stop()
        if scenario.key == "node-unqualified":  # the trigger is gone once a health check took it
            trigger = faults.rank1_sickens(setup.drill_root, first_pool)
            held["sickened"] = not trigger.exists()
            trigger.unlink(missing_ok=True)
        sick = faults.sick_nodes(setup.drill_root, setup.pools)
        for node in sick:
            faults.unhealthy_marker(setup.drill_root, node).unlink()
        if scenario.gang and setup.cluster is not None:
            # Put the faulted nodes back (Slurm: resumed; Ray: a fresh node in place of a dead or drained one).
            setup.cluster.restore_nodes([n for n in [held.get("node"), *sick] if n])
        faults.unhealthy_marker(setup.drill_root, first_pool).unlink(missing_ok=True)
        if setup.backend == "slurm" and setup.cluster is not None and not scenario.gang:
            setup.cluster.set_partition_state("spot", "UP")
            setup.cluster.resume_node()
        drains = Drains(storage)
        for pool in setup.pools:
            drains.undrain(pool)

    faults_dir = setup.drill_root / "faults"
    faults_dir.mkdir(parents=True, exist_ok=True)
    injector: faults.Injector | None = None
    failpoint: Failpoint | None = None
    if scenario.key == "torn-checkpoint":
        failpoint = Failpoint(kind="torn-checkpoint", at_step=unit, marker=str(faults_dir / f"torn-{context.run_id}.json"))
    elif scenario.key == "node-unqualified":
        # Before the gang starts: the pool's qualification is due, and the node rank 1 would run on fails it.
        Qualifications(storage).forget(first_pool)
        trigger = faults.rank1_sickens(setup.drill_root, first_pool)
        trigger.write_text("drill: this node fails its health check\n")
        sickened_at = time.time()
    else:
        # A straggler is measured against the pace the attempt started at: hold only once the
        # workload has reported it as often as the detector's baseline takes.
        reports = BASELINE_REPORTS if scenario.key == "straggler" else 0
        failpoint = Failpoint(
            kind="hold", at_step=unit, marker=str(faults_dir / f"held-{context.run_id}.json"), after_reports=reports, hold_seconds=HOLD_SECONDS
        )
        # An unhealthy node is the platform's to find: the workload waits until it is stopped.
        injector = faults.Injector(inject, failpoint, release=scenario.key not in ("unhealthy-node", "node-loss"))
        injector.start()
    try:
        # The throttle slows the node to a twentieth or less (~20x); a drill's millisecond steps slow
        # by 5x and more on a busy machine on their own, so the detector is set between the two.
        patience: dict[str, float] = {}
        if scenario.key == "straggler":
            patience = {"straggler_factor": STRAGGLER_DRILL_FACTOR}
        elif scenario.key == "slow-rank":
            patience = {"straggler_factor": STRAGGLER_DRILL_FACTOR, "straggler_patience": 3}
        step, digest = run_step(context, setup, w, drill, inputs, on_straggler=scenario.on_straggler, name=step_name, failpoint=failpoint, **patience)
    finally:
        if injector is not None:
            injector.cancelled.set()
            injector.join(timeout=10)
            injector.release()
        restore()
    if injector is not None and injector.error is not None:
        raise dg.Failure(f"the drill could not inject its fault: {injector.error!r}")
    if failpoint is None:  # node-unqualified: fired when a probe's health check took the trigger
        if not held.get("sickened"):
            raise dg.Failure(f"the {scenario.title.lower()} fault never fired: no qualification probe ran rank 1's health check on {first_pool}")
        fired = {"step": 0, "at": sickened_at}
    elif (marker := Path(failpoint.marker)).exists():
        fired = json.loads(marker.read_text())
    else:
        raise dg.Failure(
            f"the {scenario.title.lower()} fault never fired: the run finished before reaching {w.unit} {unit}"
            + (f" with {failpoint.after_reports} step-time reports sent" if failpoint.after_reports else "")
            + ". Use a larger drill size."
        )
    fault_at = injector.fault_at if injector is not None else fired["at"]
    if fault_at is None:
        raise dg.Failure(f"the workload waited at {w.unit} {fired['step']} for the {scenario.title.lower()} fault, which never came")
    if len(step.timeline) == 1 and step.timeline[0]["outcome"] == "succeeded":
        flags = step.timeline[0].get("flags")
        raise dg.Failure(
            f"the {scenario.title.lower()} drill is void: the fault landed at {w.unit} {fired['step']}, but the run finished "
            + (f"before the stop reached it (the platform flagged {flags[0]['cause']})" if flags else "before the platform reacted")
            + ", so there was nothing to recover. Use a larger drill size."
        )
    # The failpoint says the unit the fault hit (the one held at, or the checkpoint torn while
    # written): without notice, that is the work the attempt had done.
    return measure(scenario, setup, w, step, fault_at, digest, expected, storage, fault_unit_done=fired["step"])


# Measuring -------------------------------------------------------------------------------------


def measure(
    scenario: Scenario, setup: DrillSetup, w: DrillWorkload, step: StepRun, fault_at: float, digest: str, expected: str, storage: Storage,
    fault_unit_done: int | None = None,
) -> DrillResult:
    """Recovery timings, work lost and goodput of a faulted run, from the platform's own records.

    `fault_unit_done`: the unit the workload had done when the fault hit, when known (it was
    held there); else it is worked out from the attempt's records (`units_done_at`)."""
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
    if hit is None:
        reached = 0
    elif fault_unit_done is not None:
        reached = max(fault_unit_done, hit.get("last_step") or 0)
    else:
        reached = units_done_at(hit, fault_at, notice=notice, cadence=w.checkpoint_every)
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
    # An engine may see its job running after the workload already said it resumed (Slurm polls
    # its queue): such a start-up counts as none, never as negative time.
    starts = [max(0.0, t["resumed_at"] - t["running_at"]) for t in timeline if t.get("resumed_at") and t.get("running_at")]
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
