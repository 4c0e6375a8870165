"""A step of the compute resource in its pools' queues: admitted to a pool, or waiting with a reason.

`Admission.pool` is what the compute resource asks before each attempt: the pool the placement
plan and admission agree on (`gate.py`). While no pool admits the step, it waits: its record in
`state/queues/waiting/` says why on each pool (`sinewgrid queue`, the `gpu_queues` asset), the
run's log says so once per change of reasons, the run is tagged `sinewgrid/queue` (the Runs page
filters on it: `sinewgrid/queue` starting `waiting`), and it asks again every
`SINEWGRID_QUEUE_POLL_SECONDS`. While an attempt runs on on-demand or spot capacity, `Mover`
moves it onto committed capacity of its plan that came free (`moves.py`). Pools the quotas file does not name are not queued: a plan with
no queued pool starts at once, as before queues existed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import dagster as dg

from control_plane.catalog.pools import Pool
from control_plane.catalog.quotas import QuotaCatalogError, Quotas, load_quotas
from control_plane.catalog.step_spec import StepSpec
from control_plane.compute.backends.base import AttemptResult
from control_plane.compute.causes import Cause
from control_plane.compute.step_run import StepFailedError
from control_plane.queues.gate import Gate, Waiting, WaitingRecords, instance_key, take_preempted_marker, waiting_id
from control_plane.queues.moves import COMMITTED
from control_plane.queues.requests import request_for
from workload_runtime.storage import Storage


QUEUE_TAG = "sinewgrid/queue"


class Admission:
    """One step's turns at admission, across its attempts (its place in the queue is kept)."""

    def __init__(self, context: dg.AssetExecutionContext, spec: StepSpec, storage: Storage, pools: Mapping[str, Pool], checkpoint_uri: str):
        from control_plane.settings import settings

        self.context, self.spec, self.storage = context, spec, storage
        self.quotas = _quotas(spec)
        self.gate = Gate(storage, pools, self.quotas)
        self.request_id = waiting_id(context.run_id, spec.name, checkpoint_uri)
        self.key = instance_key(context.run_id, spec.name, checkpoint_uri)
        self.arrived = time.time()
        self.poll_seconds = settings().queue_poll_seconds

    def pool(self, chooser) -> Pool:  # noqa: ANN001 - shared_resources.compute.PoolChooser
        """The pool the next attempt runs on: placement's order, as admission allows; waits while none does."""
        records, said, waited_from = WaitingRecords(self.storage), None, None
        try:
            while True:
                candidates = chooser.candidates(self.context)
                chooser.again = None
                if not any(p.name in self.quotas.quotas for p in candidates):
                    return candidates[0]  # no queued pool in its plan: as before queues
                try:
                    placed = self.gate.place(self.spec, candidates, request_id=self.request_id, run_id=self.context.run_id, arrived=self.arrived, key=self.key)
                except QuotaCatalogError as exc:  # e.g. a priority class the file does not define
                    raise StepFailedError(description=f"{self.spec.name} was not started: {exc}", allow_retries=False) from None
                if placed.pool is not None:
                    self.context.log.info(f"admitted {self.spec.name} on {placed.pool}: {placed.decision.reason}" + _passed(placed.refusals))
                    if waited_from is not None:
                        self._tag(f"admitted on {placed.pool} after {time.time() - waited_from:.0f}s in the queue")
                    return next(p for p in candidates if p.name == placed.pool)
                words = "; ".join(f"{pool}: {why}" for pool, why in placed.refusals.items())
                if waited_from is None:
                    waited_from = time.time()
                    self._tag(f"waiting for {', '.join(placed.refusals)}")
                if words != said:
                    self.context.log.info(f"{self.spec.name} waits in the queue ({words}); asks again every {self.poll_seconds:g}s")
                    said = words
                requests = [request_for(self.spec, p, self.quotas, id=self.request_id, arrived=self.arrived) for p in candidates]
                held = {p.name: r.gpus for p, r in zip(candidates, requests, strict=True)}
                records.put(Waiting(requests[0], self.spec.name, self.context.run_id, held, placed.refusals, self.arrived))
                time.sleep(self.poll_seconds)
        finally:
            records.remove(self.request_id)

    def _tag(self, value: str) -> None:
        """The run's `sinewgrid/queue` tag: the Runs page filters on it to show what waits."""
        try:
            self.context.instance.add_run_tags(self.context.run_id, {QUEUE_TAG: value[:200]})
        except Exception as exc:  # noqa: BLE001 - the tag is a view; the wait goes on without it
            self.context.log.debug(f"could not tag the run {QUEUE_TAG}={value!r}: {exc!r}")

    def attempt_ended(self) -> None:
        """The attempt's job is no longer in flight: its claim on the pool goes too."""
        self.gate.release(self.request_id)


