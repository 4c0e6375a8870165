"""Checkpoints as safetensors files plus a JSON manifest, published manifest-last.

    <lineage>/step-00000050/model.safetensors
    <lineage>/step-00000050/optimizer.safetensors
    <lineage>/step-00000050/manifest.json      <- written last; its presence publishes

A gang's checkpoint (`workload_runtime/sharded.py`) keeps its tensors as a `torch.distributed.checkpoint`
folder, `dcp/`, written by every rank, under the same manifest (layout `dcp`), and loads onto
any number of ranks.

A step folder without a manifest (torn: the writer died mid-way) or whose files do
not match the manifest's sha256 (corrupt) is skipped with a warning, and the newest
valid checkpoint before it is used. Files open with `safetensors.safe_open` anywhere.

Tensors are torch tensors or numpy arrays (the file format is the same); a store reads
them back as the framework it was opened with, and imports torch only when that is torch,
so a workload without a model (a rollout shard, a test's counter) starts without it.

Failure drills test the torn case for real with a failpoint that travels in the workload's
inputs (`Failpoint` in `workload_runtime/inputs.py`): the writer of the first checkpoint at or after
its step kills itself (SIGKILL) after its tensor files and before its manifest, once.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import posixpath
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from workload_runtime.inputs import Failpoint
from workload_runtime.node_cache import NodeCache
from workload_runtime.storage import fs_for, read_bytes, read_stored_bytes, sha256_bytes, write_chunks_atomic, write_json_atomic
from workload_runtime.tenant_access import check_seal, keyring_for, opener
from workload_runtime.envelope import CHUNK_BYTES, SealedDataError, Sealer, is_sealed

Framework = Literal["torch", "numpy"]
MANIFEST = "manifest.json"
FORMAT = "sinewgrid.checkpoint/v1"
SHARDS = "dcp"  # the folder of a sharded checkpoint's `torch.distributed.checkpoint` files
_STEP_DIR = re.compile(r"^step-(\d{8})$")


def _failpoint_torn(failpoint: Failpoint | None, step: int) -> None:
    """The torn-checkpoint failpoint (see `Failpoint`); a no-op unless armed."""
    if failpoint is None or failpoint.kind != "torn-checkpoint" or step < failpoint.at_step:
        return
    try:
        fd = os.open(failpoint.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return  # fired once already
    os.write(fd, json.dumps({"step": step, "at": time.time(), "pid": os.getpid()}).encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def _slices(data: bytes, size: int = CHUNK_BYTES) -> Iterator[memoryview]:
    view = memoryview(data)
    return (view[i : i + size] for i in range(0, len(view), size))


def to_safetensors(tensors: Mapping[str, Any]) -> bytes:
    """One safetensors file of torch tensors or of numpy arrays."""
    if all(isinstance(v, np.ndarray) for v in tensors.values()):
        from safetensors.numpy import save

        return save({k: np.ascontiguousarray(v) for k, v in tensors.items()})
    from safetensors.torch import save

    return save({k: v.contiguous() for k, v in tensors.items()})


def from_safetensors(data: bytes, framework: Framework) -> dict[str, Any]:
    """The tensors of one safetensors file, as torch tensors or numpy arrays."""
    if framework == "numpy":
        from safetensors.numpy import load
    else:
        from safetensors.torch import load
    return load(data)


@dataclass(frozen=True)
class Checkpoint:
    """A valid checkpoint: its tensors by file, and its manifest."""

    uri: str
    step: int
    final: bool
    tensors: dict[str, dict[str, Any]]  # file stem -> name -> tensor (empty when sharded)
    manifest: dict[str, Any]
    local_uri: str | None = None  # the same step folder on this node (its node cache), when there is one

    @property
    def meta(self) -> dict[str, Any]:
        return self.manifest.get("meta", {})

    @property
    def sharded(self) -> bool:
        """Its tensors are a `torch.distributed.checkpoint` folder (`shards_uri`), loaded with
        `workload_runtime/sharded.py` onto any number of ranks, not safetensors files."""
        return self.manifest.get("layout") == SHARDS

    @property
    def shards_uri(self) -> str:
        """Where to read its `torch.distributed.checkpoint` folder: the node's copy when it has one."""
        return posixpath.join(self.local_uri or self.uri, SHARDS)


