"""The greedy placement: steps one at a time, each on the cheapest pool that still has room.

The fast path of the job planner (and its starting point): a step takes the cheapest allowed pool
with quota room during its run (on a 15-minute grid) at its true cost given what is left of each
commitment. Candidates are looked at cheapest first by their cost with the whole commitment left,
a lower bound of the true cost, so a step usually looks at one or two pools, not all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shared_resources.placement.cost_model import Assessment

SLOT_HOURS = 0.25
LOOK_FIRST = 8  # candidates ranked per step before falling back to ranking them all


@dataclass
class Grid:
    """The pools' quota over time: slots per (step, pool), GPUs held, and each pool's quota."""

    s0: np.ndarray  # [S] first slot of each step
    s1: np.ndarray  # [S, P] one past its last slot on each pool
    horizon: int
    quota: np.ndarray  # [P]
    held: np.ndarray  # [S, P]

    @classmethod
    def of(cls, a: Assessment) -> Grid:
        s0 = np.maximum(np.floor(a.start_hours / SLOT_HOURS).astype(int), 0)
        with np.errstate(invalid="ignore"):
            s1 = np.where(
                np.isfinite(a.end_hours), np.ceil(a.end_hours / SLOT_HOURS), 0
            ).astype(int)
        s1 = np.maximum(s1, s0[:, None] + 1)
        horizon = int(max(s1[a.feasible].max(initial=1), s0.max(initial=0) + 1)) + 1
        s1 = np.minimum(s1, horizon)
        quota = np.array([p.total_gpus for p in a.pools], dtype=float)
        return cls(s0, s1, horizon, quota, a.held_gpus)

    def usage(self, choice: np.ndarray) -> np.ndarray:
        """GPUs held on each pool in each slot by the placed steps: float[P, horizon]."""
        P = self.quota.size
        diff = np.zeros((P, self.horizon + 1))
        placed = np.flatnonzero(choice >= 0)
        j = choice[placed]
        held = self.held[placed, j]
        np.add.at(diff, (j, self.s0[placed]), held)
        np.add.at(diff, (j, self.s1[placed, j]), -held)
        return np.cumsum(diff, axis=1)[:, : self.horizon]


def commitment_terms(a: Assessment) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(base cost without any commitment [S, P], saving per covered GPU-hour [P], commitment [P])."""
    price = np.array([p.price_per_gpu_hour for p in a.pools], dtype=float)
    marginal = np.array([p.marginal_price_per_gpu_hour for p in a.pools], dtype=float)
    committed = np.array([p.committed_gpu_hours or 0.0 for p in a.pools], dtype=float)
    base = a.cost_usd.copy()
    cols = np.flatnonzero(a.committed > 0)
    if cols.size:  # a.cost_usd counts the commitment a.committed as left: add it back
        base[:, cols] += (price - marginal)[cols] * np.minimum(
            a.gpu_hours[:, cols], a.committed[cols]
        )
    return base, price - marginal, committed


def name_rank(a: Assessment) -> np.ndarray:
    """Each pool's place in name order (the last tie-break)."""
    return np.argsort(np.argsort([p.name for p in a.pools], kind="stable"))


@dataclass
class Placed:
    """One policy's choices: pool per step (-1: none), GPU-hours of a commitment each used, the order."""

    choice: np.ndarray
    covered: np.ndarray
    order: list[int]

    @property
    def unplaced(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(self.choice < 0)]


