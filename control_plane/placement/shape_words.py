"""The plan's words for what a step's code runs on and how its gang fits a pool's fast domains:
refusals that name the family or the shape that did not fit, and the cost lines of a step that
runs faster or slower there, or is split across domains."""

from __future__ import annotations

import math

from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.placement.cost_model import Assessment


def _plural(noun: str, n: int) -> str:
    return noun if n == 1 else ("switches" if noun == "switch" else f"{noun}s")


def family_refusal(step: StepSpec, pool: Pool) -> str:
    said = "its `runs_on`" if step.runs_on is not None else "it says no `runs_on`, so CUDA code"
    return (
        f"the step's code runs on {', '.join(step.families())} ({said}); the pool sells {pool.accelerator} "
        f"({pool.family}). Add `{pool.family}` to `runs_on` with its throughput once the code runs there"
    )


def porting_refusal(a: Assessment, i: int, j: int) -> str:
    step, pool = a.steps[i], a.pools[j]
    support = step.support_on(pool.accelerator)
    assert support is not None
    work = float(a.cost_usd[i, j])
    cheapest = _cheapest_feasible(a, i)
    total = work + support.porting_usd
    compare = f"; the cheapest pool it runs on now costs ${cheapest:,.2f}" if cheapest is not None else ""
    return (
        f"needs porting to {pool.family} (`needs_porting`): here it would cost ${work:,.2f} at ×{support.throughput:g} "
        f"throughput, ${total:,.2f} with ${support.porting_usd:,.2f} of porting{compare}"
    )


def _cheapest_feasible(a: Assessment, i: int) -> float | None:
    costs = a.cost_usd[i][a.feasible[i]]
    return float(costs.min()) if costs.size else None


def interconnect_refusal(step: StepSpec, pool: Pool) -> str:
    noun = pool.domain_noun
    if pool.domain_nodes is None:
        return (
            f"tightly coupled across {step.gpus} GPUs, but the pool declares no fast domain (`nodes_per_domain` or "
            "`topology` in the catalog)"
        )
    per_node = math.ceil(step.gpus / step.nodes) if step.gpus else pool.gpus_per_node
    domains = math.ceil(step.nodes / pool.domain_nodes)
    return (
        f"tightly coupled: needs {step.nodes} nodes × {per_node} = {step.gpus} GPUs in one {noun}; the pool's "
        f"{_plural(noun, 2)} hold {pool.domain_nodes} nodes × {pool.gpus_per_node} = {pool.domain_gpus}. With "
        f"`span_domains: true` it would be split over {domains} {_plural(noun, domains)}, the slower links costed"
    )


def pace_reasons(a: Assessment, i: int, j: int) -> list[str]:
    """Cost lines for a step whose run is faster or slower here than its `expected_hours`."""
    step, pool = a.steps[i], a.pools[j]
    why = []
    theta = float(a.throughput[min(i, a.throughput.shape[0] - 1), min(j, a.throughput.shape[1] - 1)])
    support = step.support_on(pool.accelerator)
    if theta != 1.0 or (support is not None and support.source != "declared"):
        source = f"; {support.source}" if support is not None and support.source != "declared" else ""
        why.append(
            f"runs at ×{theta:g} its reference throughput on {pool.accelerator}: {step.expected_hours / theta:,.2f} h "
            f"of run for {step.expected_hours:,.2f} h of work (cost per unit of work, not per hour{source})"
        )
    split = a.splits.get((i, j)) if a.splits is not None else None
    if split is not None:
        inside, cross = pool.link_gb_per_s
        noun = _plural(pool.domain_noun, split.domains)
        why.append(
            f"split over {split.domains} {noun}: each step {split.slowdown:.3f}× as long by the all-reduce model "
            f"({step.allreduce_gb:g} GB all-reduced: {split.allreduce_one:.3f} s inside one {pool.domain_noun} at "
            f"{inside:g} GB/s, {split.allreduce:.3f} s split, {cross:g} GB/s per GPU between them)"
        )
    if pool.topology is not None and pool.topology.whole_domains and a.held_gpus[i, j] > max(step.gpus, 1):
        why.append(
            f"a {pool.domain_noun} ({pool.topology.slice}) is provisioned whole: holds and pays for "
            f"{a.held_gpus[i, j]:.0f} chips (uses {step.gpus})"
        )
    return why
