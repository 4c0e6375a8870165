"""The storage root and its layout: every path is a URI handled through fsspec.

A local folder by default (`SINEWGRID_HOME`, else `.sinewgrid/` in the checkout: see
`control_plane.settings`); `s3://bucket/prefix` in production needs no code change.
Workload side as well: imports fsspec, never Dagster, and reads no environment.

Layout under the root::

    landing/assays/<drop_id>/        what labs drop (never changed by the platform)
    raw/assays/<drop_id>/            byte-for-byte copies of accepted drops
    quarantine/assays/<drop_id>/     copies of rejected drops + QUARANTINE.json/.md
    curated/assays/<drop_id>/        validated, typed plate tables (Parquet)
    curated/omics/<version>.zarr     versioned AnnData training sets
    checkpoints/<lineage>/step-N/    safetensors + manifest.json (written last)
    artifacts/<asset>/<version>/     model outputs (predictions, reports)
    outbox/plates/<proposal_id>/     plate worklists for the lab
    ledger/ledger.db                 the attempt ledger (SQLite unless SINEWGRID_LEDGER_URL says otherwise)
    tenants/<tenant>/...             each tenant's own root, with the same layout (docs/tenancy.md);
                                     its weights and data sealed with its key
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import queue
import threading
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from workload_runtime.envelope import seal_bytes
from workload_runtime.keys import KeyUnavailable
from workload_runtime.tenant_access import keyring_for, open_stored

def _normalise_root(root: str) -> str:
    if "://" in root:
        return root.rstrip("/")
    return str(Path(root).expanduser().resolve())


@dataclass(frozen=True)
class Storage:
    """One storage root and the helpers to read and write under it atomically."""

    root: str

    @classmethod
    def at(cls, root: str) -> Storage:
        return cls(_normalise_root(root))

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        return fs_for(self.root)[0]

    @property
    def is_local(self) -> bool:
        return "://" not in self.root or self.root.startswith("file://")

    def uri(self, *parts: str) -> str:
        """The URI of a path under the root, e.g. `uri("raw", "assays", drop_id)`."""
        return posixpath.join(self.root, *[p.strip("/") for p in parts if p])

    # Layout -----------------------------------------------------------------
    def landing(self, kind: str, drop_id: str = "") -> str:
        return self.uri("landing", kind, drop_id)

    def raw(self, kind: str, drop_id: str = "") -> str:
        return self.uri("raw", kind, drop_id)

    def quarantine(self, kind: str, drop_id: str = "") -> str:
        return self.uri("quarantine", kind, drop_id)

    def curated(self, *parts: str) -> str:
        return self.uri("curated", *parts)

    def checkpoints(self, lineage: str) -> str:
        return self.uri("checkpoints", lineage)

    def artifacts(self, *parts: str) -> str:
        return self.uri("artifacts", *parts)

    def outbox(self, *parts: str) -> str:
        return self.uri("outbox", *parts)

    def ledger(self) -> str:
        return self.uri("ledger", "attempts")


def fs_for(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and its own path for a URI (local paths or any fsspec scheme).

    On an object store every listing asks the store: other processes write there (a lab system
    uploading a drop, a workload its checkpoints, another code server), and fsspec's listings cache,
    which never expires by default, would hide what they wrote from a process that lives long (the
    code server the daemon asks for each sensor tick saw no drop uploaded after its first listing).
    """
    if "://" in uri and not uri.startswith("file://"):
        return url_to_fs(uri, use_listings_cache=False)
    return url_to_fs(uri)


def exists(uri: str) -> bool:
    fs, path = fs_for(uri)
    return fs.exists(path)


def read_bytes(uri: str) -> bytes:
    """An object's bytes; a sealed one (a tenant's weights or data, `workload_runtime/envelope.py`) opened
    with the tenant's key this process holds (`KeyUnavailable` when it holds none or the key is disabled).

    Under a tenant's root whose key this process holds, an object that is plain or sealed for
    another tenant is refused (`NotSealedForTenant`), outside the root's plain areas.
    """
    fs, path = fs_for(uri)
    return open_stored(uri, fs.cat_file(path))


