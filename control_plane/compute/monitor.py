"""Watching a running attempt: step-time telemetry (stragglers) and the health of its node.

Every backend's wait loop calls `AttemptMonitor.poll()` every fraction of a second. The
monitor reads what the workload reported so far through Pipes (its `telemetry` events:
mean seconds per step since the last report) and asks the backend about the node the job
runs on (`node_problem`: a failing health check, a node Slurm drained), at most every
`health_check_interval_seconds` of the pool.

A **straggler** is an attempt whose recent steps are `straggler_factor` times slower than
its own earlier ones, for `straggler_patience` reports in a row; in a gang, it is also one
rank whose busy time per step (its step less the time it waited for its peers) is
`straggler_factor` times its peers' median for `straggler_patience` reports: the flag names
that rank and its node (a slow rank slows the whole gang, so its own past cannot show it). What the platform does is
the step's policy (`StepSpec.on_straggler`): `replace` drains the pool for a while and moves
the step (the workload gets SIGTERM, checkpoints, and resumes elsewhere); `report` logs it
and lets the step run on. An **unhealthy node** is always replaced.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.compute.causes import Cause
from workload_runtime.messages import Telemetry, parse_messages



@dataclass(frozen=True)
class Flag:
    """Something wrong with a running attempt, and what the platform does about it."""

    cause: Cause  # straggler | unhealthy-node
    detail: str  # in words, with the numbers
    action: str  # replace | report
    at: float  # unix time it was flagged
    node: str = ""  # the node at fault, when the monitor knows it (a gang's slow rank)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


BASELINE_REPORTS = 5


# A step must be this much slower than its reference (its own start, or its peers' median), besides
# `factor` times: a few milliseconds of work per step vary by more than a factor on a busy node
# (or between ranks) without meaning anything.
MIN_SLOWER_SECONDS = 0.01


def straggling(step_seconds: Sequence[float], factor: float, patience: int, warmup: int = 3) -> tuple[bool, float, float]:
    """Whether the last `patience` step times are each over `factor` × (and `MIN_SLOWER_SECONDS` over) the pace the attempt
    started at: the median of its first reports (up to `BASELINE_REPORTS`, at least `warmup`,
    none of the last `patience`). Returns (flagged, baseline, recent median).

    The baseline is the start, not all history: a slowdown that goes unseen for a while (a
    monitor that polls less often than the workload reports) would otherwise fill the
    history with slow reports until it looks normal.
    """
    if patience < 1 or len(step_seconds) < warmup + patience:
        return False, 0.0, 0.0
    history, recent = step_seconds[:-patience], step_seconds[-patience:]
    baseline = statistics.median(history[:BASELINE_REPORTS])
    if baseline <= 0:
        return False, baseline, statistics.median(recent)
    return all(s > factor * baseline and s - baseline > MIN_SLOWER_SECONDS for s in recent), baseline, statistics.median(recent)


@dataclass(frozen=True)
class SlowRank:
    rank: int
    node: str
    seconds: float  # its busy time per step, the median of the reports it was judged on
    peers: float  # the median of its peers' over the same reports


def slow_rank(reports: Sequence[Telemetry], factor: float, patience: int) -> SlowRank | None:
    """The one rank of a gang whose busy time per step, over the last `patience` reports, is over
    `factor` × its peers' median (and `MIN_SLOWER_SECONDS` more), or None. Each rank is judged
    by its median report of the window, neither each report nor their mean: a slow rank that
    waited on a stalled peer in one window (a busy machine) is still the slow one, and a healthy
    rank descheduled once for a long moment (one outsized report) is not made one."""
    recent = [m for m in reports if m.rank_seconds and len(m.rank_seconds) > 1][-patience:]
    if patience < 1 or len(recent) < patience or len({len(m.rank_seconds or []) for m in recent}) != 1:
        return None
    typical = [statistics.median(column) for column in zip(*(m.rank_seconds or [] for m in recent), strict=True)]
    slow = []
    for rank, seconds in enumerate(typical):
        peers = statistics.median(typical[:rank] + typical[rank + 1 :])
        if seconds > factor * peers and seconds - peers > MIN_SLOWER_SECONDS:
            slow.append((rank, seconds, peers))
    if len(slow) != 1:
        return None
    rank, seconds, peers = slow[0]
    nodes = recent[-1].nodes or []
    return SlowRank(rank, nodes[rank] if rank < len(nodes) else "", round(seconds, 6), round(peers, 6))


class AttemptMonitor:
    """Flags stragglers and unhealthy nodes while one attempt runs.

    `messages` returns the workload's Pipes messages so far; `node_problem` asks the backend
    about the attempt's node (None: healthy). `poll()` returns a flag the backend must act on
    (replace: stop the attempt, the step moves), once; `report` flags are kept in `flags`
    and logged, nothing else.
    """

    def __init__(
        self,
        pool: Pool,
        spec: StepSpec,
        *,
        messages: Callable[[], Sequence[Any]],
        node_problem: Callable[[], str | None],
        log: Callable[[str], None] = lambda msg: None,
    ):
        self.pool, self.spec = pool, spec
        self._messages, self._node_problem, self._log = messages, node_problem, log
        self._next_health = time.time() + pool.health_check_interval_seconds
        self.flags: list[Flag] = []
        self.acted: Flag | None = None

    def _flag(self, cause: Cause, detail: str, action: str, node: str = "") -> Flag:
        flag = Flag(cause, detail, action, time.time(), node)
        self.flags.append(flag)
        self._log(f"{self.spec.name} on {self.pool.name}: {cause}: {detail} ({'stopping it: the node is replaced, or the step moves' if action == 'replace' else 'reported only'})")
        return flag

    def telemetry(self) -> list[Telemetry]:
        return [m for m in parse_messages(self._messages()) if isinstance(m, Telemetry) and m.step_seconds]

    def step_times(self) -> list[float]:
        return [m.step_seconds for m in self.telemetry()]

    def poll(self) -> Flag | None:
        if self.acted is not None:
            return None
        if not any(f.cause is Cause.straggler for f in self.flags):
            reports = self.telemetry()
            slow = slow_rank(reports, self.spec.straggler_factor, self.spec.straggler_patience)
            flagged, baseline, recent = straggling([m.step_seconds for m in reports], self.spec.straggler_factor, self.spec.straggler_patience)
            if slow is not None:
                flag = self._flag(
                    Cause.straggler,
                    f"rank {slow.rank} on {slow.node or 'its node'} works {slow.seconds:.3g}s per step, {slow.seconds / max(slow.peers, 1e-9):.1f}× "
                    f"the {slow.peers:.3g}s of its peers (threshold {self.spec.straggler_factor:g}× for {self.spec.straggler_patience} reports)",
                    self.spec.on_straggler,
                    node=slow.node,
                )
                if flag.action == "replace":
                    self.acted = flag
                    return flag
            elif flagged:
                flag = self._flag(
                    Cause.straggler,
                    f"steps take {recent:.3g}s, {recent / baseline:.1f}× the {baseline:.3g}s this attempt started at "
                    f"(threshold {self.spec.straggler_factor:g}× for {self.spec.straggler_patience} reports)",
                    self.spec.on_straggler,
                )
                if flag.action == "replace":
                    self.acted = flag
                    return flag
        if time.time() >= self._next_health:
            self._next_health = time.time() + self.pool.health_check_interval_seconds
            problem = self._node_problem()
            if problem:
                self.acted = self._flag(Cause.unhealthy_node, problem, "replace")
                return self.acted
        return None