def quota_preemption(context: dg.AssetExecutionContext, storage: Storage, spec: StepSpec, checkpoint_uri: str, started: float, result: AttemptResult) -> None:
    """An attempt stopped by admission is booked to its cause: `quota` (another step took the
    GPUs back) or `moved` (committed capacity of its plan came free)."""
    marker = take_preempted_marker(storage, instance_key(context.run_id, spec.name, checkpoint_uri))
    if marker is None or float(marker.get("at", 0.0)) < started:
        return
    result.cause = Cause(marker.get("cause", Cause.quota))
    if result.cause is Cause.moved:
        context.log.warning(f"{spec.name} checkpointed to move: {marker.get('reason', '')}")
    else:
        context.log.warning(f"{spec.name} was preempted by admission for {marker.get('by', 'another step')} ({marker.get('reason', '')}); it resumes from its checkpoint where the queues admit it")


class Mover:
    """While an attempt runs on an on-demand or spot pool, looks every `6 ×
    SINEWGRID_QUEUE_POLL_SECONDS` for committed capacity of the step's plan that came free
    (`moves.py`), and moves the step there (notice, checkpoint, resume: cause `moved`) while
    more than `SINEWGRID_QUEUE_MOVE_MIN_HOURS` of its expected run is left."""

    def __init__(self, admission: Admission, plan: list[Pool], pool: Pool):
        from control_plane.settings import settings

        self.admission, self.plan, self.pool = admission, plan, pool
        self.min_seconds = settings().queue_move_min_hours * 3600
        self.every = 6 * admission.poll_seconds
        self.started = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _worth_watching(self) -> bool:
        spec, quotas = self.admission.spec, self.admission.quotas
        names = [p.name for p in self.plan]
        ahead = self.plan[: names.index(self.pool.name)] if self.pool.name in names else []
        return (self.min_seconds > 0 and spec.checkpoints and self.pool.purchasing not in COMMITTED
                and any(p.purchasing in COMMITTED and p.name in quotas.quotas for p in ahead))  # fmt: skip

    def __enter__(self) -> Mover:
        if self._worth_watching():
            self._thread = threading.Thread(target=self._watch, name=f"mover-{self.admission.spec.name}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _watch(self) -> None:
        a = self.admission
        while not self._stop.wait(self.every):
            left = a.spec.expected_hours * 3600 - (time.time() - self.started)
            if left < self.min_seconds:
                return
            try:
                target = a.gate.better(a.spec, self.plan, self.pool, request_id=a.request_id, arrived=a.arrived)
                if target is None:
                    continue
                reason = f"committed pool {target} of its plan came free, before {self.pool.name} ({self.pool.purchasing.value}); about {left / 3600:.1f} h of it left"
                if a.gate.stop_own(a.key, cause=Cause.moved.value, by=a.spec.name, reason=reason):
                    a.context.log.info(f"moving {a.spec.name} to {target}: {reason}")
                return
            except Exception as exc:  # noqa: BLE001 - a move is an optimisation: the step runs on where it is
                a.context.log.debug(f"{a.spec.name}: could not look for committed capacity to move to ({exc!r})")


def _quotas(spec: StepSpec) -> Quotas:
    try:
        return load_quotas()
    except QuotaCatalogError as exc:
        raise StepFailedError(description=f"{spec.name} was not started: {exc}", allow_retries=False) from None


def _passed(refusals: Mapping[str, str]) -> str:
    return "".join(f"\n  passed over {pool}: {why}" for pool, why in refusals.items())