def read_objects(fs: fsspec.AbstractFileSystem, paths: list[str]) -> dict[str, bytes | BaseException]:
    """Many objects of one filesystem at once (`fs.cat`, concurrent on an object store), each
    opened and checked as `read_bytes` does; an error stands in place of the bytes it stopped, but
    a key this process cannot use (`KeyUnavailable`) stops the whole read: nothing can be said of them."""
    found = fs.cat(paths, on_error="return") if paths else {}
    local = isinstance(fs, LocalFileSystem)
    opened: dict[str, bytes | BaseException] = {}
    for path, data in found.items():
        if not isinstance(data, BaseException):
            try:
                data = open_stored(path if local else fs.unstrip_protocol(path), data)
            except KeyUnavailable:
                raise
            except Exception as exc:  # noqa: BLE001 - handed to the caller in the object's place
                data = exc
        opened[path] = data
    return opened


def read_stored_bytes(uri: str) -> bytes:
    """An object's bytes exactly as stored (sealed objects stay sealed)."""
    fs, path = fs_for(uri)
    return fs.cat_file(path)


def read_json(uri: str) -> Any:
    return json.loads(read_bytes(uri))


def write_bytes_atomic(uri: str, data: bytes) -> None:
    """Write so that readers see the old object or the whole new one, never a torn one.

    Under a storage root whose tenant has a key (registered in this process,
    `workload_runtime/tenant_access.py`) the bytes are sealed with a data key of their own before
    they leave the writer: everything the platform writes there is, outside the root's plain
    areas (landing/, outbox/).

    Object stores publish a PUT atomically (and have no folders to make: asking s3fs to make
    one costs a request per write); on a file system we write a temporary sibling and rename
    it into place.
    """
    if (keyring := keyring_for(uri)) is not None:
        data = seal_bytes(data, keyring)
    fs, path = fs_for(uri)
    if isinstance(fs, LocalFileSystem):
        if parent := posixpath.dirname(path):
            fs.makedirs(parent, exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with fs.open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    else:
        fs.pipe_file(path, data)


def write_chunks_atomic(uri: str, chunks: Iterable[bytes | memoryview], keep: bool = False) -> tuple[str, int, bytes | None]:
    """Write one object from `chunks` as they are made, atomically as `write_bytes_atomic` does;
    a second thread writes and hashes each chunk while this one makes the next (file writes and
    sha256 let go of the GIL). Returns the sha256 and size of what was stored, and (`keep`) its bytes."""
    fs, path = fs_for(uri)
    local = isinstance(fs, LocalFileSystem)
    if local and (parent := posixpath.dirname(path)):
        fs.makedirs(parent, exist_ok=True)
    target = f"{path}.tmp-{uuid.uuid4().hex[:8]}" if local else path
    pending: queue.Queue = queue.Queue(maxsize=4)
    digest, kept, size = hashlib.sha256(), [], 0
    abandoned = threading.Event()  # the chunks stopped coming: publish nothing

    def write() -> None:
        nonlocal size
        fh = fs.open(target, "wb")
        try:
            while (chunk := pending.get()) is not None:
                fh.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                if keep:
                    kept.append(bytes(chunk))
        except BaseException:
            abandoned.set()
        if abandoned.is_set():
            getattr(fh, "discard", fh.close)()  # an object store's upload is dropped, not committed half-way
            raise RuntimeError(f"writing {uri} was abandoned; nothing was published there")
        fh.close()

    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            writer = pool.submit(write)
            try:
                for chunk in chunks:
                    while not _handed(pending, chunk):
                        if writer.done():
                            writer.result()  # the writer failed: say why
            except BaseException:
                abandoned.set()
                raise
            finally:
                if not writer.done():
                    pending.put(None)
            writer.result()
    except BaseException:
        if local and fs.exists(target):
            fs.rm(target)  # no half-written temporary file is left beside the object
        raise
    if local:
        os.replace(target, path)
    return digest.hexdigest(), size, b"".join(kept) if keep else None


def _handed(pending: queue.Queue, chunk: bytes | memoryview) -> bool:
    try:
        pending.put(chunk, timeout=0.5)
    except queue.Full:
        return False
    return True


def write_json_atomic(uri: str, payload: Any) -> None:
    write_bytes_atomic(uri, (json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n").encode())


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def glob_uris(pattern_uri: str) -> list[str]:
    """Every object matching a glob under a URI, sorted, as URIs (a local path stays a path)."""
    fs, pattern = fs_for(pattern_uri)
    found = sorted(fs.glob(pattern))
    return [fs.unstrip_protocol(p) for p in found] if "://" in pattern_uri else found
