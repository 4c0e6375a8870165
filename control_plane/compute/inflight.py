"""Jobs in flight: what every backend records while an attempt runs, for the watcher sensor."""

from __future__ import annotations

import os
import time
from typing import Any

import dagster as dg

from control_plane.catalog.step_spec import StepSpec
from control_plane.compute.backends.base import JobHandle
from workload_runtime.inputs import WorkloadInputs
from workload_runtime.storage import Storage, fs_for, glob_uris, read_json, write_json_atomic


def attempt_owner(context: dg.AssetExecutionContext, spec: StepSpec, inputs: WorkloadInputs) -> dict[str, Any]:
    """Who an in-flight job belongs to: enough for the watcher to account for it alone."""
    return {
        "run_id": context.run_id,
        "step": spec.name,
        "asset": context.asset_key.to_user_string(),
        "partition": context.partition_key if context.has_partition_key else None,
        "attempt": inputs.attempt,
        "gpus": spec.gpus,
        "nodes": spec.nodes,  # a gang holds whole nodes: admission counts them (control_plane/queues)
        "gang": spec.gang,
        "priority_class": spec.priority_class,
        "expected_end": time.time() + spec.expected_hours * 3600,  # the queue's estimate of when its GPUs free up
        "tenant": spec.tenant,  # whose time it is, should it have to be booked without its worker
        # Which instance of the step: a sweep's shards run at once in one run, under one step name.
        "checkpoint_uri": inputs.checkpoint_uri,
    }


def inflight_of(inputs: WorkloadInputs) -> InFlight:
    """The in-flight records under the storage root the attempt's inputs name."""
    if not inputs.storage_root:
        raise ValueError("the attempt's inputs carry no `storage_root`: the compute resource always sets it")
    return InFlight(Storage.at(inputs.storage_root))


class InFlight:
    """Jobs submitted and not yet collected, one JSON file each under `state/inflight/`.

    The attempt loop adds a job when it submits and removes it when it collects; what stays
    behind belongs to an orchestrator process that died, and the watcher sensor looks at it.
    """

    def __init__(self, storage: Storage):
        self.storage = storage

    def _uri(self, handle: JobHandle) -> str:
        return self.storage.uri("state", "inflight", f"{handle.backend}-{handle.pool}-{handle.job_id}.json".replace("/", "_"))

    def add(self, handle: JobHandle, **owner: Any) -> None:
        write_json_atomic(self._uri(handle), {"handle": handle.to_json(), "owner": owner, "pid": os.getpid()})

    def remove(self, handle: JobHandle) -> None:
        fs, path = fs_for(self._uri(handle))
        if fs.exists(path):
            fs.rm_file(path)

    def records(self) -> list[dict[str, Any]]:
        """Every in-flight record, each with its own `uri`. A record removed between the listing
        and its read (its attempt ended meanwhile) is no longer in flight, and is left out."""
        found = []
        for uri in glob_uris(self.storage.uri("state", "inflight", "*.json")):
            try:
                found.append({**read_json(uri), "uri": uri})
            except FileNotFoundError:
                continue
        return found

    def discard(self, record: dict[str, Any]) -> None:
        fs, path = fs_for(record["uri"])
        if fs.exists(path):
            fs.rm_file(path)
