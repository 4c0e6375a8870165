"""Preemption-trace mode: replay interruptions drawn from a rate, under three checkpoint cadences.

One trace — interruption times from a Poisson process at a rate (a published spot band,
time-compressed so a short run sees a few) — is replayed against the same pretraining run
three times: with no checkpoints but the final one, with a fixed cadence (the lane's
default, every N steps), and with the Young/Daly interval the placement works out itself
from the pool's interruption rate and the step's checkpoint cost. Each interruption is a
SIGKILL (no notice: the case a cadence exists for). Measured goodput is set beside Daly's
prediction for the same interval, checkpoint cost, rate and restart cost.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import dagster as dg
import yaml

from control_plane.compute.step_run import StepRun
from drills import faults
from drills.goodput import expected_goodput
from drills.model import TraceResult, TraceRun
from drills.runner import DrillSetup, baseline, run_step
from drills.trace import acceleration_for, draw_trace, rate_for
from drills.workloads import prepare_inputs, workload
from workload_runtime.storage import Storage

CADENCES = ("none", "fixed", "young-daly")


class KillAt(threading.Thread):
    """SIGKILL the step's workload at each trace time (seconds since `start`)."""

    def __init__(self, times: list[float], pids, start: float):
        super().__init__(daemon=True, name="drill-trace")
        self.times, self.pids, self.start_at = times, pids, start
        self.fired: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        for at in self.times:
            while not self.done.is_set() and time.time() - self.start_at < at:
                time.sleep(0.01)
            while not self.done.is_set() and not (pids := self.pids()):
                time.sleep(0.01)  # between attempts: the interruption hits the next one
            if self.done.is_set():
                return
            faults.signal_workload(pids, signal.SIGKILL)
            self.fired.append(round(time.time() - self.start_at, 3))
            while not self.done.is_set() and set(self.pids()) & set(pids):
                time.sleep(0.01)


def _catalog(root: Path, rate_per_hour: float, name: str) -> Path:
    pool = {
        "provider": "drill", "region": "local", "backend": "local", "purchasing": "spot", "accelerator": "local",
        "gpus_per_node": 1, "price_per_gpu_hour": 1.0, "cooldown_seconds": 0, "interruption_rate_per_hour": rate_per_hour,
    }
    path = root / f"pools-trace-{name}.yaml"
    path.write_text(yaml.safe_dump({"pools": {"drill-trace": pool}}))
    return path


def _restart_seconds(step: StepRun) -> float:
    """Mean time from an attempt running to its work resuming (start, imports, data, checkpoint read)."""
    gaps = [t["resumed_at"] - t["running_at"] for t in step.timeline if t.get("resumed_at") and t.get("running_at")]
    return sum(gaps) / len(gaps) if gaps else 0.0


def run_trace(
    context: dg.AssetExecutionContext, setup: DrillSetup, band_or_rate: str | float, *,
    seed: int = 1, size: str = "small", steps: int | None = None, expected_faults: float = 3.0,
) -> TraceResult:
    storage = Storage.at(setup.storage_root)
    # Longer than a scenario's run, so work (not process start-up) fills most of the wall time.
    w = replace(workload("pretrain", size), total=2400 if size == "small" else 9000, checkpoint_every=200 if size == "small" else 500)
    if steps is not None:
        if steps < 2 * w.checkpoint_every:
            raise ValueError(
                f"A preemption trace of {steps} steps is too short: the fixed cadence checkpoints every {w.checkpoint_every} "
                f"steps at size {size!r}, so a run needs at least {2 * w.checkpoint_every}. Raise `steps` or leave it unset."
            )
        w = replace(w, total=steps)
    inputs = prepare_inputs(setup.drill_root)
    tag = f"trace-{size}"
    published, band = rate_for(band_or_rate)

    # The uninterrupted run: its work time, checkpoint cost, restart cost and end state.
    probe_setup = replace(setup, catalog=_catalog(setup.drill_root, 0.0, "calm"), pools=["drill-trace"])
    calm, expected = run_step(context, probe_setup, w, f"{tag}/uninterrupted-{context.run_id[:8]}", inputs)
    work_s = calm.productive_seconds
    writes = sum(t["checkpoints"] for t in calm.timeline)
    checkpoint_s = sum(t["checkpoint_seconds"] for t in calm.timeline) / writes if writes else 0.0
    first_start = _restart_seconds(calm)
    step_s = work_s / w.total

    speedup = acceleration_for(published, calm.wall_seconds, expected_faults)
    replayed = published * speedup
    trace = draw_trace(replayed, horizon_s=4 * calm.wall_seconds, seed=seed, max_faults=int(3 * expected_faults))
    result = TraceResult(
        backend=setup.backend, workload=w.name, rate_per_hour=round(replayed, 3), band=band, seed=seed,
        checkpoint_seconds=round(checkpoint_s, 5), work_seconds=round(work_s, 3),
    )
    for cadence in CADENCES:
        catalog = _catalog(setup.drill_root, replayed if cadence == "young-daly" else 0.0, cadence)
        every = w.checkpoint_every if cadence == "fixed" else w.total + 1
        overrides: dict[str, Any] = {
            "checkpoint_every_steps": every, "checkpoint_seconds": max(checkpoint_s, 1e-4), "max_preemptions": len(trace) + 2,
            "name": f"drills.{tag}.{cadence}.pretrain",
        }
        run_setup = replace(setup, catalog=catalog, pools=["drill-trace"])
        killer = KillAt(trace, lambda n=overrides["name"]: faults.workload_pids(storage, n), time.time())
        killer.start()
        try:
            step, digest = run_step(context, run_setup, w, f"{tag}/{cadence}-{context.run_id[:8]}", inputs, **overrides)
        finally:
            killer.done.set()
            killer.join(timeout=10)
        interval = step.plan.verdict("drill-trace").checkpoint_interval_seconds if cadence == "young-daly" else (every * step_s if cadence == "fixed" else None)
        mtbf = 3600.0 / replayed
        predicted_daly = expected_goodput(interval, checkpoint_s, mtbf, restart_s=first_start, work_s=work_s)
        predicted = work_s / (work_s / predicted_daly + first_start) if predicted_daly > 0 else 0.0
        result.runs.append(
            TraceRun(
                cadence=cadence,
                interval_seconds=round(interval, 3) if interval else None,
                faults_at=killer.fired,
                wall_seconds=round(step.wall_seconds, 3),
                # This run's own work in its result (from the ledger), not the calm run's: a machine
                # that runs faster or slower now than it did then cannot put goodput above 1 or below.
                productive_seconds=round(step.productive_seconds, 3),
                goodput=round(step.productive_seconds / step.wall_seconds, 4) if step.wall_seconds else 0.0,
                predicted_goodput=round(predicted, 4),
                checkpoints=sum(t["checkpoints"] for t in step.timeline),
                work_lost_seconds=round(sum(a.lost_preemption_seconds for a in step.attempts), 3),
                finished=bool(step.result),
                identical=digest == expected,
            )
        )
        context.log.info(f"trace, {cadence} cadence: {result.runs[-1]}")
    if not all(run.identical for run in result.runs) and baseline(context, probe_setup, w, inputs) != expected:
        # Only asked when a cadence ended elsewhere: every run identical to the calm one already
        # shows the run is reproducible, and a second uninterrupted run costs as much as a cadence.
        raise dg.Failure("the uninterrupted pretraining run is not reproducible; the trace comparison needs it to be")
    return result
