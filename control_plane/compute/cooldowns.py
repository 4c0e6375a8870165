"""Capacity on this side of the backends: local concurrency slots and pool cool-downs.

- **Slots.** A local pool may declare `max_concurrent_steps`; a step takes a slot (an exclusive
  `flock` on a file, so it holds across processes and is released if the holder dies) and a
  pool with none free refuses the step, which then fails over to the next pool in its plan.
- **Cool-downs.** A pool that just refused or preempted a step is avoided for
  `cooldown_seconds` (a pool that preempts once tends to preempt again). The record lives in
  the object store, so every orchestrator process sees it.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from control_plane.catalog.pools import Pool
from control_plane.settings import settings
from workload_runtime.storage import Storage, exists, read_json, write_json_atomic

SLOTS_ENV = "SINEWGRID_SLOTS_DIR"


def slots_dir() -> Path:
    return settings().slots_folder


@contextmanager
def pool_slot(pool: Pool) -> Iterator[int | None]:
    """Hold one of the pool's slots for the duration; yields its index, or None if all are taken.

    A pool without `max_concurrent_steps` always has room (yields 0 and holds nothing).
    """
    if pool.max_concurrent_steps is None:
        yield 0
        return
    folder = slots_dir() / pool.name
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(pool.max_concurrent_steps):
        handle = open(folder / f"slot-{index}.lock", "a+")  # noqa: SIM115 - held for the step's lifetime
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        try:
            yield index
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()
        return
    yield None


@dataclass(frozen=True)
class Cooldown:
    pool: str
    until: float
    reason: str

    @property
    def remaining_seconds(self) -> float:
        return max(0.0, self.until - time.time())


class Cooldowns:
    """Pools to avoid for a while, kept under `state/cooldowns/` in the storage root."""

    def __init__(self, storage: Storage):
        self.storage = storage

    def _uri(self, pool: str) -> str:
        return self.storage.uri("state", "cooldowns", f"{pool}.json")

    def start(self, pool: Pool, reason: str) -> Cooldown:
        cooldown = Cooldown(pool.name, time.time() + pool.cooldown_seconds, reason)
        write_json_atomic(self._uri(pool.name), {"pool": pool.name, "until": cooldown.until, "reason": reason})
        return cooldown

    def active(self, pool: str) -> Cooldown | None:
        uri = self._uri(pool)
        if not exists(uri):
            return None
        doc = read_json(uri)
        cooldown = Cooldown(pool, float(doc["until"]), str(doc["reason"]))
        return cooldown if cooldown.remaining_seconds > 0 else None
