"""Local search on a job plan: moves of one step to another pool, and moves that first move
another step out of the way (an earlier step to make room, or a swap of two steps' pools).

The fallback when the integer program does not solve within its time budget, and the repair of a
greedy plan that left steps without room. A move is kept only if it places a step that had no
pool, or lowers the plan's total cost (a commitment is worth the same to every step on its pool,
so the total is Σ step costs without it − Σ pools' saving × min(commitment, GPU-hours on them)),
or, at equal cost, moves less data or goes to the pool first by name (the planner's tie rule).
Every pass is vectorised over all steps × pools; it stops when no move helps or time is up.
"""

from __future__ import annotations

import time

import numpy as np

from control_plane.placement.cost_model import Assessment
from control_plane.placement.greedy import Grid, Placed, commitment_terms, name_rank

TOL = 5e-7  # costs equal to the cent's ten-thousandth are a tie (the greedy rounds to 6 decimals)


class Search:
    """A plan being improved: choice per step, GPUs held per pool and slot, GPU-hours per pool."""

    def __init__(self, a: Assessment, choice: np.ndarray):
        self.a, self.grid = a, Grid.of(a)
        self.base, self.saving, self.committed = commitment_terms(a)
        self.choice = choice.copy()
        self.usage = self.grid.usage(self.choice)
        self.hours_on = np.zeros(len(a.pools))
        placed = np.flatnonzero(self.choice >= 0)
        np.add.at(
            self.hours_on, self.choice[placed], a.gpu_hours[placed, self.choice[placed]]
        )
        self.names = name_rank(a).astype(float)
        self.budget = np.array(
            [s.budget_usd if s.budget_usd is not None else np.inf for s in a.steps]
        )

    def tie(self, i, j):
        """The tie rule's key: less data moved, then the pool's name (numpy indexing)."""
        return self.a.moved_gb[i, j] * (len(self.a.pools) + 1) + self.names[j]

    # --- bookkeeping --------------------------------------------------------------------------

    def _used(self, j, hours):
        return self.saving[j] * np.minimum(self.committed[j], hours)

    def put(self, i: int, j: int) -> None:
        g = self.grid
        self.usage[j, g.s0[i] : g.s1[i, j]] += g.held[i, j]
        self.hours_on[j] += self.a.gpu_hours[i, j]
        self.choice[i] = j

    def take(self, i: int) -> None:
        j, g = self.choice[i], self.grid
        self.usage[j, g.s0[i] : g.s1[i, j]] -= g.held[i, j]
        self.hours_on[j] -= self.a.gpu_hours[i, j]
        self.choice[i] = -1

    def room(self, i: int, j: int) -> bool:
        g = self.grid
        return bool(
            self.usage[j, g.s0[i] : g.s1[i, j]].max() + g.held[i, j]
            <= g.quota[j] + 1e-9
        )

    def enter_cost(self, i: int, j: int) -> float:
        """What step i adds to the plan's cost on pool j (it is on no pool now)."""
        h = self.a.gpu_hours[i, j]
        return float(
            self.base[i, j]
            - (self._used(j, self.hours_on[j] + h) - self._used(j, self.hours_on[j]))
        )

    def leave_gain(self, i: int) -> float:
        """What the plan saves when step i leaves its pool."""
        j = self.choice[i]
        h = self.a.gpu_hours[i, j]
        return float(
            self.base[i, j]
            - (self._used(j, self.hours_on[j]) - self._used(j, self.hours_on[j] - h))
        )

    def total(self) -> float:
        on = np.flatnonzero(self.choice >= 0)
        return float(
            self.base[on, self.choice[on]].sum()
            - self._used(np.arange(len(self.a.pools)), self.hours_on).sum()
        )

    # --- moves ----------------------------------------------------------------------------------

    def best_pool(
        self, i: int, allowed: np.ndarray, against: float | None
    ) -> tuple[int, float] | None:
        """The cheapest pool with room for unplaced step i (ties by the tie rule), if cheaper than `against`."""
        best = None
        for j in np.flatnonzero(allowed):
            if not self.room(i, j):
                continue
            cost = self.enter_cost(i, j)
            key = (round(cost, 6), self.tie(i, j))
            if best is None or key < best[0]:
                best = (key, int(j), cost)
        if best is None or (against is not None and best[2] > against - TOL):
            return None
        return best[1], best[2]

    def move_pass(self, deadline: float = float("inf"), chunk: int = 2048) -> int:
        """Every improving single move found at once (in blocks of steps, to bound memory), then
        applied best first while each still holds."""
        a, S = self.a, len(self.a.steps)
        placed = np.flatnonzero(self.choice >= 0)
        now = self.saving * np.minimum(self.committed, self.hours_on)
        found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for lo in range(0, placed.size, chunk):
            rows = placed[lo : lo + chunk]
            cur = self.choice[rows]
            n = np.arange(rows.size)
            h = a.gpu_hours[rows]
            own = h[n, cur]
            leave = self.base[rows, cur] - (
                self._used(cur, self.hours_on[cur])
                - self._used(cur, self.hours_on[cur] - own)
            )
            delta = self.base[rows] - (
                self.saving * np.minimum(self.committed, self.hours_on + h) - now
            )
            delta -= leave[:, None]
            better = delta < -TOL
            near = np.abs(delta) <= TOL
            near[n, cur] = False
            r, c = np.nonzero(near)
            wins = self.tie(rows[r], c) < self.tie(rows[r], cur[r])
            better[r[wins], c[wins]] = True
            better &= a.feasible[rows]
            better[n, cur] = False
            r, c = np.nonzero(better)
            found.append((rows[r], c, delta[r, c]))
        if not found:
            return 0
        steps = np.concatenate([f[0] for f in found])
        pools = np.concatenate([f[1] for f in found])
        gains = np.concatenate([f[2] for f in found])
        moves = 0
        done = np.zeros(S, bool)
        for t, r in enumerate(np.argsort(gains, kind="stable")):
            i, k = int(steps[r]), int(pools[r])
            if done[i]:
                continue
            if t % 256 == 0 and time.perf_counter() > deadline:
                break
            j = int(self.choice[i])
            gain = self.leave_gain(i)
            self.take(i)
            cost = self.enter_cost(i, k) if self.room(i, k) else np.inf
            if cost - gain < -TOL or (
                abs(cost - gain) <= TOL and self.tie(i, k) < self.tie(i, j)
            ):
                self.put(i, k)
                done[i] = True
                moves += 1
            else:
                self.put(i, j)
        return moves

    def swap_pass(self, deadline: float, most: int = 1500) -> int:
        """Every improving swap of two steps' pools found at once (steps i on j, m on k: i to k, m to
        j), then applied best first while each still holds. Jobs of more than `most` steps skip it."""
        a = self.a
        placed = np.flatnonzero(self.choice >= 0)
        if placed.size < 2 or placed.size > most:
            return 0
        cur = self.choice[placed]
        I, M = placed[:, None], placed[None, :]
        J, K = cur[:, None], cur[None, :]
        hij, hik = a.gpu_hours[I, J], a.gpu_hours[I, K]
        hmj, hmk = a.gpu_hours[M, J], a.gpu_hours[M, K]
        H = self.hours_on

        def used(pool, hours):
            return self.saving[pool] * np.minimum(self.committed[pool], hours)

        delta = (self.base[I, K] - self.base[I, J]) + (
            self.base[M, J] - self.base[M, K]
        )
        delta -= used(J, H[J] - hij + hmj) - used(J, H[J])
        delta -= used(K, H[K] - hmk + hik) - used(K, H[K])
        ok = (J != K) & a.feasible[I, K] & a.feasible[M, J] & (delta < -TOL)
        ok &= np.triu(np.ones_like(ok), 1)
        r, c = np.nonzero(ok)
        if not r.size:
            return 0
        swaps = 0
        done = np.zeros(len(a.steps), bool)
        for t in np.argsort(delta[r, c], kind="stable"):
            if t % 64 == 0 and time.perf_counter() > deadline:
                break
            i, m = int(placed[r[t]]), int(placed[c[t]])
            if done[i] or done[m]:
                continue
            j, k = int(self.choice[i]), int(self.choice[m])
            before = self.total()
            self.take(i)
            self.take(m)
            if self.room(i, k):
                self.put(i, k)
                if self.room(m, j):
                    self.put(m, j)
                    if self.total() < before - TOL:
                        done[i] = done[m] = True
                        swaps += 1
                        continue
                    self.take(m)
                self.take(i)
            self.put(i, j)
            self.put(m, k)
        return swaps

    def eject(self, i: int, deadline: float) -> bool:
        """Place step i (unplaced) or move it somewhere cheaper by first moving one step out of the
        way on its target pool to another pool with room (i's old pool included)."""
        a, g = self.a, self.grid
        was = int(self.choice[i])
        gain = self.leave_gain(i) if was >= 0 else np.inf
        if was >= 0:
            self.take(i)
        targets = np.flatnonzero(a.feasible[i])
        targets = targets[np.argsort(self.base[i, targets], kind="stable")]
        for k in targets:
            if time.perf_counter() > deadline:
                break
            if (
                was >= 0
                and self.base[i, k]
                - self.saving[k] * min(self.committed[k], a.gpu_hours[i, k])
                >= gain - TOL
            ):
                break  # even with the whole commitment, k is no cheaper than where i was
            window = slice(g.s0[i], g.s1[i, k])
            overlap = np.flatnonzero(
                (self.choice == k) & (g.s0 < g.s1[i, k]) & (g.s1[:, k] > g.s0[i])
            )
            for m in overlap:
                if (
                    self.usage[k, window].max() - g.held[m, k] + g.held[i, k]
                    > g.quota[k] + 1e-9
                ):
                    continue  # taking m out is not enough
                m_gain = self.leave_gain(m)
                self.take(m)
                if not self.room(i, k):
                    self.put(m, k)
                    continue
                i_cost = self.enter_cost(i, k)
                self.put(i, k)
                elsewhere = np.array(a.feasible[m])
                elsewhere[k] = False
                spot = self.best_pool(m, elsewhere, None)
                if spot is not None and (
                    was < 0 or i_cost + spot[1] - m_gain - gain < -TOL
                ):
                    self.put(m, spot[0])
                    return True
                self.take(i)
                self.put(m, k)
        if was >= 0:
            self.put(i, was)
        return False


