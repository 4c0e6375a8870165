"""A discrete-event simulation of data-parallel gangs on a fleet of fast domains (NVLink racks),
placed topology-aware or topology-blind; each gang's step time from the all-reduce model
(`control_plane/placement/links.py`, `split_cost`) with the layout it actually got.

Time is in hours. The fleet is `racks × per_rack` nodes, numbered rack by rack; a gang holds
whole nodes. A gang's run is `steps × step_seconds`, where the step time follows from the devices
it holds in each rack (`groups`): in one rack it is the one-domain step; split, the hierarchical
all-reduce crosses the slower network and the smallest group sets the pace. Nothing is
preempted; every gang that reaches the scheduler runs to its end.

One queue, arrival order, EASY backfill (Slurm's `sched/backfill`): the oldest gang that cannot
start gets a reservation (the nodes it would get, by this policy, once enough running gangs have
ended, and when); a later gang starts now if it fits on the nodes that reservation leaves, or
anywhere if it ends before the reserved start. Run times are known exactly here (Slurm goes by
time limits). Policies (`POLICIES`), which differ only in where a gang goes:

- `blind`: the scheduler sees free node counts only: a gang takes the first free nodes in node
  order (Slurm's select/cons_tres without topology/tree, or `--switches`), whatever racks those
  are, whether its spec allows a split or not.
- `aware`: what Slurm's topology/tree with `--switches` and Kueue's topology-aware scheduling do:
  a gang that fits one rack goes into one rack, best fit (the rack with the fewest free nodes
  that still holds it), or waits; a gang bigger than a rack that may span (`span`) goes over the
  fewest racks its size needs (`ceil(nodes / per_rack)`), as evenly as their free nodes allow,
  or waits; one that may not span is never placed (the planner refuses it first: `Gang.refused`).
- `aware-nowait`: as `aware`, but a gang that may span and finds no room where `aware` would
  wait is split over the fewest racks that hold it now.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from control_plane.placement.links import Split, split_cost

POLICIES = ("blind", "aware", "aware-nowait")


@dataclass
class Gang:
    """One data-parallel training step as the simulation runs it."""

    id: str
    arrival: float  # hours
    nodes: int
    gpus_per_node: int
    span: bool  # `span_domains`: may be split across racks when it does not fit one
    allreduce_gb: float  # gradients all-reduced per step
    compute_seconds: float  # compute per step, communication left out
    steps: int  # the work
    refused: str | None = None  # the planner's reason; a refused gang never reaches the scheduler
    # Runtime state
    start: float | None = None
    finish: float | None = None
    racks: tuple[int, ...] = ()  # nodes held in each rack it uses
    split: Split | None = None

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def useful_gpu_hours(self) -> float:
        """Its work at the one-domain step time: the same whichever the policy."""
        assert self.split is not None
        return self.gpus * self.steps * self.split.step_seconds_one / 3600

    @property
    def held_gpu_hours(self) -> float:
        assert self.split is not None
        return self.gpus * self.steps * self.split.step_seconds / 3600


# Placement: `free` is bool [racks, per_rack]; each returns the flat node indices taken, or None.
def first_free(free: np.ndarray, n: int) -> np.ndarray | None:
    """The first `n` free nodes in node order, whichever racks they are in."""
    nodes = np.flatnonzero(free)
    return nodes[:n] if nodes.size >= n else None


def best_fit_rack(free: np.ndarray, n: int) -> np.ndarray | None:
    """`n` nodes in one rack: the rack with the fewest free nodes that still holds them."""
    counts = free.sum(axis=1)
    fits = np.flatnonzero(counts >= n)
    if not fits.size:
        return None
    rack = int(fits[np.argmin(counts[fits])])  # the first such rack on a tie
    return rack * free.shape[1] + np.flatnonzero(free[rack])[:n]


def spread(free: np.ndarray, n: int, most_racks: int | None = None) -> np.ndarray | None:
    """`n` nodes over the fewest racks that hold them (the emptiest), as evenly as their free nodes
    allow (the largest smallest group); None when that takes more than `most_racks`."""
    counts = free.sum(axis=1)
    order = np.argsort(-counts, kind="stable")
    held = np.cumsum(counts[order])
    if held[-1] < n:
        return None
    d = int(np.searchsorted(held, n)) + 1
    if most_racks is not None and d > most_racks:
        return None
    chosen = sorted(order[:d], key=lambda r: (counts[r], r))  # smallest room first
    taken, left = [], n
    for k, rack in enumerate(chosen):
        take = min(int(counts[rack]), math.ceil(left / (d - k)))
        taken.append(rack * free.shape[1] + np.flatnonzero(free[rack])[:take])
        left -= take
    return np.sort(np.concatenate(taken))


def place(policy: str, free: np.ndarray, gang: Gang) -> np.ndarray | None:
    """Where `policy` puts `gang` on the `free` nodes now; None: it waits."""
    per_rack, n = free.shape[1], gang.nodes
    if policy == "blind":
        return first_free(free, n)
    if n <= per_rack:
        nodes = best_fit_rack(free, n)
        if nodes is None and policy == "aware-nowait" and gang.span:
            nodes = spread(free, n)
        return nodes
    if not gang.span:
        return None  # must sit in one rack and no rack holds it
    return spread(free, n, None if policy == "aware-nowait" else math.ceil(n / per_rack))


class Simulation:
    """One policy over one fleet and one stream of gangs, run until every placed gang has ended."""

    def __init__(
        self, policy: str, racks: int, per_rack: int, inside_gb_per_s: float, cross_gb_per_s: float, gangs: Iterable[Gang],
    ):
        if policy not in POLICIES:
            raise ValueError(f"no policy {policy!r}; the policies: {', '.join(POLICIES)}")
        self.policy, self.per_rack = policy, per_rack
        self.inside, self.cross = inside_gb_per_s, cross_gb_per_s
        self.free = np.ones((racks, per_rack), dtype=bool)
        self.gangs = {g.id: g for g in gangs}
        self.waiting: list[Gang] = []  # arrival order
        self.running: dict[str, np.ndarray] = {}  # id -> flat node indices held
        self._ends: dict[str, float] = {}  # id -> when it ends
        self.now = 0.0
        self._events: list = []
        self._seq = itertools.count()
        for gang in self.gangs.values():
            if gang.refused is None:
                self._push(gang.arrival, "arrive", gang.id)

    def _push(self, at: float, kind: str, gang_id: str) -> None:
        heapq.heappush(self._events, (at, next(self._seq), kind, gang_id))

    def run(self) -> Simulation:
        while self._events:
            self.now, _, kind, gang_id = heapq.heappop(self._events)
            gang = self.gangs[gang_id]
            if kind == "arrive":
                self.waiting.append(gang)
            else:
                self.free.flat[self.running.pop(gang_id)] = True
                gang.finish = self.now
            self._pass()
        return self

    def layout(self, gang: Gang, nodes: np.ndarray) -> tuple[tuple[int, ...], Split]:
        """Nodes held per rack, and the step time by the all-reduce model with those groups."""
        per_rack = np.bincount(nodes // self.per_rack)
        racks = tuple(int(k) for k in per_rack if k)
        split = split_cost(
            devices=gang.gpus, per_domain=self.per_rack * gang.gpus_per_node, gb=gang.allreduce_gb, compute_seconds=gang.compute_seconds,
            inside_gb_per_s=self.inside, cross_gb_per_s=self.cross, groups=[k * gang.gpus_per_node for k in racks],
        )  # fmt: skip
        return racks, split

    def _hours(self, gang: Gang, nodes: np.ndarray) -> float:
        return gang.steps * self.layout(gang, nodes)[1].step_seconds / 3600

    def _start(self, gang: Gang, nodes: np.ndarray) -> None:
        gang.racks, gang.split = self.layout(gang, nodes)
        gang.start = self.now
        self.free.flat[nodes] = False
        self.running[gang.id] = nodes
        self._ends[gang.id] = self.now + gang.steps * gang.split.step_seconds / 3600
        self._push(self._ends[gang.id], "finish", gang.id)

    def _reservation(self, gang: Gang) -> tuple[float, np.ndarray]:
        """When the oldest blocked gang can start as running gangs end, and on which nodes."""
        future = self.free.copy()
        ends = sorted((self._ends[i], i) for i in self.running)
        for end, gang_id in ends:
            future.flat[self.running[gang_id]] = True
            nodes = place(self.policy, future, gang)
            if nodes is not None:
                mask = np.zeros_like(future)
                mask.flat[nodes] = True
                return end, mask
        return math.inf, np.zeros_like(future)  # never, on this fleet: it holds back nobody

    def _pass(self) -> None:
        """Start what waits, in arrival order; behind the first that cannot, backfill (EASY)."""
        reserved: np.ndarray | None = None
        shadow = math.inf
        for gang in list(self.waiting):
            if reserved is None:
                nodes = place(self.policy, self.free, gang)
                if nodes is None:
                    shadow, reserved = self._reservation(gang)
                    continue
            else:
                nodes = place(self.policy, self.free & ~reserved, gang)
                if nodes is None:
                    nodes = place(self.policy, self.free, gang)
                    if nodes is None or self.now + self._hours(gang, nodes) > shadow:
                        continue
            self.waiting.remove(gang)
            self._start(gang, nodes)
