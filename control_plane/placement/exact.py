"""The exact plan: the job planner's cost model as an integer program, solved by HiGHS.

Through `scipy.optimize.milp`. One binary x[i, j] per allowed (step, pool) pair, one continuous
c[i, j] ≥ 0 per pair on a pool with a commitment (the GPU-hours of that step the commitment
covers). Minimise Σ x·(price·h + egress) − Σ c·(price − marginal) subject to

- every step on exactly one pool;
- c[i, j] ≤ h[i, j]·x[i, j], and Σᵢ c[i, j] ≤ the pool's commitment;
- a step's budget: its cost on its pool ≤ `budget_usd`;
- quota: on each pool, at each slot where a step may start (the 15-minute grid of the greedy
  planner), the GPUs held by the steps running then ≤ the pool's quota (a sum of intervals peaks
  at the start of one of them, so these slots are enough).

The answer says whether HiGHS proved the plan optimal, proved that no plan places every step, or
ran out of time (then its best plan, if any, and its dual bound).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_matrix

from control_plane.placement.cost_model import Assessment
from control_plane.placement.greedy import Grid, commitment_terms

# Beyond this many allowed (step, pool) pairs the program is not even built: the planner's fast
# path plans it (building and solving one that size takes longer than the time budget).
MAX_PAIRS = 40_000


@contextlib.contextmanager
def solver_output_to_stderr() -> Iterator[None]:
    """HiGHS prints some progress lines from C++ to the process's stdout whatever its display
    option says; while it runs, stdout goes to stderr, so `sinewgrid plan --json` stays JSON."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@dataclass
class ExactResult:
    """What HiGHS found: `status` optimal / infeasible / time_limit / too_big / failed."""

    status: str
    choice: np.ndarray | None = None  # pool per step
    covered: np.ndarray | None = None  # commitment GPU-hours per step
    cost_usd: float | None = None
    dual_bound_usd: float | None = None  # no plan costs less than this
    seconds: float = 0.0
    weight: np.ndarray | None = None  # relaxed only: x per (step, pool)


@dataclass
class Relaxation:
    """The linear relaxation: a lower bound on every plan's cost, and per (step, pool) how much of the
    step the relaxed optimum puts there (a guide for rounding)."""

    bound_usd: float | None
    weight: np.ndarray | None  # [S, P]


def relaxation(a: Assessment, time_limit_s: float) -> Relaxation:
    """Solve the program with x in [0, 1] instead of {0, 1} (HiGHS's simplex, much faster)."""
    if (
        np.count_nonzero(a.feasible) > MAX_PAIRS
        or not len(a.steps)
        or np.any(~a.feasible.any(axis=1))
    ):
        return Relaxation(None, None)
    res = solve(a, time_limit_s, relaxed=True)
    return Relaxation(res.cost_usd, res.weight)