def improve(
    a: Assessment, placed: Placed, seconds: float, ejects: bool = True
) -> Placed:
    """The plan after local search within `seconds`: unplaced steps placed where a move makes room,
    then improving moves until none helps. Commitments are then used up in start order."""
    deadline = time.perf_counter() + seconds
    search = Search(a, placed.choice)
    for i in (
        placed.unplaced
    ):  # a step with no pool: a pool with room now, else move one out of the way
        spot = search.best_pool(i, a.feasible[i], None)
        if spot is not None:
            search.put(i, spot[0])
        elif ejects:
            search.eject(i, deadline)
    while time.perf_counter() < deadline:
        moved = search.move_pass(deadline)
        moved += search.swap_pass(deadline)
        if ejects and time.perf_counter() < deadline:
            moved += sum(search.eject(int(i), deadline) for i in _blocked(search))
        if not moved:
            break
    return fill(a, search.choice)


def _blocked(search: Search) -> list[int]:
    """Steps with a cheaper allowed pool than their own (blocked by quota): the ones an eject may help."""
    a = search.a
    placed = np.flatnonzero(search.choice >= 0)
    cur = search.choice[placed]
    lowest = np.where(a.feasible[placed], a.cost_usd[placed], np.inf).min(axis=1)
    now = search.base[placed, cur] - search.saving[cur] * np.minimum(
        search.committed[cur], a.gpu_hours[placed, cur]
    )
    return [int(i) for i in placed[lowest < now - TOL]]


def fill(a: Assessment, choice: np.ndarray, order: list[int] | None = None) -> Placed:
    """Each commitment used up by the steps on its pool in `order` (default: start time, then name)."""
    S = len(a.steps)
    if order is None:
        order = [int(i) for i in np.lexsort(([s.name for s in a.steps], a.start_hours))]
    _, _, left = commitment_terms(a)
    left = left.copy()
    covered = np.zeros(S)
    for i in order:
        j = choice[i]
        if j >= 0 and left[j] > 0:
            covered[i] = min(float(a.gpu_hours[i, j]), float(left[j]))
            left[j] -= covered[i]
    return Placed(choice.copy(), covered, order)
