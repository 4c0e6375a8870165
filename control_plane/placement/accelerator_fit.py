"""Where a step's code can run, how fast, and how its gang fits a pool's fast domains: the
matrices the cost model (`cost_model.assess`) takes from each step's `runs_on` and shape.

Worked out once per distinct (what the step runs on, the pool's accelerator), so a job of
10,000 steps over 500 pools costs a few hundred lookups, not five million.
"""

from __future__ import annotations


import numpy as np

from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.placement.links import Split


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
    chosen = [pools[j] for j in cols]
    per_node = np.array([max(p.gpus_per_node, 1) for p in chosen], dtype=float)[None, :]
    domain_nodes = np.array([p.domain_nodes for p in chosen], dtype=float)[None, :]
    domain_gpus = np.array([p.domain_gpus for p in chosen], dtype=float)[None, :]
    nodes = np.array([s.nodes for s in steps], dtype=float)[:, None]
    gpus = np.array([s.gpus for s in steps], dtype=float)[:, None]
    hosts = np.maximum(nodes, np.ceil(gpus / per_node))
    return cols, np.ceil(hosts / domain_nodes) * domain_gpus


class Splits:
    """The gangs split across fast domains: for each (step, pool) pair, its domains and its step time
    by the all-reduce model beside one domain's (vectorised; a `Split` is made for a pair only when
    the evidence asks)."""

    def __init__(self, pairs: np.ndarray, domains: np.ndarray, compute: np.ndarray, one: np.ndarray, split: np.ndarray):
        self.pairs, self.domains, self.compute, self.one, self.split = pairs, domains, compute, one, split
        self._index = {(int(i), int(j)): k for k, (i, j) in enumerate(pairs)}

    def __bool__(self) -> bool:
        return bool(self._index)

    def __len__(self) -> int:
        return len(self._index)

    @property
    def slowdown(self) -> np.ndarray:
        base = self.compute + self.one
        return np.where(base > 0, (self.compute + self.split) / np.where(base > 0, base, 1.0), 1.0)

    def __getitem__(self, pair: tuple[int, int]) -> Split:
        split = self.get(pair)
        if split is None:
            raise KeyError(pair)
        return split

    def get(self, pair: tuple[int, int]) -> Split | None:
        k = self._index.get(pair)
        if k is None:
            return None
        return Split(int(self.domains[k]), float(self.compute[k] + self.one[k]), float(self.compute[k] + self.split[k]),
                     float(self.one[k]), float(self.split[k]))


def split_gangs(steps: list[StepSpec], pools: list[Pool], split: np.ndarray, throughput: np.ndarray) -> Splits:
    """How each gang that may span domains (`split`: bool [S, P]) lays over a pool's domains (as few
    as hold it, as evenly as can be), and its step time by the all-reduce model (`links.py`), beside
    one domain's."""
    pairs = np.argwhere(split)
    if not pairs.size:
        return Splits(pairs.reshape(0, 2), *(np.zeros(0) for _ in range(4)))
    i, j = pairs[:, 0], pairs[:, 1]
    step_nodes = np.array([s.nodes for s in steps], dtype=float)[i]
    step_gpus = np.array([s.gpus for s in steps], dtype=float)[i]
    gb = np.array([s.allreduce_gb or 0.0 for s in steps], dtype=float)[i]
    compute = np.array([s.compute_seconds_per_step or 0.0 for s in steps], dtype=float)[i] / np.broadcast_to(throughput, split.shape)[i, j]
    domain_nodes = np.array([p.domain_nodes or 1 for p in pools], dtype=float)[j]
    links = np.array([p.link_gb_per_s for p in pools], dtype=float)[j]
    inside, cross = links[:, 0], links[:, 1]
    per_node = np.where(step_gpus > 0, np.ceil(step_gpus / step_nodes), 1.0)
    domains = np.maximum(1.0, np.ceil(step_nodes / domain_nodes))
    g = np.floor(step_nodes / domains) * per_node  # the smallest group sets the cross-domain pace
    n = step_gpus
    one = np.where(n > 1, 2.0 * (n - 1) / np.maximum(n, 1) * gb / inside, 0.0)
    within = np.where(g > 1, 2.0 * (g - 1) / np.maximum(g, 1) * gb / inside, 0.0)
    across = 2.0 * (domains - 1) / domains * gb / (np.maximum(g, 1) * cross)
    return Splits(pairs, domains, compute, one, np.where(domains > 1, within + across, one))
