"""A discrete-event simulation of a fleet's queues, driving the product's own admission.

Jobs arrive, wait, run on a pool, are preempted (a team taking back its lent quota, a spot
interruption) and resume from their checkpoints, and finish. Which pool a job may run on, in
which order, is the product's placement (`plan_placement`, once per job shape); whether it may
start there now, and whom it preempts, is the product's admission (`PoolQueue.decide`). Only
the clock, the jobs' progress and the baselines' loops are this module's.

Time is in hours. Capacity is counted in GPUs: a gang holds whole nodes (`held_gpus`), and how
jobs pack onto nodes is not modelled. Policies:

- `queues`: Sinewgrid's admission with the quotas catalog as given: nominal quotas, cohorts
  that lend and reclaim, priority classes, fair-share order of the waiting work; with
  `move_min_hours`, work on costlier pools moves onto `committed` pools that come free (the
  product's `moves.better_pool`; the simulation knows each job's true hours left, where the
  product goes by the step's `expected_hours`).
- `strict`: the same admission with every cohort removed: each team only within its nominal
  quota (nobody lends, nobody borrows).
- `fifo`: one queue in arrival order, no quotas or priorities: the oldest waiting job starts
  first, on the first pool of its plan with room; nothing behind it starts before it does.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from control_plane.catalog.quotas import Quotas
from control_plane.queues.admission import PoolQueue, Request, choose, order
from control_plane.queues.moves import better_pool

POLICIES = ("queues", "strict", "fifo")
RESTART_HOURS = 5 / 60  # relaunching a preempted job and loading its checkpoint: held, not productive


@dataclass
class Job:
    """One step as the simulation runs it."""

    id: str
    team: str
    kind: str  # pretraining, fine-tune, policy, sweep, evaluation: for the report
    priority_class: str
    priority: int
    arrival: float
    hours: float  # run time at full speed, from start to end, with no preemption
    ranked: tuple[str, ...]  # placement's pools, best first
    held: Mapping[str, int]  # GPUs it holds on each of them
    checkpoint_hours: float = 0.5  # periodic checkpoints
    checkpoint_write_hours: float = 1 / 60  # one checkpoint written on notice
    # Runtime state
    done: float = 0.0  # productive hours kept (checkpointed, or running now)
    pool: str | None = None
    started: float = 0.0
    restart: float = 0.0  # hours of this start spent relaunching and loading the checkpoint
    first_start: float | None = None
    finished: float | None = None
    token: int = 0
    preemptions: int = 0


@dataclass
class Ledger:
    held: dict[tuple[str, str], float] = field(default_factory=dict)  # (team, pool) -> GPU-hours held
    productive: dict[tuple[str, str], float] = field(default_factory=dict)  # ... kept work
    lost: dict[str, float] = field(default_factory=dict)  # cause -> GPU-hours of work redone

    def add(self, book: dict, key: tuple[str, str], value: float) -> None:
        book[key] = book.get(key, 0.0) + value


@dataclass(frozen=True)
class Interruption:
    """The spot trace: at `at`, `gpus` of `pool` are taken back for `hours`; `notice_hours` before."""

    at: float
    pool: str
    gpus: int
    hours: float
    notice_hours: float


class Simulation:
    """One policy over one fleet, one workload and one interruption trace, up to `horizon` hours."""

    def __init__(
        self, policy: str, capacity: Mapping[str, int], quotas: Quotas, jobs: Iterable[Job], trace: Iterable[Interruption], horizon: float,
        committed: Iterable[str] = (), move_min_hours: float | None = None,
    ):
        if policy not in POLICIES:
            raise ValueError(f"no policy {policy!r}; the policies: {', '.join(POLICIES)}")
        self.policy, self.horizon = policy, horizon
        self.committed, self.move_min_hours = set(committed), move_min_hours
        rules = quotas.model_copy(update={"cohorts": {}}) if policy == "strict" else quotas
        self.queues = {name: PoolQueue(name, gpus, rules) for name, gpus in capacity.items()}
        self.capacity = dict(capacity)
        self.jobs = {job.id: job for job in jobs}
        self.ledger = Ledger()
        self.now = 0.0
        self.stops = 0  # preemptions so far
        self._events: list = []
        self._seq = itertools.count()
        self._groups: dict[tuple, deque[Job]] = {}  # (priority, team, shape) -> waiting, in arrival order
        self._fifo: list[tuple[float, str]] = []  # heap of (arrival, id) waiting, for `fifo`
        self._running_on: dict[str, dict[str, Job]] = {name: {} for name in capacity}
        for job in self.jobs.values():
            self._push(job.arrival, "arrive", job.id)
        for cut in trace:
            self._push(cut.at, "interrupt", cut)
        self.samples: list[dict[str, tuple[int, int]]] = []  # each hour: team -> (GPUs held, GPUs waiting)
        for hour in range(1, int(horizon) + 1):
            self._push(float(hour) - 1e-9, "sample", None)

    # The clock ----------------------------------------------------------------------------------
    def _push(self, at: float, kind: str, payload: object) -> None:
        heapq.heappush(self._events, (at, next(self._seq), kind, payload))

    def run(self) -> Simulation:
        while self._events and self._events[0][0] <= self.horizon:
            self.now, _, kind, payload = heapq.heappop(self._events)
            if kind == "arrive":
                job, stops = self.jobs[payload], self.stops
                if (self.policy == "fifo" and self._fifo) or not self._try(job):  # fifo: behind the oldest
                    self._wait(job)
                elif self.stops != stops:  # its victims' GPUs beyond its own go to what waits
                    self._pass()
            elif kind == "finish":
                job_id, token = payload
                job = self.jobs[job_id]
                if job.token == token and job.pool is not None:
                    self._finish(job)
            elif kind == "interrupt":
                self._interrupt(payload)
            elif kind == "sample":
                self._sample()
            elif kind == "restore":
                pool, gpus = payload
                self.capacity[pool] += gpus
                self.queues[pool].capacity += gpus
                self._pass()
        self.now = self.horizon
        for pool in self._running_on.values():
            for job in list(pool.values()):
                self._book(job, self.now - job.started, kept=True)
                job.started, job.restart = self.now, 0.0
        return self

    def _sample(self) -> None:
        now: dict[str, list[int]] = {}
        for pool in self._running_on.values():
            for job in pool.values():
                now.setdefault(job.team, [0, 0])[0] += job.held[job.pool]
        waiting = [self.jobs[i] for _, i in self._fifo] if self.policy == "fifo" else [j for g in self._groups.values() for j in g]
        for job in waiting:
            now.setdefault(job.team, [0, 0])[1] += job.held[job.ranked[0]]
        self.samples.append({team: (held, wait) for team, (held, wait) in now.items()})

    # Jobs starting, waiting, stopping -------------------------------------------------------
    def _try(self, job: Job) -> bool:
        """Start `job` where its plan and the queues agree (`choose`), preempting if they say so."""
        if self.policy == "fifo":
            pool = next((p for p in job.ranked if job.held[p] <= self.queues[p].free), None)
            if pool is None:
                return False
            self.queues[pool].add(Request(job.id, job.team, job.held[pool], 0, job.arrival))
            self._start(job, pool)
            return True
        requests = {p: Request(job.id, job.team, job.held[p], job.priority, job.arrival) for p in job.ranked}
        placed = choose((p, self.queues[p].decide(requests[p])) for p in job.ranked)
        if placed.pool is None:
            return False
        for victim in placed.decision.preempt:
            self._stop(self.jobs[victim], cause="reclaimed" if self.jobs[victim].team != job.team else "priority", notice=True)
        self.queues[placed.pool].admit(requests[placed.pool], placed.decision)
        self._start(job, placed.pool)
        return True

    def _wait(self, job: Job) -> None:
        if self.policy == "fifo":
            heapq.heappush(self._fifo, (job.arrival, job.id))
            return
        key = (job.priority, job.team, job.ranked, tuple(job.held[p] for p in job.ranked))
        group = self._groups.setdefault(key, deque())
        # A preempted job goes back in its place by arrival, ahead of later ones.
        if group and group[-1].arrival > job.arrival:
            ordered = sorted([*group, job], key=lambda j: (j.arrival, j.id))
            group.clear()
            group.extend(ordered)  # in place: a pass may hold this deque
        else:
            group.append(job)

    def _pass(self) -> None:
        """Capacity came free somewhere: start what waits, in the order capacity goes to it."""
        if self.policy == "fifo":
            while self._fifo:
                if not self._try(self.jobs[self._fifo[0][1]]):
                    return
                heapq.heappop(self._fifo)
            return
        # Waiting groups in admission's `order` of their heads: the team furthest below its fair
        # share first, then priority within a team, then the oldest.
        while True:
            started = False
            heads = {group[0].id: key for key, group in self._groups.items() if group}
            requests = [Request(i, self.jobs[i].team, 0, self.jobs[i].priority, self.jobs[i].arrival) for i in heads]
            for request in order(requests, self.queues.values()):
                group = self._groups[heads[request.id]]
                while group and self._try(group[0]):
                    group.popleft()
                    started = True
                if started:
                    break  # shares changed: order again
            if not started:
                if self.move_min_hours is not None:
                    self._move_back()
                return

    def _move_back(self) -> None:
        """What waits has started: committed GPUs still idle take work running on costlier pools
        of its plan (the product's rule, `moves.better_pool`), the longest left first."""
        if not any(self.queues[p].free > 0 for p in self.committed):
            return
        for job in sorted(self._running_on_all(), key=lambda j: (j.hours - j.done, j.id), reverse=True):
            left = job.hours - job.done - max(0.0, self.now - job.started - job.restart)
            if left < self.move_min_hours or job.pool in self.committed:
                continue
            requests = {p: Request(job.id, job.team, job.held[p], job.priority, job.arrival) for p in job.ranked}
            target = better_pool(job.ranked, job.pool, self.committed, lambda p: self.queues[p].decide(requests[p]))
            if target is None:
                continue
            self._stop(job, cause="moved", notice=True)
            for group in self._groups.values():
                if job in group:
                    group.remove(job)
            self.queues[target].admit(requests[target], self.queues[target].decide(requests[target]))
            self._start(job, target)

    def _running_on_all(self) -> list[Job]:
        return [job for pool in self._running_on.values() for job in pool.values()]

    def _start(self, job: Job, pool: str) -> None:
        job.pool, job.started = pool, self.now
        if job.first_start is None:
            job.first_start = self.now
        job.restart = RESTART_HOURS if job.done > 0 else 0.0  # held, not work
        job.token += 1
        self._running_on[pool][job.id] = job
        self._push(self.now + job.restart + (job.hours - job.done), "finish", (job.id, job.token))

    def _book(self, job: Job, ran: float, *, kept: bool, lost_cause: str = "") -> None:
        """Account for `ran` hours of `job` on its pool since `started`: all its work when `kept`,
        else less what it did since its last periodic checkpoint (redone after it resumes)."""
        gpus, key = job.held[job.pool], (job.team, job.pool)
        self.ledger.add(self.ledger.held, key, gpus * ran)
        work = max(0.0, ran - job.restart)
        lost = 0.0 if kept else work % job.checkpoint_hours
        job.done += work - lost
        self.ledger.add(self.ledger.productive, key, gpus * (work - lost))
        if lost:
            self.ledger.lost[lost_cause] = self.ledger.lost.get(lost_cause, 0.0) + gpus * lost

    def _release(self, job: Job) -> None:
        self.queues[job.pool].release(job.id)
        del self._running_on[job.pool][job.id]
        job.pool = None
        job.token += 1

    def _finish(self, job: Job) -> None:
        self._book(job, self.now - job.started, kept=True)
        job.done, job.finished = job.hours, self.now
        self._release(job)
        self._pass()

    def _stop(self, job: Job, *, cause: str, notice: bool) -> None:
        """Preempt `job`: with notice it checkpoints first (the notice → checkpoint → resume path)."""
        ran = self.now - job.started
        if notice:  # it writes a checkpoint in the notice: held, not work
            self._book(job, ran, kept=True)
            key = (job.team, job.pool)
            self.ledger.add(self.ledger.held, key, job.held[job.pool] * job.checkpoint_write_hours)
            self.ledger.lost[cause] = self.ledger.lost.get(cause, 0.0) + job.held[job.pool] * job.checkpoint_write_hours
        else:
            self._book(job, ran, kept=False, lost_cause=cause)
        job.preemptions += 1
        self.stops += 1
        self._release(job)
        self._wait(job)

    def _interrupt(self, cut: Interruption) -> None:
        """The spot provider takes `cut.gpus` back: the newest jobs there stop until the rest fit."""
        gpus = min(cut.gpus, self.capacity[cut.pool])
        self.capacity[cut.pool] -= gpus
        queue = self.queues[cut.pool]
        queue.capacity -= gpus
        for job in sorted(self._running_on[cut.pool].values(), key=lambda j: -j.started):
            if queue.free >= 0:
                break
            self._stop(job, cause="spot", notice=job.checkpoint_write_hours <= cut.notice_hours)
        self._push(self.now + cut.hours, "restore", (cut.pool, gpus))
        self._pass()
