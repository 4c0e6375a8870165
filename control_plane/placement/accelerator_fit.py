"""Where a step's code can run, how fast, and how its gang fits a pool's fast domains: the
matrices the cost model (`cost_model.assess`) takes from each step's `runs_on` and shape.

Worked out once per distinct (what the step runs on, the pool's accelerator), so a job of
10,000 steps over 500 pools costs a few hundred lookups, not five million.
"""

from __future__ import annotations

import math

import numpy as np

from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.placement.links import Split, split_cost


def _runs_on_key(step: StepSpec) -> tuple | None:
    return None if step.runs_on is None else tuple(sorted((k, v.throughput, v.needs_porting) for k, v in step.runs_on.items()))


def code_fit(steps: list[StepSpec], pools: list[Pool]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(refused: the code does not run on the pool's accelerator, refused: it would need porting,
    throughput [S, P] relative to the step's reference; 1 where refused)."""
    S, P = len(steps), len(pools)
    if all(s.runs_on is None for s in steps) and all(p.family in ("nvidia", "local", "cpu") for p in pools):
        none = np.zeros((S, P), dtype=bool)
        return none, none, np.ones((1, 1))
    accelerators = sorted({p.accelerator for p in pools})
    col = {a: k for k, a in enumerate(accelerators)}
    pool_cols = np.array([col[p.accelerator] for p in pools])
    rows: dict[tuple | None, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    keys = []
    for step in steps:
        key = _runs_on_key(step)
        keys.append(key)
        if key in rows:
            continue
        found = [step.support_on(a) for a in accelerators]
        rows[key] = (
            np.array([s is None for s in found]),
            np.array([s is not None and s.needs_porting for s in found]),
            np.array([s.throughput if s is not None else 1.0 for s in found]),
        )
    index = {k: n for n, k in enumerate(rows)}
    stacked = [np.vstack([r[m] for r in rows.values()]) for m in range(3)]
    which = np.array([index[k] for k in keys], dtype=int)
    unsupported, porting, throughput = (m[which][:, pool_cols] for m in stacked)
    return unsupported, porting & ~unsupported, throughput.astype(float)


def whole_domain_gpus(steps: list[StepSpec], pools: list[Pool]) -> tuple[np.ndarray, np.ndarray]:
    """Pools that sell whole domains only (TPU slices), and what each step holds on them:
    as many whole slices as its nodes (or its chips) need. ([cols], [S, len(cols)])."""
    cols = np.array([j for j, p in enumerate(pools) if p.topology is not None and p.topology.whole_domains], dtype=int)
    if not cols.size:
        return cols, np.zeros((len(steps), 0))
    held = np.zeros((len(steps), cols.size))
    for k, j in enumerate(cols):
        pool = pools[j]
        per_node = max(pool.gpus_per_node, 1)
        for i, s in enumerate(steps):
            hosts = max(s.nodes, math.ceil(s.gpus / per_node))
            held[i, k] = math.ceil(hosts / pool.domain_nodes) * pool.domain_gpus
    return cols, held


def split_gangs(steps: list[StepSpec], pools: list[Pool], split: np.ndarray, throughput: np.ndarray) -> dict[tuple[int, int], Split]:
    """How each gang that may span domains (`split`: bool [S, P]) lays over a pool's domains, and
    its step time by the all-reduce model, beside one domain's."""
    out: dict[tuple[int, int], Split] = {}
    for i, j in np.argwhere(split):
        step, pool = steps[i], pools[j]
        per_node = math.ceil(step.gpus / step.nodes) or pool.gpus_per_node
        domains = max(1, math.ceil(step.nodes / pool.domain_nodes))
        base, extra = divmod(step.nodes, domains)
        groups = [(base + (1 if k < extra else 0)) * per_node for k in range(domains)]
        inside, cross = pool.link_gb_per_s
        theta = float(np.broadcast_to(throughput, split.shape)[i, j])
        out[(int(i), int(j))] = split_cost(
            devices=step.gpus, per_domain=pool.domain_gpus or step.gpus, gb=step.allreduce_gb or 0.0,
            compute_seconds=(step.compute_seconds_per_step or 0.0) / theta, inside_gb_per_s=inside,
            cross_gb_per_s=cross, groups=groups,
        )
    return out