@dataclass
class _Opened:
    """What opening a stored file gave: its plaintext, or the error (KeyUnavailable stops the load:
    it is not corruption), kept until the file's sha256 says whether it is the file written."""

    value: bytes | None = None
    error: BaseException | None = None

    def result(self) -> bytes:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


def _hash_while(data: bytes, open_it: Callable[[], bytes] | None) -> tuple[str, _Opened]:
    """The sha256 of `data`, made on a second thread while this one opens it (hashlib lets go of the
    GIL): a sealed file's check and its decryption overlap. The plaintext is used only once the
    hash matches the manifest."""
    opened = _Opened()
    if open_it is None:
        return sha256_bytes(data), opened
    with ThreadPoolExecutor(max_workers=1) as pool:
        digest = pool.submit(sha256_bytes, data)
        try:
            opened.value = open_it()
        except Exception as exc:  # noqa: BLE001  # told by `result()`, after the hash
            opened.error = exc
        return digest.result(), opened


class CheckpointStore:
    """The checkpoints of one lineage (one training run's identity) under a URI, read back as
    `framework` tensors.

    With a node `cache` (a workload's, `workload_runtime/node_cache.py`), the files it writes are kept on
    the node and the files it reads come from there when their sha256 matches the manifest, so
    a resume on the same node reads no checkpoint bytes from the store; `read_bytes` counts
    `(from the node, from the store)`.
    """

    def __init__(
        self,
        uri: str,
        warn: Callable[[str], None] | None = None,
        failpoint: Failpoint | None = None,
        framework: Framework = "torch",
        cache: NodeCache | None = None,
    ):
        self.uri = uri.rstrip("/")
        self.framework = framework
        self._warn = warn or (lambda msg: None)
        self._failpoint = failpoint
        self.cache = cache
        self.read_bytes = [0, 0]  # bytes read (from the node cache, from the store)

    def step_uri(self, step: int) -> str:
        return posixpath.join(self.uri, f"step-{step:08d}")

    def steps(self) -> list[int]:
        """Every step folder present, valid or not, oldest first."""
        fs, path = fs_for(self.uri)
        if not fs.exists(path):
            return []
        found = []
        for entry in fs.ls(path, detail=False):
            match = _STEP_DIR.match(posixpath.basename(entry.rstrip("/")))
            if match:
                found.append(int(match.group(1)))
        return sorted(found)

    def save(
        self,
        step: int,
        files: Mapping[str, Mapping[str, Any]],
        *,
        meta: Mapping[str, Any] | None = None,
        lineage: Mapping[str, Any] | None = None,
        final: bool = False,
    ) -> str:
        """Write one checkpoint: each safetensors file, then the manifest that publishes it.

        Under a tenant's root (its key registered in this process) each file is sealed with the
        checkpoint's own data key before it leaves the writer; the manifest's sha256 is of the
        stored bytes, and the manifest names the key (`sealed_with`), never holding it.
        """
        where = self.step_uri(step)
        keyring = keyring_for(self.uri)
        sealer = Sealer(keyring) if keyring is not None else None
        entries = {}
        keep = self.cache is not None and self.cache.caches(where)
        for stem, tensors in files.items():
            data = to_safetensors(tensors)
            # Sealed or plain, the same writer: chunks written and hashed while the next is made.
            chunks = sealer.seal_chunks(data) if sealer is not None else _slices(data)
            sha256, size, stored = write_chunks_atomic(posixpath.join(where, f"{stem}.safetensors"), chunks, keep=keep)
            entries[f"{stem}.safetensors"] = {"sha256": sha256, "bytes": size}
            if stored is not None:
                self.keep_on_node(stored, sha256, where)
        sealed = {"tenant": sealer.tenant, "key_id": sealer.key_id} if sealer is not None else None
        return self.publish(step, entries, meta=meta, lineage=lineage, final=final, sealed_with=sealed)

    def publish(
        self,
        step: int,
        entries: Mapping[str, Mapping[str, Any]],
        *,
        meta: Mapping[str, Any] | None = None,
        lineage: Mapping[str, Any] | None = None,
        final: bool = False,
        layout: str = "safetensors",
        sealed_with: Mapping[str, str] | None = None,
    ) -> str:
        """Write the manifest of step `step` (its files, already written, with their sha256 and
        size): from now on readers see the checkpoint."""
        where = self.step_uri(step)
        _failpoint_torn(self._failpoint, step)
        write_json_atomic(
            posixpath.join(where, MANIFEST),
            {
                "format": FORMAT,
                "layout": layout,
                "step": step,
                "final": final,
                "created_at": dt.datetime.now(dt.UTC).isoformat(),
                "files": dict(entries),
                "lineage": dict(lineage or {}),
                "meta": dict(meta or {}),
                **({"sealed_with": dict(sealed_with)} if sealed_with else {}),
            },
        )
        return where

    def keep_on_node(self, data: bytes, sha256: str, uri: str) -> None:
        """A file this process just wrote, kept in the node cache for the next reader here."""
        if self.cache is not None and self.cache.caches(uri):
            self.cache.put_bytes(data, sha256)

    def _read(self, uri: str, expected: Mapping[str, Any]) -> bytes:
        if self.cache is None:
            data = read_stored_bytes(uri)
            self.read_bytes[1] += len(data)
            return data
        data, fetched = self.cache.read_file(uri, str(expected.get("sha256")), int(expected.get("bytes") or 0))
        self.read_bytes[0] += fetched.cache_bytes
        self.read_bytes[1] += fetched.store_bytes
        return data

    def drop_shards(self, step: int) -> None:
        """Remove the sharded files of step `step` once its final checkpoint replaced them (the
        last training step checkpoints on its cadence, then the run publishes its final one)."""
        fs, path = fs_for(posixpath.join(self.step_uri(step), SHARDS))
        if fs.exists(path):
            fs.rm(path, recursive=True)

    def _load(self, step: int) -> Checkpoint | None:
        where = self.step_uri(step)
        manifest_uri = posixpath.join(where, MANIFEST)
        fs, manifest_path = fs_for(manifest_uri)
        if not fs.exists(manifest_path):
            self._warn(f"checkpoint {where} is torn (no {MANIFEST}: the writer stopped before publishing); skipped")
            return None
        try:
            manifest = json.loads(read_bytes(manifest_uri))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            self._warn(f"checkpoint {where} has an unreadable manifest ({exc}); skipped")
            return None
        tensors = {}
        unsealer = opener()  # one unwrap of the checkpoint's data key for all its files
        for name, expected in manifest.get("files", {}).items():
            file_uri = posixpath.join(where, name)
            try:
                data = self._read(file_uri, expected)
            except FileNotFoundError:
                self._warn(f"checkpoint {where} is missing {name}; skipped")
                return None
            opening = name.endswith(".safetensors") and is_sealed(data)  # a gang's shards are opened as DCP reads them (`sharded.py`)
            if opening:
                try:
                    check_seal(file_uri, data)  # another tenant's is refused before it is opened
                except SealedDataError:
                    opening = False  # a header cut short: its sha256 below says corrupt
            digest, plain = _hash_while(data, (lambda: unsealer.open(data)) if opening else None)
            if digest != expected.get("sha256") or len(data) != expected.get("bytes"):
                self._warn(f"checkpoint {where}: {name} does not match its manifest sha256 (corrupt); skipped")
                return None
            check_seal(file_uri, data)  # plain or another tenant's under a tenant's root: refused, not skipped
            if name.endswith(".safetensors"):
                tensors[name.removesuffix(".safetensors")] = from_safetensors(plain.result() if opening else data, self.framework)
        local = None
        if manifest.get("layout") == SHARDS and self.cache is not None and self.cache.caches(where):
            local = self.cache.view_of(where, {name: e["sha256"] for name, e in manifest.get("files", {}).items()})
        return Checkpoint(where, int(manifest["step"]), bool(manifest.get("final")), tensors, manifest, local)

    def latest_valid(self) -> Checkpoint | None:
        """The newest checkpoint that is whole and matches its manifest, or None."""
        for step in reversed(self.steps()):
            checkpoint = self._load(step)
            if checkpoint is not None:
                return checkpoint
        return None
