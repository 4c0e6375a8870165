"""Sharded checkpoints: `torch.distributed.checkpoint` (DCP) under the usual step folder.

    <lineage>/step-00000050/dcp/.metadata         DCP's index of every tensor and its shards
    <lineage>/step-00000050/dcp/__0_0.distcp      what rank 0 wrote (one file per rank)
    <lineage>/step-00000050/manifest.json         written last, by rank 0: sha256 of each file

Every rank of a gang writes its part at once (`dcp.save`, replicated tensors written once), to
the object store through fsspec; rank 0 then publishes the step with the same manifest as a
safetensors checkpoint, so a torn or corrupt one is skipped the same way. Loading reshards: the
same folder loads onto one process or any number of ranks (`load_sharded`), which is how a gang
resumes on fewer or more nodes, or on another backend. Under a tenant's root each file is sealed
with its key (`sealed_dcp.py`). The folder is DCP's own format:
`torch.distributed.checkpoint.format_utils.dcp_to_torch_save` turns it into one `torch.save`
file; a run's final checkpoint is written as safetensors files for the registry.

A gang writes its cadence checkpoints **asynchronously** (`start_sharded_save`, DCP's
`async_save` on a gloo group of its own): the state is copied to host memory, training goes on
while the files are written, and rank 0 publishes the step once they all are. One write is in
flight at a time; a checkpoint on SIGTERM and the final one are written at once.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from workload_runtime.checkpoints import SHARDS, Checkpoint, CheckpointStore
from workload_runtime.sealed_dcp import SealingReader, SealingWriter
from workload_runtime.storage import fs_for, read_stored_bytes, sha256_bytes


def save_sharded(
    store: CheckpointStore,
    step: int,
    state: dict[str, Any],
    *,
    leader: bool = True,
    meta: Mapping[str, Any] | None = None,
    lineage: Mapping[str, Any] | None = None,
) -> str:
    """Write `state` (a DCP state dict) at `step` from every rank; rank 0 (`leader`) publishes it."""
    where = store.step_uri(step)
    shards = posixpath.join(where, SHARDS)
    dcp.save(state, storage_writer=SealingWriter(shards), no_dist=not dist.is_initialized())
    if leader:
        _publish(store, step, meta, lineage)
    return where


def _publish(store: CheckpointStore, step: int, meta: Mapping[str, Any] | None, lineage: Mapping[str, Any] | None) -> None:
    """Rank 0, once every rank's part is written: the step's manifest, which makes it valid."""
    shards = posixpath.join(store.step_uri(step), SHARDS)
    fs, root = fs_for(shards)
    entries = {}
    for path in sorted(fs.find(root)):
        data = read_stored_bytes(fs.unstrip_protocol(path) if "://" in shards else path)  # the manifest is of stored bytes
        sha = sha256_bytes(data)
        entries[posixpath.join(SHARDS, posixpath.relpath(path, root))] = {"sha256": sha, "bytes": len(data)}
        store.keep_on_node(data, sha, shards)
    store.publish(step, entries, meta=meta, lineage=lineage, layout=SHARDS)


@dataclass
class PendingSave:
    """A sharded checkpoint being written in the background; `wait()` finishes and publishes it."""

    step: int
    where: str
    future: Future
    publish: Callable[[], None]
    committed_seconds: float  # the attempt's productive time when the state was taken
    blocked_seconds: float  # what training waited for: the copy to host memory

    def done(self) -> bool:
        return self.future.done()

    def wait(self) -> None:
        self.future.result()
        self.publish()


def start_sharded_save(
    store: CheckpointStore,
    step: int,
    state: dict[str, Any],
    *,
    group: Any,
    leader: bool,
    committed_seconds: float,
    meta: Mapping[str, Any] | None = None,
    lineage: Mapping[str, Any] | None = None,
) -> PendingSave:
    """Start writing `state` at `step` from every rank of the gang (DCP's `async_save`, on the
    gloo `group` kept for checkpoints so it never crosses the training's collectives)."""
    began = time.monotonic()
    shards = posixpath.join(store.step_uri(step), SHARDS)
    response = dcp.async_save(state, storage_writer=SealingWriter(shards), process_group=group)
    future = getattr(response, "upload_completion", response)  # a Future, or DCP's response that holds one
    publish = (lambda: _publish(store, step, meta, lineage)) if leader else (lambda: None)
    return PendingSave(step, store.step_uri(step), future, publish, committed_seconds, round(time.monotonic() - began, 3))


def load_sharded(checkpoint: Checkpoint, state: dict[str, Any]) -> None:
    """Fill `state` (a DCP state dict of this rank's model and optimizer) from `checkpoint`,
    whatever number of ranks wrote it (from the node's copy when its cache holds one)."""
    dcp.load(state, storage_reader=SealingReader(checkpoint.shards_uri), no_dist=not dist.is_initialized())
