"""The greedy placement: steps one at a time, each on the cheapest pool that still has room.

The fast path of the job planner (and its starting point): a step takes the cheapest allowed pool
with quota room during its run (on a 15-minute grid) at its true cost given what is left of each
commitment. Candidates are looked at cheapest first by their cost with the whole commitment left,
a lower bound of the true cost, so a step usually looks at one or two pools, not all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from control_plane.placement.cost_model import Assessment

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
        """The grid of an assessment (worked out once per assessment)."""
        if "_grid" not in a.__dict__:
            a.__dict__["_grid"] = cls._of(a)
        return a.__dict__["_grid"]

    @classmethod
    def _of(cls, a: Assessment) -> Grid:
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
    """(base cost without any commitment [S, P], saving per covered GPU-hour [P], commitment [P]).

    Worked out once per assessment; callers must not change the arrays."""
    if "_commitment_terms" not in a.__dict__:
        a.__dict__["_commitment_terms"] = _commitment_terms(a)
    return a.__dict__["_commitment_terms"]


def _commitment_terms(a: Assessment) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
    less data, then to the pool's name. Each step first looks at its few cheapest pools without a
    commitment (ranked for all steps at once) and the pools whose commitment is not used up yet;
    only when none of those settles it does it rank every pool.
    """
    S, P = allowed.shape
    grid = Grid.of(a)
    usage = np.zeros((P, grid.horizon))
    base, saving, left = commitment_terms(a)
    left = left.copy()
    by_name = name_rank(a)
    budget = np.array(
        [s.budget_usd if s.budget_usd is not None else np.inf for s in a.steps]
    )
    active = np.flatnonzero(left > 0)  # pools whose commitment is not used up
    is_active = left > 0
    masked = np.where(allowed, base if score is None else score, np.inf)
    few = _ranked_few(masked, a.moved_gb, by_name)
    choice = np.full(S, -1)
    covered = np.zeros(S)
    for i in order:
        cc = active[allowed[i, active]] if score is None else active[:0]
        cover = np.minimum(a.gpu_hours[i, cc], left[cc])
        j = -1
        if budget[i] == np.inf:
            j = _among(
                i,
                few[i],
                masked[i],
                cc,
                base[i, cc] - saving[cc] * cover,
                is_active,
                a.moved_gb[i],
                by_name,
                usage,
                grid,
            )
        if j == -2 or budget[i] < np.inf:  # the few did not settle it: rank every pool
            key = masked[i].copy()
            key[cc] -= saving[cc] * cover
            if budget[i] < np.inf:
                true = base[i].copy()
                true[cc] -= saving[cc] * cover
                key[true > budget[i]] = np.inf
            j = _cheapest_with_room(i, key, a.moved_gb[i], by_name, usage, grid)
        if j < 0:
            continue
        choice[i] = j
        usage[j, grid.s0[i] : grid.s1[i, j]] += grid.held[i, j]
        hit = np.flatnonzero(cc == j)
        if hit.size:
            covered[i] = cover[hit[0]]
            left[j] -= covered[i]
            if left[j] <= 0:
                active = active[active != j]
                is_active[j] = False
    return Placed(choice, covered, list(order))


def _ranked_few(
    masked: np.ndarray, moved: np.ndarray, by_name: np.ndarray
) -> np.ndarray:
    """Per step, its LOOK_FIRST cheapest allowed pools in rank order (-1 pads a step with fewer)."""
    S, P = masked.shape
    k = min(LOOK_FIRST, P)
    top = (
        np.argpartition(masked, k - 1, axis=1)[:, :k]
        if P > k
        else np.tile(np.arange(P), (S, 1))
    )
    rows = np.repeat(np.arange(S), top.shape[1])
    flat = top.ravel()
    key = masked[rows, flat]
    order = np.lexsort((by_name[flat], moved[rows, flat], np.round(key, 6), rows))
    top = flat[order].reshape(S, -1)
    return np.where(np.isfinite(masked[np.arange(S)[:, None], top]), top, -1)


def _among(i, few, row, cc, cc_cost, is_active, moved, by_name, usage, grid) -> int:
    """The pick among step i's few cheapest pools and the pools with commitment left: the pool, -1
    if step i fits no pool at all, or -2 if the few cannot settle it (rank every pool)."""
    few = few[few >= 0]
    if not few.size:
        return -1
    if cc.size:
        plain = few[
            ~is_active[few]
        ]  # the few without a commitment left (those with one are in cc)
        cands = np.concatenate([plain, cc])
        keys = np.concatenate([row[plain], cc_cost])
        rounded = np.round(keys, 6)
        ranked = cands[np.lexsort((by_name[cands], moved[cands], rounded))]
        rounded = np.sort(rounded)
    else:
        ranked, rounded = few, None
    edge = round(float(row[few[-1]]), 6)  # pools outside the few cost at least this
    s0 = grid.s0[i]
    for r, j in enumerate(ranked):
        if usage[j, s0 : grid.s1[i, j]].max() + grid.held[i, j] <= grid.quota[j]:
            key = round(float(row[j]), 6) if rounded is None else rounded[r]
            if few.size == LOOK_FIRST and key >= edge:
                return -2  # a pool outside the few may tie with it or beat it
            return int(j)
    return -2 if few.size == LOOK_FIRST else -1


def _cheapest_with_room(
    i: int,
    key: np.ndarray,
    moved: np.ndarray,
    by_name: np.ndarray,
    usage: np.ndarray,
    grid: Grid,
) -> int:
    """The cheapest pool (by `key`; ties: less data moved, then name) with quota room for step i; -1: none."""
    s0 = grid.s0[i]
    look = np.flatnonzero(np.isfinite(key))
    for j in look[np.lexsort((by_name[look], moved[look], np.round(key[look], 6)))]:
        if usage[j, s0 : grid.s1[i, j]].max() + grid.held[i, j] <= grid.quota[j]:
            return int(j)
    return -1


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
