"""What a drill measured: the records the runner fills in and the report publishes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Timings:
    """Seconds from the fault to each recovery milestone (None: the milestone did not happen).

    detect:  the platform knew the attempt was lost or bad (the backend saw the process or
             job end, the straggler detector or the health check flagged it);
    contain: the faulty capacity was out of use (the attempt's process gone, the pool cooled
             down or drained, so nothing new lands on it);
    replace: a new attempt was running on replacement capacity;
    resume:  the new attempt had loaded its checkpoint and was doing work again.
    """

    detect: float | None = None
    contain: float | None = None
    replace: float | None = None
    resume: float | None = None


@dataclass
class DrillResult:
    """One scenario, on one backend, against one workload: the fault and the recovery."""

    scenario: str  # key in scenarios.SCENARIOS, e.g. "preempt-notice"
    title: str  # e.g. "Preemption with notice"
    backend: str  # local | slurm
    workload: str  # pretrain | rollouts | policy
    fault: str  # what was injected, in words
    fault_at: float  # unix time of the injection
    timings: Timings
    recovered: bool  # the step finished after the fault
    identical: bool  # end state digest equals the uninterrupted run's
    digest: str
    baseline_digest: str
    unit: str  # "steps" (training) or "episodes" (rollouts)
    work_lost: int  # units redone because of the fault
    loss_bound: int  # the most the checkpoint cadence allows to be redone
    goodput: float  # productive / allocated over every attempt of the faulted run
    optimum_goodput: float  # Young/Daly for the measured checkpoint cost and this fault rate
    checkpoint_seconds: float  # mean time to write one checkpoint, measured in the run
    fault_rate_per_hour: float  # one fault over the faulted run's length
    action: str  # what the platform did, in words
    attempts: list[dict[str, Any]] = field(default_factory=list)  # pool, outcome, cause, times
    ledger_causes: dict[str, float] = field(default_factory=dict)  # lost seconds by cause, from the ledger
    run_id: str = ""  # the Dagster run that carried the faulted step

    @property
    def within_bound(self) -> bool:
        return self.work_lost <= self.loss_bound

    @property
    def reacted(self) -> bool:
        """The platform noticed the fault and moved the work on (every milestone happened)."""
        t = self.timings
        return None not in (t.detect, t.contain, t.replace, t.resume)

    @property
    def passed(self) -> bool:
        return self.recovered and self.reacted and self.identical and self.within_bound

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "within_bound": self.within_bound, "reacted": self.reacted, "passed": self.passed}


@dataclass
class TraceRun:
    """One cadence under a preemption trace (the same interruption times for every cadence)."""

    cadence: str  # none | fixed | young-daly
    interval_seconds: float | None  # time between checkpoints (None: only the final one)
    faults_at: list[float]  # seconds of wall time since the run started, as injected
    wall_seconds: float  # first start to final result, every attempt included
    productive_seconds: float  # work that ended up in the final result (the run's work time)
    goodput: float  # productive / wall
    predicted_goodput: float  # Daly's model for this interval, checkpoint cost and rate
    checkpoints: int  # checkpoints written
    work_lost_seconds: float  # work done and then redone
    finished: bool
    identical: bool  # final checkpoint identical to the uninterrupted run's


@dataclass
class TraceResult:
    """The preemption-trace mode: a rate, the trace drawn from it, three cadences."""

    backend: str
    workload: str
    rate_per_hour: float
    band: str  # where the rate comes from (e.g. a published spot interruption band)
    seed: int
    checkpoint_seconds: float  # measured
    work_seconds: float  # the uninterrupted run's work time
    runs: list[TraceRun] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
