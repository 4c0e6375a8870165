"""A step of the compute resource in its pools' queues: admitted to a pool, or waiting with a reason.

`Admission.pool` is what the compute resource asks before each attempt: the pool the placement
plan and admission agree on (`gate.py`). While no pool admits the step, it waits: its record in
`state/queues/waiting/` says why on each pool (`sinewgrid queue`, the `gpu_queues` asset), the
run's log says so once per change of reasons, the run is tagged `sinewgrid/queue` (the Runs page
filters on it: `sinewgrid/queue` starting `waiting`), and it asks again every
`SINEWGRID_QUEUE_POLL_SECONDS`. Pools the quotas file does not name are not queued: a plan with
no queued pool starts at once, as before queues existed.
"""

from __future__ import annotations

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
                request = request_for(self.spec, candidates[0], self.quotas, id=self.request_id, arrived=self.arrived)
                held = {p.name: request_for(self.spec, p, self.quotas, id=self.request_id, arrived=self.arrived).gpus for p in candidates}
                records.put(Waiting(request, self.spec.name, self.context.run_id, held, placed.refusals, self.arrived))
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
    """An attempt stopped by admission (another step took the GPUs back) is booked to cause `quota`."""
    marker = take_preempted_marker(storage, instance_key(context.run_id, spec.name, checkpoint_uri))
    if marker is None or float(marker.get("at", 0.0)) < started:
        return
    result.cause = Cause.quota
    context.log.warning(f"{spec.name} was preempted by admission for {marker.get('by', 'another step')} ({marker.get('reason', '')}); it resumes from its checkpoint where the queues admit it")


def _quotas(spec: StepSpec) -> Quotas:
    try:
        return load_quotas()
    except QuotaCatalogError as exc:
        raise StepFailedError(description=f"{spec.name} was not started: {exc}", allow_retries=False) from None


def _passed(refusals: Mapping[str, str]) -> str:
    return "".join(f"\n  passed over {pool}: {why}" for pool, why in refusals.items())
