"""Each step of a finished plan against every pool, given the rest of the plan.

What the evidence and the failover order say for step i: which pools still have quota room while
it runs once every other step is where the plan put it, what i would cost there with what the other
steps leave of each commitment, and the order a failover tries them in. In a plan no single move
improves, the chosen pool comes first on its own merit. Worked out per step when asked (a range
maximum over the pools' usage, from a sparse table built once).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import numpy as np

from control_plane.placement.cost_model import Assessment
from control_plane.placement.greedy import (
    SLOT_HOURS,
    Grid,
    Placed,
    commitment_terms,
    name_rank,
)


@dataclass
class StepAgainstPools:
    failover: list[
        int
    ]  # the chosen pool first, then the other pools with room, cheapest first
    refusals: dict[
        int, str
    ]  # pool -> why it has no room (quota) or is over the step's budget
    committed_left: dict[str, float] = field(
        default_factory=dict
    )  # pool name -> GPU-hours left for this step


class GivenRest:
    def __init__(self, a: Assessment, placed: Placed):
        self.a, self.placed, self.grid = a, placed, Grid.of(a)
        self.base, self.saving, self.committed = commitment_terms(a)
        self.by_name = name_rank(a)
        usage = self.grid.usage(placed.choice)
        levels = [usage]
        width = 1
        while (
            width * 2 <= usage.shape[1]
        ):  # levels[k][:, t] = max of usage[:, t : t + 2^k]
            prev = levels[-1]
            nxt = prev.copy()
            nxt[:, :-width] = np.maximum(prev[:, :-width], prev[:, width:])
            levels.append(nxt)
            width *= 2
        self.table = np.stack(levels)
        on = np.flatnonzero(placed.choice >= 0)
        self.used = np.zeros(len(a.pools))
        np.add.at(self.used, placed.choice[on], placed.covered[on])

    def peak(self, i: int, pools: np.ndarray) -> np.ndarray:
        """The most GPUs held on each pool during step i's run there, by every step (i included)."""
        s0, s1 = self.grid.s0[i], self.grid.s1[i, pools]
        k = np.floor(np.log2(np.maximum(s1 - s0, 1))).astype(int)
        return np.maximum(self.table[k, pools, s0], self.table[k, pools, s1 - (1 << k)])

    def step(self, i: int) -> StepAgainstPools:
        a, g = self.a, self.grid
        j0 = int(self.placed.choice[i])
        cands = np.flatnonzero(a.feasible[i])
        peak = self.peak(i, cands) - np.where(cands == j0, g.held[i, cands], 0.0)
        room = peak + g.held[i, cands] <= g.quota[cands] + 1e-9
        left = (
            self.committed[cands]
            - self.used[cands]
            + np.where(cands == j0, self.placed.covered[i], 0.0)
        )
        cost = self.base[i, cands] - self.saving[cands] * np.minimum(
            a.gpu_hours[i, cands], np.maximum(left, 0.0)
        )
        budget = a.steps[i].budget_usd
        within = cost <= (budget if budget is not None else np.inf) + 1e-9
        ok = room & within
        rank = np.lexsort(
            (self.by_name[cands], a.moved_gb[i, cands], np.round(cost, 6))
        )
        failover = ([j0] if j0 >= 0 else []) + [
            int(cands[r]) for r in rank if ok[r] and cands[r] != j0
        ]
        refusals = {}
        for r in np.flatnonzero(~ok):
            j = int(cands[r])
            if j == j0:
                continue
            refusals[j] = (
                self._quota_words(i, j, peak[r])
                if not room[r]
                else f"expected cost ${cost[r]:,.2f} exceeds budget ${budget:,.2f} with what the other steps leave of the commitment"
            )
        lefts = {
            a.pools[int(j)].name: float(max(x, 0.0))
            for j, x in zip(cands, left)
            if a.pools[int(j)].committed_gpu_hours is not None
        }
        return StepAgainstPools(failover, refusals, lefts)

    def step_refusals(self, i: int) -> dict[int, str]:
        """Why each pool that fits step i has no room for it (or is over its budget), given the plan."""
        return self.step(i).refusals

    def _quota_words(self, i: int, j: int, peak: float) -> str:
        a, g = self.a, self.grid
        step = a.steps[i]
        gang = (
            " (a gang takes whole nodes)"
            if step.gang and g.held[i, j] > step.gpus
            else ""
        )
        return (
            f"quota: {peak:.0f} of {g.quota[j]:.0f} GPUs already planned on it during "
            f"{moment(a, g.s0[i] * SLOT_HOURS)} → {moment(a, g.s1[i, j] * SLOT_HOURS)}; step needs {g.held[i, j]:.0f}{gang}"
        )


def moment(a: Assessment, hours: float) -> str:
    return (a.context.epoch + dt.timedelta(hours=float(hours))).strftime(
        "%Y-%m-%d %H:%M UTC"
    )
