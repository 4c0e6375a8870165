"""Throughput measured by a step's own runs: the median seconds per training step each attempt
reported (its Pipes telemetry), kept per accelerator, and turned into the relative throughputs the
planner compares (`StepSpec.runs_on`, source `measured`).

Once a step has run on two or more accelerators, the next plan stops trusting the declared
figures for them: the accelerator it ran on most (the anchor) keeps its declared throughput, and
each other one gets anchor × (anchor's seconds per step ÷ its own). One accelerator alone says
nothing relative, so nothing changes until there is a second. The record holds timings only
(never a tenant's data) under `state/pace/`.
"""

from __future__ import annotations

import re
import statistics
import time

from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.catalog.support import Support
from workload_runtime.storage import Storage, exists, read_json, write_json_atomic

KEEP = 9  # the latest runs per accelerator whose median counts


def _uri(storage: Storage, step: str) -> str:
    return storage.uri("state", "pace", f"{re.sub(r'[^A-Za-z0-9._-]', '_', step)}.json")


def read(storage: Storage, step: str) -> dict[str, dict]:
    """accelerator -> {"step_seconds": [...], "pool": last pool, "at": unix time} for `step`."""
    uri = _uri(storage, step)
    return read_json(uri) if exists(uri) else {}


def record(storage: Storage, spec: StepSpec, pool: Pool, step_seconds: float | None) -> None:
    """Add one attempt's median seconds per step on `pool`'s accelerator (nothing if it reported none)."""
    if not step_seconds or step_seconds <= 0:
        return
    book = read(storage, spec.name)
    entry = book.get(pool.accelerator, {"step_seconds": []})
    entry = {"step_seconds": [*entry["step_seconds"], float(step_seconds)][-KEEP:], "pool": pool.name, "at": time.time()}
    write_json_atomic(_uri(storage, spec.name), {**book, pool.accelerator: entry})


def measured(storage: Storage, spec: StepSpec) -> StepSpec:
    """`spec` with the throughputs its own runs measured in place of the declared ones, where it
    has run on two or more accelerators its code supports; else `spec` unchanged."""
    book = {a: e for a, e in read(storage, spec.name).items() if e.get("step_seconds") and _supported(spec, a)}
    if len(book) < 2:
        return spec
    anchor = max(sorted(book), key=lambda a: len(book[a]["step_seconds"]))
    anchor_seconds = statistics.median(book[anchor]["step_seconds"])
    declared = spec.support_on(anchor)
    assert declared is not None
    runs_on = dict(spec.runs_on) if spec.runs_on is not None else {f: Support() for f in ("nvidia", "local", "cpu")}
    for accelerator, entry in book.items():
        if accelerator == anchor:
            continue
        seconds = statistics.median(entry["step_seconds"])
        before = spec.support_on(accelerator)
        assert before is not None
        runs_on[accelerator] = before.model_copy(update={
            "throughput": round(declared.throughput * anchor_seconds / seconds, 4),
            "source": (
                f"measured: {seconds:.3g} s/step on {accelerator} ({len(entry['step_seconds'])} run(s)) against "
                f"{anchor_seconds:.3g} s/step on {anchor}"
            ),
        })
    return spec.model_copy(update={"runs_on": runs_on})


def _supported(spec: StepSpec, accelerator: str) -> bool:
    try:
        return spec.support_on(accelerator) is not None
    except KeyError:  # an accelerator name this version no longer knows
        return False