def assign(
    a: Assessment,
    allowed: np.ndarray,
    order: list[int],
    score: np.ndarray | None = None,
) -> Placed:
    """Place steps in `order`, each on the cheapest allowed pool with quota room and within its
    budget, or on the one with the lowest `score` if given (a naive policy's own idea of cheap).

    Costs are the true ones: a commitment is used up in this order. Ties go to the pool that moves
    less data, then to the pool's name.
    """
    S, P = allowed.shape
    grid = Grid.of(a)
    usage = np.zeros((P, grid.horizon))
    base, saving, left = commitment_terms(a)
    left = left.copy()
    by_name = name_rank(a)
    key = a.cost_usd if score is None else score
    ranked = np.where(allowed, key, np.inf)
    first = (
        np.argpartition(ranked, LOOK_FIRST - 1, axis=1)[:, :LOOK_FIRST]
        if P > LOOK_FIRST
        else np.tile(np.arange(P), (S, 1))
    )
    budget = np.array(
        [s.budget_usd if s.budget_usd is not None else np.inf for s in a.steps]
    )
    choice = np.full(S, -1)
    covered = np.zeros(S)
    for i in order:
        s0 = grid.s0[i]
        best: tuple | None = None
        few = first[i][np.isfinite(ranked[i, first[i]])]
        for look in (few, None):
            if (
                look is None
            ):  # the cheapest few did not settle it: rank every other allowed pool
                if best is not None and _beyond(ranked[i], few, best[0]):
                    break
                look = np.flatnonzero(allowed[i])
                look = look[~np.isin(look, few)]
            done = False
            for j in look[
                np.lexsort(
                    (by_name[look], a.moved_gb[i, look], np.round(ranked[i, look], 6))
                )
            ]:
                lower = round(float(ranked[i, j]), 6)
                if best is not None and (score is not None or lower > best[0]):
                    done = True  # true cost ≥ the lower bound: nothing further can beat `best`
                    break
                if usage[j, s0 : grid.s1[i, j]].max() + grid.held[i, j] > grid.quota[j]:
                    continue
                c = min(float(a.gpu_hours[i, j]), float(left[j]))
                true = float(base[i, j]) - saving[j] * c
                if true > budget[i]:
                    continue
                rank = (
                    round(true, 6) if score is None else lower,
                    float(a.moved_gb[i, j]),
                    int(by_name[j]),
                )
                if best is None or rank < best[:3]:
                    best = (*rank, int(j), c)
            if done:
                break
        if best is None:
            continue
        j, c = best[3], best[4]
        choice[i], covered[i] = j, c
        usage[j, s0 : grid.s1[i, j]] += grid.held[i, j]
        left[j] -= c
    return Placed(choice, covered, list(order))


def _beyond(row: np.ndarray, first: np.ndarray, best: float) -> bool:
    """Whether every pool not among the first few costs more than `best` (so none need a look)."""
    finite = row[first][np.isfinite(row[first])]
    return finite.size > 0 and round(float(finite.max()), 6) > best


def regret_order(a: Assessment) -> list[int]:
    """Hardest steps first: largest gap between best and second-best cost, then most GPU-hours."""
    S, P = a.feasible.shape
    cost = np.where(a.feasible, a.cost_usd, np.inf)
    two = (
        np.partition(cost, 1, axis=1)[:, :2]
        if P >= 2
        else np.hstack([cost, np.full((S, 1), np.inf)])
    )
    two = np.sort(two, axis=1)
    with np.errstate(invalid="ignore"):
        regret = np.where(np.isinf(two[:, 1]), np.inf, two[:, 1] - two[:, 0])
    best_hours = np.where(a.feasible, a.gpu_hours, 0).max(axis=1, initial=0)
    return [
        int(i)
        for i in np.lexsort(
            (a.start_hours, -best_hours, -np.nan_to_num(regret, posinf=1e18))
        )
    ]


def size_order(a: Assessment) -> list[int]:
    """Biggest steps first (GPUs, then GPU-hours): packs tight quotas better than cost regret."""
    gpus = np.array([max(s.gpus, 1) for s in a.steps])
    best_hours = np.where(a.feasible, a.gpu_hours, 0).max(axis=1, initial=0)
    return [int(i) for i in np.lexsort((a.start_hours, -best_hours, -gpus))]


def plan_cost(a: Assessment, placed: Placed) -> float:
    """What the placed steps cost, commitments used as recorded."""
    base, saving, _ = commitment_terms(a)
    on = np.flatnonzero(placed.choice >= 0)
    j = placed.choice[on]
    return float(base[on, j].sum() - (saving[j] * placed.covered[on]).sum())


def greedy(a: Assessment) -> Placed:
    """Place every step greedily, hardest first (cost regret); when that leaves a step without
    quota room, try again biggest first and keep whichever places more steps (then the cheaper)."""
    result = assign(a, a.feasible, regret_order(a))
    if result.unplaced:
        other = assign(a, a.feasible, size_order(a))
        if (len(other.unplaced), plan_cost(a, other)) < (
            len(result.unplaced),
            plan_cost(a, result),
        ):
            result = other
    return result
