"""Benchmarks: speed figures of the project, each printed next to a plain baseline.

Speed is measured here and only here (tests never assert timings). Run them with
``make bench`` or ``python -m benchmarks.run``; see ``benchmarks/README.md``.

This module holds the shared timing helpers; the figures live in
``benchmarks.validation`` (plate validation throughput),
``benchmarks.omics_write`` (omics dataset write throughput),
``benchmarks.rollouts`` (MuJoCo rollout harness overhead),
``benchmarks.isaaclab_overhead`` (Isaac Lab rollout harness overhead, measured in the
Isaac Lab runtime's Python 3.12, so this module imports nothing beyond the standard library) and
``benchmarks.episode_ingest`` (episode ingest throughput),
``benchmarks.registry`` (data registry register/get against a plain copy) and
``benchmarks.sealing`` (checkpoint save and omics write sealed with a tenant's key against plain) and
``benchmarks.camera_ingest`` (camera episode ingest against a plain PyAV decode of the same videos).
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

__all__ = ["REPEATS", "MIN_REPEAT_SECONDS", "Timing", "time_pair", "time_group"]

REPEATS = 5
"""Timed repeats per measurement; the figure is the median of these."""

MIN_REPEAT_SECONDS = 0.05
"""For calls faster than this, one repeat averages enough calls to last at least this long."""


@dataclass
class Timing:
    """Seconds per call of one measured function: median of the repeats, plus the raw repeats."""

    calls_per_repeat: int
    seconds: list[float] = field(default_factory=list)  # seconds per call, one per repeat

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def best(self) -> float:
        return min(self.seconds)

    def to_dict(self) -> dict[str, Any]:
        return {
            "statistic": "median",
            "median_s": self.median,
            "best_s": self.best,
            "repeats": len(self.seconds),
            "calls_per_repeat": self.calls_per_repeat,
            "seconds_per_call_each_repeat": self.seconds,
        }


def _calls_for(fn: Callable[[], Any], min_seconds: float) -> int:
    """How many calls make one repeat last at least ``min_seconds`` (one warm-up call included)."""
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    if once >= min_seconds:
        return 1
    return max(1, min(10_000, int(min_seconds / max(once, 1e-7)) + 1))


def time_pair(
    subject: Callable[[], Any],
    baseline: Callable[[], Any],
    *,
    repeats: int = REPEATS,
    min_repeat_seconds: float = MIN_REPEAT_SECONDS,
    before_each: Callable[[], None] | None = None,
    after_each: Callable[[], None] | None = None,
) -> tuple[Timing, Timing]:
    """Time ``subject`` and ``baseline`` in alternation (subject, baseline, subject, ...).

    Each function gets one untimed warm-up call, then ``repeats`` timed repeats
    with ``time.perf_counter``. Alternating the two keeps slow drift of the
    machine (other processes, CPU clock) from favouring either one.

    With ``before_each`` / ``after_each`` (for example: make / remove a fresh
    output folder), every repeat is exactly one call and those hooks run
    outside the timed region. Without them, fast calls are repeated inside one
    timed repeat until it lasts ``min_repeat_seconds``, and the repeat's time
    is divided by the number of calls.
    """
    subject_timing, baseline_timing = time_group(
        [subject, baseline],
        repeats=repeats,
        min_repeat_seconds=min_repeat_seconds,
        before_each=before_each,
        after_each=after_each,
    )
    return subject_timing, baseline_timing


def time_group(
    functions: Sequence[Callable[[], Any]],
    *,
    repeats: int = REPEATS,
    min_repeat_seconds: float = MIN_REPEAT_SECONDS,
    before_each: Callable[[], None] | None = None,
    after_each: Callable[[], None] | None = None,
) -> list[Timing]:
    """``time_pair`` for any number of functions: A, B, C, A, B, C, ... (one Timing each, in order).

    Same method as ``time_pair`` (which calls this with two): one untimed warm-up
    call each, then ``repeats`` rounds in which every function gets one timed
    repeat, ``gc.collect()`` before each, hooks outside the timed region.
    """
    hooks = before_each is not None or after_each is not None

    def prepare() -> None:
        if before_each is not None:
            before_each()

    def finish() -> None:
        if after_each is not None:
            after_each()

    timings: list[Timing] = []
    for fn in functions:
        prepare()
        if hooks:
            fn()  # warm-up
            calls = 1
        else:
            calls = _calls_for(fn, min_repeat_seconds)  # includes the warm-up call
        finish()
        timings.append(Timing(calls_per_repeat=calls))

    for _ in range(repeats):
        for fn, timing in zip(functions, timings):
            prepare()
            gc.collect()
            calls = timing.calls_per_repeat
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            elapsed = time.perf_counter() - start
            finish()
            timing.seconds.append(elapsed / calls)
    return timings
