"""The compute resource's admission: on which pool of its plan may a step start now, or why it waits.

Before each attempt the compute resource asks `Gate.place` with the pools its plan still allows
(best first). The pools' queues are built from the jobs in flight (`state/inflight/`, every
backend's) and the steps waiting (`state/queues/waiting/`), and the quotas catalog decides
(`admission.py`):

- a pool the quotas file gives no quotas is **not queued**: the step may start there as before
  (the engine's own limits still apply);
- on a queued pool the step starts when admission admits it, on the first pool of its plan
  that admits it without preempting, else the first that admits it by preempting;
- a step that could start is still held back while a step **ahead of it in the queue** (a team
  further below its fair share, or higher priority within its team, or older) could start on one
  of the same pools now: capacity goes in queue order, whichever worker asks first;
- admitting is a **claim** (`state/queues/claims/`), counted as held until the step's job is in
  flight: two workers admitted at once both see both claims, and the one whose claim no longer
  fits backs off and asks again (optimistic concurrency: no lock, on a folder or an object store);
- preempting means the victims get the usual notice (SIGTERM: they checkpoint and exit 75) and a
  marker, so their own workers book the attempt to cause `quota` and resume where admission lets
  them; the step starts once their GPUs are free.

A step that cannot start anywhere waits: its record says why on each pool (`sinewgrid queue`,
the queue asset), and the resource asks again every `poll_seconds`.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from control_plane.catalog.pools import Pool
from control_plane.catalog.quotas import Quotas
from control_plane.catalog.step_spec import StepSpec
from control_plane.compute.inflight import InFlight
from control_plane.queues.admission import Decision, Placed, PoolQueue, Request, choose, order
from control_plane.queues.moves import COMMITTED, better_pool
from control_plane.queues.requests import request_for
from control_plane.queues.usage import queues_now
from workload_runtime.storage import Storage, fs_for, glob_uris, read_json, write_json_atomic

STALE_SECONDS = 120.0  # a waiting record not renewed for this long belongs to a worker that died
NOT_QUEUED = "has no quotas in the quotas file: not queued"


def instance_key(run_id: str, step: str, checkpoint_uri: str) -> str:
    """One step instance (a sweep's shards share a run and a step name, not a checkpoint place)."""
    return hashlib.sha256(f"{run_id}|{step}|{checkpoint_uri}".encode()).hexdigest()[:24]


@dataclass
class Waiting:
    """A step waiting for admission, as its record says."""

    request: Request
    step: str
    run_id: str
    candidates: dict[str, int]  # pool -> GPUs it would hold there, best first
    reasons: dict[str, str] = field(default_factory=dict)
    since: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {**_request_json(self.request), "step": self.step, "run_id": self.run_id, "candidates": self.candidates, "reasons": self.reasons, "since": self.since}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Waiting:
        request = Request(doc["id"], doc["team"], int(doc["gpus"]), int(doc["priority"]), float(doc["arrived"]))
        return cls(request, doc["step"], doc["run_id"], dict(doc["candidates"]), dict(doc.get("reasons", {})), float(doc.get("since", 0.0)))


class Records:
    """Small JSON records, one file each under `state/queues/<kind>/`, renewed while they hold."""

    def __init__(self, storage: Storage, kind: str):
        self.storage, self.kind = storage, kind

    def _uri(self, name: str) -> str:
        return self.storage.uri("state", "queues", self.kind, f"{name}.json")

    def write(self, name: str, doc: Mapping[str, Any]) -> None:
        write_json_atomic(self._uri(name), {**doc, "renewed": time.time()})

    def remove(self, name: str) -> None:
        fs, path = fs_for(self._uri(name))
        if fs.exists(path):
            fs.rm_file(path)

    def live(self, *, now: float | None = None) -> list[dict[str, Any]]:
        """The records renewed within `STALE_SECONDS` (older ones belong to a worker that died)."""
        now = time.time() if now is None else now
        found = []
        for uri in glob_uris(self.storage.uri("state", "queues", self.kind, "*.json")):
            try:
                doc = read_json(uri)
            except FileNotFoundError:
                continue
            if now - float(doc.get("renewed", 0.0)) <= STALE_SECONDS:
                found.append(doc)
        return found


class WaitingRecords(Records):
    """Steps waiting for admission, with each pool's reason (`sinewgrid queue`, the queue asset)."""

    def __init__(self, storage: Storage):
        super().__init__(storage, "waiting")

    def put(self, waiting: Waiting) -> None:
        self.write(waiting.request.id, waiting.to_json())

    def all(self, *, now: float | None = None) -> list[Waiting]:
        return [Waiting.from_json(doc) for doc in self.live(now=now)]


class Claims(Records):
    """Admitted steps whose job is not in flight yet: GPUs they hold in admission's eyes."""

    def __init__(self, storage: Storage):
        super().__init__(storage, "claims")


def preempted_marker(storage: Storage, key: str) -> str:
    return storage.uri("state", "queues", "preempted", f"{key}.json")


def take_preempted_marker(storage: Storage, key: str) -> dict[str, Any] | None:
    """The marker the gate left for a step instance it preempted (removed as it is read), or None."""
    uri = preempted_marker(storage, key)
    fs, path = fs_for(uri)
    try:
        doc = read_json(uri)
    except FileNotFoundError:
        return None
    fs.rm_file(path)
    return doc


@dataclass
class Gate:
    """Admission for one step of the compute resource (one `place` call per try)."""

    storage: Storage
    pools: Mapping[str, Pool]
    quotas: Quotas
    signalled: set[str] = field(default_factory=set)  # victims already given their notice

    def place(self, spec: StepSpec, candidates: list[Pool], *, request_id: str, run_id: str, arrived: float, key: str = "") -> Placed:
        """The pool `spec` may start on now (its claim written), or none with each pool's reason
        (after giving the victims of a preemption their notice)."""
        records = InFlight(self.storage).records()
        queues = self._queues(records, request_id)
        waiting = [w for w in WaitingRecords(self.storage).all() if w.request.id != request_id]  # holds nothing; orders the queue
        requests = {p.name: request_for(spec, p, self.quotas, id=request_id, arrived=arrived) for p in candidates}
        placed = choose((p.name, self._turn(queues, waiting, p.name, requests[p.name])) for p in candidates)
        claims = Claims(self.storage)
        if placed.pool is None or placed.pool not in self.quotas.quotas:
            claims.remove(request_id)  # one it made while taking GPUs back, now not needed
            return placed
        pool, request = placed.pool, requests[placed.pool]
        claims.write(request_id, {**_request_json(request), "pool": pool, "key": key, "at": time.time()})
        if placed.decision.preempt:  # the claim keeps the GPUs it takes back from going to anyone else
            self._stop(placed.decision, records, spec)
            return Placed(None, None, {**placed.refusals, pool: f"{placed.decision.reason}; waits for their GPUs"})
        # Another worker admitted at the same moment sees this claim, as this one sees its: the
        # claims that arrived first keep their GPUs, a later one that no longer fits backs off.
        again = self._queues(InFlight(self.storage).records(), request_id, before=_claimed_at(claims, request_id))
        recheck = again[pool].decide(request)
        if not recheck.admitted or recheck.preempt:
            claims.remove(request_id)
            return Placed(None, None, {**placed.refusals, pool: f"another step was admitted to it at the same moment; asks again ({recheck.reason})"})
        return placed

    def better(self, spec: StepSpec, plan: list[Pool], current: Pool, *, request_id: str, arrived: float) -> str | None:
        """A committed pool of `plan` before `current` that would take the running step now
        without preempting, with no waiting step ahead of it there (`moves.py`); None if none."""
        queues = self._queues(InFlight(self.storage).records(), request_id)
        waiting = [w for w in WaitingRecords(self.storage).all() if w.request.id != request_id]
        committed = {p.name for p in plan if p.purchasing in COMMITTED and p.name in self.quotas.quotas}
        requests = {p.name: request_for(spec, p, self.quotas, id=request_id, arrived=arrived) for p in plan}
        return better_pool([p.name for p in plan], current.name, committed, lambda name: self._turn(queues, waiting, name, requests[name]))

    def stop_own(self, key: str, *, cause: str, by: str, reason: str) -> bool:
        """Give the step instance `key`'s own job in flight its notice (cause `cause`); False when it has none."""
        for record in InFlight(self.storage).records():
            owner = record.get("owner", {})
            if instance_key(owner.get("run_id", ""), owner.get("step", ""), owner.get("checkpoint_uri", "")) == key:
                _notice(self.storage, record, cause=cause, by=by, reason=reason)
                return True
        return False

    def release(self, request_id: str) -> None:
        """The step's job is in flight, or its attempt ended: its claim holds nothing more."""
        Claims(self.storage).remove(request_id)

    def _queues(self, records: list[dict[str, Any]], request_id: str, before: float | None = None) -> dict[str, PoolQueue]:
        """The pools' queues: jobs in flight, and other steps' claims (those made before `before`, if given)."""
        queues = queues_now(records, dict(self.pools), self.quotas)
        flying = {instance_key(r.get("owner", {}).get("run_id", ""), r.get("owner", {}).get("step", ""), r.get("owner", {}).get("checkpoint_uri", "")) for r in records}
        for claim in Claims(self.storage).live():
            if claim["id"] == request_id or claim.get("key") in flying or claim["pool"] not in queues:
                continue
            if before is not None and (float(claim["at"]), claim["id"]) > (before, request_id):
                continue
            queues[claim["pool"]].add(Request(claim["id"], claim["team"], int(claim["gpus"]), int(claim["priority"]), float(claim["arrived"])))
        return queues

    def _turn(self, queues: Mapping[str, PoolQueue], waiting: list[Waiting], pool: str, request: Request) -> Decision:
        """Admission's decision on `pool`, unless a step ahead of this one in the queue could take it now."""
        if pool not in self.quotas.quotas:
            return Decision(True, f"pool {pool} {NOT_QUEUED}")
        decision = queues[pool].decide(request)
        if decision.admitted and (ahead := self._ahead(request, waiting, queues, pool)) is not None:
            return Decision(False, f"would be admitted, but {ahead} is ahead of it in the queue; waits its turn")
        return decision

    def _ahead(self, mine: Request, waiting: list[Waiting], queues: Mapping[str, PoolQueue], pool: str) -> str | None:
        """A waiting step before `mine` in queue order that could start on `pool` now, in words."""
        others = {w.request.id: w for w in waiting if pool in w.candidates}
        if not others:
            return None
        requests = [Request(i, w.request.team, w.candidates[pool], w.request.priority, w.request.arrived) for i, w in others.items()]
        for request in order([*requests, mine], queues.values(), on=queues[pool]):
            if request.id == mine.id:
                return None
            if queues[pool].decide(request).admitted:
                return f"{others[request.id].step} of team {request.team}"
        return None

    def _stop(self, decision: Decision, records: list[dict[str, Any]], spec: StepSpec) -> None:
        """Give each victim its notice (once) and leave the marker its worker books the cause from."""
        by_id = {f"{r['handle']['backend']}:{r['handle']['job_id']}": r for r in records}
        for victim in decision.preempt:
            if victim in by_id and victim not in self.signalled:
                _notice(self.storage, by_id[victim], cause="quota", by=spec.name, reason=decision.reason)
                self.signalled.add(victim)


def _notice(storage: Storage, record: dict[str, Any], *, cause: str, by: str, reason: str) -> None:
    """SIGTERM to an in-flight job (it checkpoints and exits 75), with the marker its own worker
    reads to book the attempt to `cause`."""
    from control_plane.compute.backends import backend_for
    from control_plane.compute.backends.base import JobHandle

    owner = record.get("owner", {})
    key = instance_key(owner.get("run_id", ""), owner.get("step", ""), owner.get("checkpoint_uri", ""))
    write_json_atomic(preempted_marker(storage, key), {"cause": cause, "by": by, "reason": reason, "at": time.time()})
    handle = JobHandle.from_json(record["handle"])
    backend_for(handle.backend).signal(handle, signal.SIGTERM)


def _request_json(r: Request) -> dict[str, Any]:
    return {"id": r.id, "team": r.team, "gpus": r.gpus, "priority": r.priority, "arrived": r.arrived}


def _claimed_at(claims: Claims, request_id: str) -> float:
    mine = next((c for c in claims.live() if c["id"] == request_id), None)
    return float(mine["at"]) if mine else time.time()


def waiting_id(run_id: str, step: str, checkpoint_uri: str) -> str:
    return f"{step}-{instance_key(run_id, step, checkpoint_uri)}-{os.getpid()}"