def solve(
    a: Assessment,
    time_limit_s: float,
    rel_gap: float = 1e-4,
    relaxed: bool = False,
    allowed: np.ndarray | None = None,
) -> ExactResult:
    """The cheapest plan that places every step, or why there is none in the time given. `allowed`
    narrows the pools each step may take (default: every feasible one)."""
    allowed = a.feasible if allowed is None else allowed
    started = time.perf_counter()
    S = len(a.steps)
    if np.count_nonzero(allowed) > MAX_PAIRS:
        return ExactResult("too_big")
    pairs = np.argwhere(allowed)
    if S == 0:
        return ExactResult("optimal", np.zeros(0, int), np.zeros(0), 0.0, 0.0)
    if np.any(~allowed.any(axis=1)):
        return ExactResult("infeasible", seconds=time.perf_counter() - started)
    steps, pools = pairs[:, 0], pairs[:, 1]
    n = len(pairs)
    base, saving, committed = commitment_terms(a)
    hours = a.gpu_hours[steps, pools]
    covers = np.flatnonzero(committed[pools] > 0)  # pairs whose pool has a commitment
    m = covers.size
    objective = np.concatenate([base[steps, pools], -saving[pools[covers]]])

    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    lower: list[np.ndarray] = []
    upper: list[np.ndarray] = []
    r = 0

    def block(
        row: np.ndarray,
        col: np.ndarray,
        val: np.ndarray,
        lo: np.ndarray,
        hi: np.ndarray,
    ) -> None:
        nonlocal r
        (
            rows.append(row + r),
            cols.append(col),
            vals.append(val),
            lower.append(lo),
            upper.append(hi),
        )
        r += lo.size

    block(
        steps, np.arange(n), np.ones(n), np.ones(S), np.ones(S)
    )  # each step exactly once
    if m:
        k = np.arange(m)
        block(
            np.concatenate([k, k]),
            np.concatenate([n + k, covers]),
            np.concatenate([np.ones(m), -hours[covers]]),
            np.full(m, -np.inf),
            np.zeros(m),
        )  # c ≤ h·x
        pools_with = np.unique(pools[covers])
        index = np.searchsorted(pools_with, pools[covers])
        block(
            index,
            n + k,
            np.ones(m),
            np.full(pools_with.size, -np.inf),
            committed[pools_with],
        )  # Σ c ≤ commitment
    budget = np.array(
        [s.budget_usd if s.budget_usd is not None else np.inf for s in a.steps]
    )
    limited = np.flatnonzero(np.isfinite(budget))
    if limited.size:
        where = {int(i): t for t, i in enumerate(limited)}
        in_rows = np.array([where.get(int(i), -1) for i in steps])
        on = np.flatnonzero(in_rows >= 0)
        cov_on = np.flatnonzero(in_rows[covers] >= 0)
        block(
            np.concatenate([in_rows[on], in_rows[covers[cov_on]]]),
            np.concatenate([on, n + cov_on]),
            np.concatenate(
                [base[steps[on], pools[on]], -saving[pools[covers[cov_on]]]]
            ),
            np.full(limited.size, -np.inf),
            budget[limited],
        )
    _quota_rows(a, pairs, block)

    A = csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(r, n + m),
    )
    with solver_output_to_stderr():
        res = milp(
            objective,
            constraints=LinearConstraint(A, np.concatenate(lower), np.concatenate(upper)),
            integrality=np.concatenate([np.full(n, 0 if relaxed else 1), np.zeros(m)]),
            bounds=Bounds(0, np.concatenate([np.ones(n), np.full(m, np.inf)])),
            options={
                "time_limit": max(time_limit_s - (time.perf_counter() - started), 0.1),
                "mip_rel_gap": rel_gap,
            },
        )
    seconds = time.perf_counter() - started
    bound = getattr(res, "mip_dual_bound", None)
    if res.status == 2:
        return ExactResult("infeasible", seconds=seconds)
    if res.x is None:
        return ExactResult(
            "time_limit" if res.status == 1 else "failed",
            dual_bound_usd=bound,
            seconds=seconds,
        )
    if relaxed:
        weight = np.zeros(a.feasible.shape)
        weight[steps, pools] = res.x[:n]
        return ExactResult(
            "relaxed", cost_usd=float(res.fun), seconds=seconds, weight=weight
        )
    x = res.x[:n] > 0.5
    choice = np.full(S, -1)
    choice[steps[x]] = pools[x]
    covered = np.zeros(S)
    chosen_cov = covers[x[covers]]
    covered[steps[chosen_cov]] = np.minimum(res.x[n:][x[covers]], hours[chosen_cov])
    status = "optimal" if res.status == 0 else "time_limit"
    return ExactResult(
        status,
        choice,
        covered,
        float(res.fun),
        bound if bound is not None else None,
        seconds,
    )


def _quota_rows(a: Assessment, pairs: np.ndarray, block) -> None:
    """Σ held ≤ quota on each pool at each slot where one of its candidate steps starts."""
    grid = Grid.of(a)
    steps, pools = pairs[:, 0], pairs[:, 1]
    s0, s1 = grid.s0[steps], grid.s1[steps, pools]
    held = grid.held[steps, pools]
    order = np.lexsort((s0, pools))
    r_rows, r_cols, r_vals, hi = [], [], [], []
    t = 0
    for j in np.unique(pools):
        on = order[pools[order] == j]
        if held[on].sum() <= grid.quota[j]:
            continue  # every candidate at once fits: no row needed
        for start in np.unique(s0[on]):
            active = on[(s0[on] <= start) & (s1[on] > start)]
            if held[active].sum() <= grid.quota[j]:
                continue
            (
                r_rows.append(np.full(active.size, t)),
                r_cols.append(active),
                r_vals.append(held[active]),
            )
            hi.append(grid.quota[j])
            t += 1
    if t:
        block(
            np.concatenate(r_rows),
            np.concatenate(r_cols),
            np.concatenate(r_vals),
            np.full(t, -np.inf),
            np.array(hi),
        )
