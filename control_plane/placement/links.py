"""The all-reduce model: how long a data-parallel step takes when its gang sits in one fast domain,
and when it is split across several.

A training step is compute (`c`, shrunk by the accelerator's relative throughput) followed by an
all-reduce of `S` GB of gradients; the model assumes no overlap, so it errs on the slow side.
Inside one domain of `N` accelerators a ring all-reduce moves 2(N−1)/N · S over each device's
fast links (`B_in` GB/s). Split over `d` domains of `g` devices, the hierarchical all-reduce that
NCCL, XLA and the Neuron collectives use reduces inside each domain (2(g−1)/g · S at `B_in`), then
all-reduces each device's 1/g share across domains over the slower network (2(d−1)/d · S/g at
`B_x` per device): the smallest group sets the pace.

    t_one   = c + 2(N−1)/N · S / B_in
    t_split = c + 2(g−1)/g · S / B_in + 2(d−1)/d · S / (g · B_x)

Bandwidths are per device, as `Pool.link_gb_per_s` gives them (docs/accelerators.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def allreduce_seconds(gb: float, groups: list[int], inside_gb_per_s: float, cross_gb_per_s: float) -> float:
    """Seconds to all-reduce `gb` over devices laid out as `groups` (devices per domain)."""
    groups = [g for g in groups if g > 0]
    if not groups or sum(groups) <= 1:
        return 0.0
    d, g = len(groups), min(groups)
    if d == 1:
        n = groups[0]
        return 2.0 * (n - 1) / n * gb / inside_gb_per_s
    inside = 2.0 * (g - 1) / g * gb / inside_gb_per_s if g > 1 else 0.0
    return inside + 2.0 * (d - 1) / d * gb / (g * cross_gb_per_s)


def even_groups(devices: int, per_domain: int) -> list[int]:
    """`devices` laid over as few domains of `per_domain` as hold them, as evenly as can be."""
    d = max(1, math.ceil(devices / per_domain))
    base, extra = divmod(devices, d)
    return [base + (1 if k < extra else 0) for k in range(d)]


@dataclass(frozen=True)
class Split:
    """A gang laid over `domains` fast domains, and what that does to its step time."""

    domains: int
    step_seconds_one: float
    step_seconds: float
    allreduce_one: float
    allreduce: float

    @property
    def slowdown(self) -> float:
        return self.step_seconds / self.step_seconds_one if self.step_seconds_one else 1.0


def split_cost(
    *, devices: int, per_domain: int, gb: float, compute_seconds: float, inside_gb_per_s: float, cross_gb_per_s: float,
    groups: list[int] | None = None,
) -> Split:
    """Step time of a gang of `devices` split over domains of `per_domain` (or laid out as `groups`),
    beside the same gang in one domain."""
    groups = groups or even_groups(devices, per_domain)
    one = allreduce_seconds(gb, [devices], inside_gb_per_s, cross_gb_per_s)
    split = allreduce_seconds(gb, groups, inside_gb_per_s, cross_gb_per_s)
    return Split(len([g for g in groups if g]), compute_seconds + one, compute_seconds + split, one, split)
