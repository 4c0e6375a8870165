"""When HiGHS does not prove a plan optimal within the time budget: the best plan that search finds.

Three starts, each improved by local search (`improve.py`): the greedy plan, the linear
relaxation's plan rounded (each step on the pool the relaxed optimum gives most of it, hardest
steps first), and HiGHS's own best plan if it had one. The cheapest is then improved by large
neighbourhood search for the time left: a window of steps neighbouring in time is freed, the rest
stay where they are, and HiGHS re-plans the window exactly (a small program it solves quickly);
a window's new plan is kept when it is cheaper.
"""

from __future__ import annotations

import time

import numpy as np

from control_plane.placement.cost_model import Assessment
from control_plane.placement.exact import ExactResult, Relaxation, solve
from control_plane.placement.greedy import Placed, assign, plan_cost
from control_plane.placement.improve import TOL, fill, improve

WINDOW_STEPS = (
    40  # steps freed at once: HiGHS re-plans a window this size in well under a second
)
WINDOW_SECONDS = 1.0


def rounded(a: Assessment, relaxed: Relaxation) -> Placed | None:
    """The relaxed optimum rounded: steps it splits least first, each on its heaviest pool with room."""
    if relaxed.weight is None:
        return None
    weight = relaxed.weight
    order = [int(i) for i in np.lexsort((a.start_hours, -weight.max(axis=1)))]
    score = np.where(a.feasible, -np.round(weight, 3) * 1e9 + a.cost_usd, np.inf)
    return assign(a, a.feasible, order, score=score)


def best_found(
    a: Assessment, starts: list[Placed], seconds: float, seed: int = 0
) -> Placed:
    """The cheapest plan search finds from `starts` within `seconds` (placing every step first)."""
    deadline = time.perf_counter() + seconds
    share = seconds / (2 * max(len(starts), 1))
    improved = [improve(a, s, share) for s in starts]
    best = min(improved, key=lambda p: (len(p.unplaced), plan_cost(a, p)))
    if best.unplaced:
        return best
    return windows(a, best, deadline, np.random.default_rng(seed))


def windows(
    a: Assessment, placed: Placed, deadline: float, rng: np.random.Generator
) -> Placed:
    """Large neighbourhood search: re-plan windows of steps neighbouring in time exactly, the rest fixed."""
    S = len(a.steps)
    by_start = np.argsort(a.start_hours, kind="stable")
    choice, cost = placed.choice.copy(), plan_cost(a, placed)
    while (left := deadline - time.perf_counter()) > 0.05 and S > 1:
        first = int(rng.integers(0, max(S - WINDOW_STEPS, 0) + 1))
        free = np.zeros(S, bool)
        free[by_start[first : first + WINDOW_STEPS]] = True
        allowed = np.zeros_like(a.feasible)
        allowed[free] = a.feasible[free]
        allowed[np.flatnonzero(~free), choice[~free]] = True
        found: ExactResult = solve(a, min(WINDOW_SECONDS, left), allowed=allowed)
        if found.choice is None:
            continue
        candidate = fill(a, found.choice)
        if plan_cost(a, candidate) < cost - TOL:
            choice, cost = candidate.choice, plan_cost(a, candidate)
        if S <= WINDOW_STEPS:
            break  # the window was the whole job: nothing more to re-plan
    return fill(a, choice)
