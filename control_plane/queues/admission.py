"""Admission: may a team's step start on a pool now, and if not, why, or whom does it preempt.

`PoolQueue` holds one pool's admitted work and decides for each new request, by the quotas
catalog (control_plane/catalog/quotas.py), the way Kueue's ClusterQueues in a cohort do:

1. **Within its nominal quota** the team is admitted when the pool has the GPUs free; when it does
   not, the GPUs it lent are **reclaimed**: running work of teams that borrow (over their own
   nominal) is preempted, lowest priority and newest first, until the request fits; failing that,
   the team's own lower-priority work is preempted.
2. **Past its nominal quota** the team borrows, only inside its cohort and within its
   `borrowing_limit`: from the pool's unassigned GPUs and the idle quota the cohort's other teams
   lend (up to their `lending_limit`). Idle quota of teams outside the cohort, and the part a team
   keeps back, are not lent. Borrowing never preempts: the request waits.
3. A gang is all or nothing: its GPUs are admitted together or it waits.

A request that cannot start waits with a reason a person can read. `order` puts waiting requests
in the order capacity goes to them, as Kueue's fair sharing does: on a pool, work within its
team's nominal quota before work that would borrow; across teams, the team furthest below its
fair share first (its GPUs in use over its nominal quota, across the pools, divided by
its weight); within a team, by priority class, then arrival.

Pure and deterministic: the compute resource asks it for real steps, and the fleet simulation
(benchmarks) drives the same code.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from control_plane.catalog.quotas import Quotas


@dataclass(frozen=True)
class Request:
    """A step asking for GPUs on a pool: whose, how many, how urgent, since when."""

    id: str
    team: str
    gpus: int
    priority: int = 0
    arrived: float = 0.0


@dataclass(frozen=True)
class Decision:
    admitted: bool
    reason: str
    borrowed: int = 0  # GPUs past the team's nominal quota, borrowed from its cohort
    preempt: tuple[str, ...] = ()  # admitted requests to preempt first (they checkpoint and resume)


@dataclass
class PoolQueue:
    """One pool's admitted requests, and the decisions for new ones. Change what runs only through
    `add`, `admit` and `release`: they keep the per-team totals every decision reads."""

    pool: str
    capacity: int
    quotas: Quotas
    running: dict[str, Request] = field(default_factory=dict)
    _used: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for request in self.running.values():
            self._used[request.team] = self._used.get(request.team, 0) + request.gpus

    def add(self, request: Request) -> None:
        """Count `request` as running (admitted earlier, or found running on the engine)."""
        self.release(request.id)
        self.running[request.id] = request
        self._used[request.team] = self._used.get(request.team, 0) + request.gpus

    # What is in use ---------------------------------------------------------------------------
    def used(self, team: str) -> int:
        return self._used.get(team, 0)

    @property
    def free(self) -> int:
        return self.capacity - sum(self._used.values())

    def nominal(self, team: str) -> int:
        return self.quotas.quota(self.pool, team).gpus

    def borrowed(self, team: str) -> int:
        return max(0, self.used(team) - self.nominal(team))

    def share(self, team: str) -> float:
        """How much of its nominal quota `team` uses, over its fair-share weight (lower: served first)."""
        weight = self.quotas.teams[team].weight if team in self.quotas.teams else 1.0
        return self.used(team) / max(self.nominal(team), 1) / weight

    def lendable(self, team: str) -> int:
        """Free GPUs `team` may borrow: the pool's free GPUs less the idle quota others keep back
        (all of it for a team outside `team`'s cohort, the part past `lending_limit` within it)."""
        cohort = self.quotas.cohort_of(team)
        if cohort is None:
            return 0
        kept = 0
        for other, quota in self.quotas.quotas.get(self.pool, {}).items():
            if other == team:
                continue
            idle = max(0, quota.gpus - self.used(other))
            lent = quota.gpus if quota.lending_limit is None else quota.lending_limit
            kept += idle if self.quotas.cohort_of(other) != cohort else min(idle, quota.gpus - lent)
        return max(0, self.free - kept)

    # Deciding --------------------------------------------------------------------------------
    def decide(self, request: Request) -> Decision:
        where = f"pool {self.pool}"
        if request.gpus > self.capacity:
            return Decision(False, f"needs {request.gpus} GPUs at once; {where} has {self.capacity} in all: it never fits here")
        team, nominal, used = request.team, self.nominal(request.team), self.used(request.team)
        if used + request.gpus <= nominal:
            if request.gpus <= self.free:
                return Decision(True, f"within team {team}'s quota on {where} ({used + request.gpus} of {nominal} GPUs)")
            victims = self._reclaim(request) or self._within_team(request)
            if victims:
                return Decision(True, f"team {team}'s quota on {where}: preempts {', '.join(victims)} to take its GPUs back", preempt=tuple(victims))
            return Decision(False, f"team {team}'s quota on {where} is held by work it may not preempt ({self._holders()}); waits for it to end")
        over = used + request.gpus - nominal
        quota = self.quotas.quota(self.pool, team)
        if self.quotas.cohort_of(team) is None:
            return Decision(False, f"team {team} uses {used} of its {nominal} GPUs on {where} and is in no cohort to borrow from; waits for its own work to end")
        if quota.borrowing_limit is not None and over > quota.borrowing_limit:
            return Decision(False, f"team {team} would borrow {over} GPUs on {where}, past its borrowing limit of {quota.borrowing_limit}; waits")
        lendable = self.lendable(team)
        if request.gpus <= lendable:
            return Decision(True, f"team {team} borrows {over} GPUs on {where} from its cohort ({lendable} free to lend)", borrowed=over)
        victims = self._within_team(request)
        if victims:
            return Decision(True, f"team {team} preempts its own lower-priority {', '.join(victims)} on {where}", preempt=tuple(victims))
        return Decision(False, f"team {team} would borrow {over} GPUs on {where}; its cohort has {lendable} free to lend ({self._holders()}); waits")

    def admit(self, request: Request, decision: Decision) -> None:
        """Record an admitted request (after its decision's preemptions)."""
        if not decision.admitted:
            raise ValueError(f"{request.id} was not admitted: {decision.reason}")
        for victim in decision.preempt:
            self.release(victim)
        self.add(request)

    def release(self, request_id: str) -> None:
        gone = self.running.pop(request_id, None)
        if gone is not None:
            self._used[gone.team] -= gone.gpus

    # Preemption --------------------------------------------------------------------------------
    def _reclaim(self, request: Request) -> list[str]:
        """Borrowers' work to preempt so `request`, within its team's nominal quota, fits."""
        borrowed = {t: self.borrowed(t) for t in {r.team for r in self.running.values()} if t != request.team}
        candidates = sorted((r for r in self.running.values() if borrowed.get(r.team, 0) > 0), key=lambda r: (r.priority, -r.arrived, r.id))
        return self._enough(request, candidates, borrowed)

    def _within_team(self, request: Request) -> list[str]:
        """The team's own lower-priority work to preempt so `request` fits."""
        candidates = sorted((r for r in self.running.values() if r.team == request.team and r.priority < request.priority), key=lambda r: (r.priority, -r.arrived, r.id))
        return self._enough(request, candidates, None)

    def _enough(self, request: Request, candidates: list[Request], borrowed: dict[str, int] | None) -> list[str]:
        free, victims = self.free, []
        for victim in candidates:
            if free >= request.gpus:
                break
            if borrowed is not None:  # reclaim only what is borrowed: a team is never pushed below its quota
                if borrowed[victim.team] <= 0:
                    continue
                borrowed[victim.team] -= victim.gpus
            victims.append(victim.id)
            free += victim.gpus
        return victims if free >= request.gpus else []

    def _holders(self) -> str:
        teams = sorted({r.team for r in self.running.values()})
        return ", ".join(f"{t} {self.used(t)}/{self.nominal(t)}" for t in teams) or "nothing running"


@dataclass(frozen=True)
class Placed:
    """Where a step may start now, by its plan and the pools' queues (`choose`)."""

    pool: str | None  # None: no pool of its plan admits it now; it waits
    decision: Decision | None
    refusals: dict[str, str]  # pool -> why it did not take the step (every pool tried before it)


def choose(decisions: Iterable[tuple[str, Decision]]) -> Placed:
    """The pool a step starts on, from admission's decision on each pool of its plan (best first;
    a generator, so pools past the first that admits are never asked): the first that admits it
    without preempting anything; else the first that admits it by preempting (a team taking back
    its quota, or its own lower-priority work); else none, with each pool's reason. Like Kueue's
    flavor fungibility (`whenCanPreempt: TryNextFlavor`): preempting is the last resort, since the
    victims lose a checkpoint's write and a restart."""
    refusals: dict[str, str] = {}
    preempting: tuple[str, Decision] | None = None
    for pool, decision in decisions:
        if decision.admitted and not decision.preempt:
            return Placed(pool, decision, refusals)
        if decision.admitted and preempting is None:
            preempting = (pool, decision)
        else:
            refusals[pool] = decision.reason
    if preempting is not None:
        return Placed(preempting[0], preempting[1], refusals)
    return Placed(None, None, refusals)


def fleet_share(queues: Iterable[PoolQueue], team: str) -> float:
    """`team`'s GPUs in use over its nominal quota across `queues`, over its fair-share weight."""
    used = nominal = 0
    weight = 1.0
    for queue in queues:
        used, nominal = used + queue.used(team), nominal + queue.nominal(team)
        weight = queue.quotas.teams[team].weight if team in queue.quotas.teams else 1.0
    return used / max(nominal, 1) / weight


def order(waiting: Iterable[Request], queues: Iterable[PoolQueue], on: PoolQueue | None = None) -> list[Request]:
    """Waiting requests in the order capacity goes to them: on pool `on`, requests within their
    team's nominal quota there before those that would borrow (as Kueue does); then the team
    furthest below its fair share; within a team, higher priority first; then arrival."""
    queues, waiting = list(queues), list(waiting)
    shares = {team: fleet_share(queues, team) for team in {r.team for r in waiting}}

    def borrows(r: Request) -> bool:
        return on is not None and on.used(r.team) + r.gpus > on.nominal(r.team)

    return sorted(waiting, key=lambda r: (borrows(r), shares[r.team], -r.priority, r.arrived, r.id))
