"""Moving running work onto committed capacity that came free.

Reserved and block capacity is paid for whether it runs anything or not. When such a pool of a
running step's plan, ranked before the pool the step runs on (an on-demand or spot pool it went
to because the committed one was full), admits it now without preempting anything and with
nothing waiting ahead of it, the step is moved there: notice, checkpoint, resume (cause `moved`).
Only steps that checkpoint, and only when more than `SINEWGRID_QUEUE_MOVE_MIN_HOURS` of their
expected run is left, so the checkpoint and restart are repaid. The same rule drives the fleet
simulation (benchmarks/queue_sim.py).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence

from control_plane.catalog.pools import Purchasing
from control_plane.queues.admission import Decision

COMMITTED = frozenset({Purchasing.reserved, Purchasing.block})


def better_pool(ranked: Sequence[str], current: str, committed: Container[str], decide: Callable[[str], Decision]) -> str | None:
    """The first pool of `ranked` (the step's plan, best first) before `current` that is
    committed (and queued) and admits the step now without preempting; None when `current` is
    committed itself, or no such pool does."""
    if current in committed or current not in ranked:
        return None
    for pool in ranked[: list(ranked).index(current)]:
        if pool in committed:
            decision = decide(pool)
            if decision.admitted and not decision.preempt:
                return pool
    return None
