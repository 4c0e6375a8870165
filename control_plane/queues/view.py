"""Each pool's queue as people read it: `sinewgrid queue` and the `gpu_queues` asset.

Per pool: its GPUs, free, whether it is queued (the quotas file names it), and per team its
nominal quota, GPUs in use and borrowed; then the steps waiting for it, with their reason and an
expected start (when enough GPUs free up if the running jobs end when their steps expect and the
work ahead starts first: an estimate, not a promise).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from control_plane.catalog.pools import Pool
from control_plane.catalog.quotas import Quotas
from control_plane.compute.inflight import InFlight
from control_plane.queues.admission import PoolQueue, order
from control_plane.queues.gate import WaitingRecords
from control_plane.queues.usage import queues_now
from workload_runtime.storage import Storage


@dataclass(frozen=True)
class TeamRow:
    team: str
    nominal: int
    used: int
    borrowed: int


@dataclass(frozen=True)
class WaitingRow:
    step: str
    team: str
    gpus: int
    priority: str
    waited_seconds: float
    reason: str
    expected_start: float | None  # epoch seconds; None: not within what is running now


@dataclass
class PoolView:
    pool: str
    gpus: int
    free: int
    queued: bool
    teams: list[TeamRow] = field(default_factory=list)
    waiting: list[WaitingRow] = field(default_factory=list)


def queue_view(storage: Storage, pools: Mapping[str, Pool], quotas: Quotas, *, now: float | None = None) -> list[PoolView]:
    now = time.time() if now is None else now
    records = InFlight(storage).records()
    queues = queues_now(records, pools, quotas)
    ends = {f"{r['handle']['backend']}:{r['handle']['job_id']}": float(r.get("owner", {}).get("expected_end") or now) for r in records}
    waiting = WaitingRecords(storage).all(now=now)
    classes = {value: name for name, value in quotas.priority_classes.items()}
    views = []
    for name in sorted(queues):
        queue = queues[name]
        teams = sorted({*quotas.quotas.get(name, {}), *(r.team for r in queue.running.values())})
        view = PoolView(name, queue.capacity, queue.free, name in quotas.quotas,
                        [TeamRow(t, queue.nominal(t), queue.used(t), queue.borrowed(t)) for t in teams])  # fmt: skip
        here = [w for w in waiting if name in w.candidates]
        ahead = 0
        for request in order([w.request for w in here], queues.values(), on=queue):
            w = next(w for w in here if w.request.id == request.id)
            gpus = w.candidates[name]
            start = expected_start(queue, gpus + ahead, ends, now)
            ahead += gpus
            view.waiting.append(WaitingRow(w.step, w.request.team, gpus, classes.get(w.request.priority, str(w.request.priority)),
                                           now - w.since, w.reasons.get(name, "waits for another pool of its plan"), start))  # fmt: skip
        views.append(view)
    return views


def expected_start(queue: PoolQueue, gpus: int, ends: Mapping[str, float], now: float) -> float | None:
    """When `gpus` GPUs of the pool are free if its running jobs end when expected (None: not even then)."""
    free = queue.free
    if free >= gpus:
        return now
    for end, held in sorted((max(ends.get(i, now), now), r.gpus) for i, r in queue.running.items()):
        free += held
        if free >= gpus:
            return end
    return None
