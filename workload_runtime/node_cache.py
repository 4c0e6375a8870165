"""The node-local cache: datasets and checkpoints a workload reads, kept on the node by content hash.

Every attempt used to read its dataset and its checkpoint from the storage root again, so a
resume or a scale-up on the same node downloaded it all once more. Now a workload reads them
through this cache: the first reader on a node downloads each file once, later attempts and the
other ranks on that node read the local copy.

Layout of the cache folder (one per node, shared by every attempt and rank on it)::

    objects/<sha256[:2]>/<sha256>    each file once, by the sha256 of its content (read-only)
    trees/<key>.json                 a folder's listing on the store: per file, size, store tag, sha256
    views/<key>/...                  the folder as the reader sees it: hard links to the objects
    .lock                            one fetch or eviction at a time on this node (flock)

- **Verified on use.** A file is used only when its bytes still hash to the sha256 recorded when
  it was fetched (a checkpoint file: the sha256 in its manifest). A file that fails the check is
  fetched again, with a warning.
- **Current.** A folder is listed on the store before each use (one listing, no data): a file
  whose size or store tag (S3's ETag, a file's mtime) changed is fetched again.
- **Bounded.** After each fetch the least recently used folders, then files no folder holds,
  are removed until the objects fit in `max_bytes`. A folder larger than the whole bound is not
  cached: it is read from the store, with a warning.
- **Only what is remote.** A URI on an object store (`s3://`, `gs://`, ...) is cached; a local
  path is read where it is (copying a local folder to the same disk gains nothing), unless
  `SINEWGRID_NODE_CACHE_LOCAL=1` (a storage root on a network file system).

Set on the node (the orchestrator's settings do not travel there): `SINEWGRID_NODE_CACHE_DIR`
(default `~/.cache/sinewgrid/data`; put it on the node's local NVMe), `SINEWGRID_NODE_CACHE_MAX_GB`
(default: a quarter of that disk, at most 100 GB; `0` turns the cache off). Workload side:
standard library and fsspec only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import posixpath
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workload_runtime.node import cache_dir
from workload_runtime.node_env import NODE_CACHE_MAX_GB_ENV as MAX_GB_ENV
from workload_runtime.node_env import node_env
from workload_runtime.storage import fs_for

DEFAULT_MAX_BYTES = 100 * 10**9
_HASH_CHUNK = 8 << 20


class NodeCacheError(ValueError):
    """The node's cache settings cannot be used; the message names the setting and the fix."""


@dataclass(frozen=True)
class Fetched:
    """What one read through the cache gave: where to read it, and where its bytes came from."""

    path: str  # a local folder or file (or the URI itself when it was not cached)
    cache_bytes: int  # bytes found on the node, verified
    store_bytes: int  # bytes read from the storage root


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _tag(info: Mapping[str, Any]) -> str:
    """What changes on the store when a file is rewritten: S3's ETag, else its modification time."""
    for key in (
        "ETag",
        "etag",
        "md5Hash",
        "mtime",
        "LastModified",
        "last_modified",
        "created",
    ):
        if info.get(key) is not None:
            return str(info[key])
    return ""


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


class NodeCache:
    """A size-bounded cache folder on this node; see the module docstring."""

    def __init__(
        self,
        root: str | Path,
        max_bytes: int,
        *,
        warn: Callable[[str], None] | None = None,
        cache_local: bool = False,
    ):
        if max_bytes <= 0:
            raise NodeCacheError(f"the node cache needs a positive size bound (got {max_bytes} bytes); set {MAX_GB_ENV} above 0, or use no cache")
        self.root = Path(root)
        self.max_bytes = int(max_bytes)
        self.cache_local = cache_local
        self._warn = warn or (lambda msg: None)
        for sub in ("objects", "trees", "views"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_env(cls, warn: Callable[[str], None] | None = None) -> NodeCache | None:
        """The node's cache as its environment sets it; None when `SINEWGRID_NODE_CACHE_MAX_GB=0`."""
        env = node_env()
        root = cache_dir("data")
        raw = env.node_cache_max_gb
        if raw:
            try:
                gigabytes = float(raw)
            except ValueError:
                raise NodeCacheError(
                    f"{MAX_GB_ENV}={raw!r} is not a number of gigabytes; set it to e.g. 50, or 0 to turn the node cache off"
                ) from None
            if gigabytes < 0:
                raise NodeCacheError(f"{MAX_GB_ENV}={raw!r} is negative; set it to the gigabytes the cache may use, or 0 to turn it off")
            if gigabytes == 0:
                return None
            max_bytes = int(gigabytes * 10**9)
        else:
            root.mkdir(parents=True, exist_ok=True)
            max_bytes = min(DEFAULT_MAX_BYTES, shutil.disk_usage(root).total // 4)
        return cls(
            root,
            max_bytes,
            warn=warn,
            cache_local=env.node_cache_local,
        )

    def caches(self, uri: str) -> bool:
        """Whether reads of `uri` go through this cache (remote URIs; local ones when asked to)."""
        return is_remote(uri) or self.cache_local

    # Objects ------------------------------------------------------------------
    def _object(self, sha256: str) -> Path:
        return self.root / "objects" / sha256[:2] / sha256

    def _verified(self, sha256: str, size: int | None = None) -> Path | None:
        """The object of `sha256`, if present and its bytes still hash to it (else it is removed)."""
        path = self._object(sha256)
        if not path.exists() or (size is not None and path.stat().st_size != size):
            return None
        if _sha256_file(path) != sha256:
            self._warn(f"node cache: {path} no longer matches its sha256 (corrupt on this disk); fetching it again")
            path.unlink(missing_ok=True)
            return None
        os.utime(path)  # recently used: evicted last
        return path

    def _adopt(self, source: Path, sha256: str) -> Path:
        """Move a file whose content hashes to `sha256` into the objects (atomically), read-only."""
        target = self._object(sha256)
        target.parent.mkdir(parents=True, exist_ok=True)
        source.chmod(0o444)
        os.replace(source, target)
        return target

    def put_bytes(self, data: bytes, sha256: str) -> None:
        """Keep bytes this node has just written (a checkpoint file): its next reader finds them here."""
        if self._object(sha256).exists() or len(data) > self.max_bytes:
            return
        tmp = self.root / "objects" / f".tmp-{uuid.uuid4().hex}"
        tmp.write_bytes(data)
        self._adopt(tmp, sha256)
        with self._locked():
            self._evict(keep=set())

    def read_file(self, uri: str, sha256: str, size: int) -> tuple[bytes, Fetched]:
        """The bytes of one file whose sha256 is known (a checkpoint file, from its manifest).

        From the node when a verified copy is there; else from the store, kept here when they
        match `sha256` (bytes that do not are returned as read, for the caller to reject)."""
        if not self.caches(uri):
            fs, path = fs_for(uri)
            data = fs.cat_file(path)
            return data, Fetched(uri, 0, len(data))
        path = self._object(sha256)
        if path.exists() and path.stat().st_size == size:
            data = path.read_bytes()  # read once: hashed here, handed back as it is
            if hashlib.sha256(data).hexdigest() == sha256:
                os.utime(path)  # recently used: evicted last
                return data, Fetched(str(path), size, 0)
            self._warn(f"node cache: {path} no longer matches its sha256 (corrupt on this disk); fetching it again")
            path.unlink(missing_ok=True)
        fs, path = fs_for(uri)
        data = fs.cat_file(path)
        if hashlib.sha256(data).hexdigest() == sha256 and len(data) <= self.max_bytes:
            self.put_bytes(data, sha256)
        return data, Fetched(uri, 0, len(data))

    def view_of(self, key_uri: str, files: Mapping[str, str]) -> str | None:
        """A local folder holding `files` (relative path -> sha256), all of them already objects
        here (e.g. a sharded checkpoint just read through `read_file`); None if one is missing."""
        with self._locked():
            objects = {rel: self._object(sha) for rel, sha in files.items()}
            if not all(p.exists() for p in objects.values()):
                return None
            view = self._link_view(self._key(key_uri), objects)
            self._touch_tree(
                self._key(key_uri),
                key_uri,
                {rel: {"sha256": sha} for rel, sha in files.items()},
            )
            return str(view)

    # Folders ------------------------------------------------------------------
    def fetch(self, uri: str) -> Fetched:
        """A local copy of the folder (or file) at `uri`, current with the store and verified.

        Only the files that are missing here, changed on the store, or fail their hash are read
        from the store; the others come from the node."""
        fs, path = fs_for(uri)
        found = fs.find(path, detail=True)
        # rel path -> (its path on the store, its listing entry); a single file is its own name
        listing = {
            (posixpath.relpath(p, path) if p.rstrip("/") != path.rstrip("/") else posixpath.basename(p)): (p, info) for p, info in found.items()
        }
        total = sum(int(info.get("size") or 0) for _, info in listing.values())
        if not listing:
            raise FileNotFoundError(f"nothing to read at {uri}: the store lists no file there")
        if not self.caches(uri):
            return Fetched(uri, 0, total)
        if total > self.max_bytes:
            self._warn(
                f"node cache: {uri} ({total / 1e9:.2f} GB) is larger than the whole cache ({self.max_bytes / 1e9:.2f} GB); "
                f"reading it from the store. Raise {MAX_GB_ENV} to cache it."
            )
            return Fetched(uri, 0, total)
        key = self._key(uri)
        with self._locked():
            known = self._read_tree(key).get("files", {})
            files: dict[str, dict[str, Any]] = {}
            wanted: dict[str, tuple[str, Mapping[str, Any]]] = {}
            cache_bytes = 0
            for rel, (remote, info) in listing.items():
                size, tag = int(info.get("size") or 0), _tag(info)
                entry = known.get(rel)
                if entry and entry.get("size") == size and entry.get("tag") == tag and self._verified(entry["sha256"], size):
                    files[rel] = entry
                    cache_bytes += size
                else:
                    wanted[rel] = (remote, info)
            store_bytes = self._download(fs, wanted, files)
            view = self._link_view(key, {rel: self._object(e["sha256"]) for rel, e in files.items()})
            self._touch_tree(key, uri, files)
            self._evict(keep={key})
        single = len(listing) == 1 and next(iter(listing)) == posixpath.basename(path)
        return Fetched(
            str(view / next(iter(listing))) if single else str(view),
            cache_bytes,
            store_bytes,
        )

    def _download(
        self,
        fs: Any,
        wanted: Mapping[str, tuple[str, Mapping[str, Any]]],
        files: dict[str, dict[str, Any]],
    ) -> int:
        """Fetch `wanted` in one batched `get` (s3fs runs it concurrently), hash each file into
        the objects, and record it in `files`. Returns the bytes read."""
        if not wanted:
            return 0
        with tempfile.TemporaryDirectory(dir=self.root / "objects", prefix=".fetch-") as tmp:
            rels = sorted(wanted)
            local = [os.path.join(tmp, f"{i:08d}") for i in range(len(rels))]
            fs.get([wanted[rel][0] for rel in rels], local)
            read = 0
            for rel, target in zip(rels, local, strict=True):
                size = os.path.getsize(target)
                sha = _sha256_file(Path(target))
                self._adopt(Path(target), sha)
                files[rel] = {"size": size, "tag": _tag(wanted[rel][1]), "sha256": sha}
                read += size
        return read

    def _link_view(self, key: str, objects: Mapping[str, Path]) -> Path:
        """The folder `views/<key>`: each relative path a hard link to its object. Rebuilt
        beside the old one and swapped in when anything differs."""
        view = self.root / "views" / key
        if view.exists() and all((view / rel).exists() and (view / rel).stat().st_ino == obj.stat().st_ino for rel, obj in objects.items()):
            return view
        fresh = self.root / "views" / f".{key}-{uuid.uuid4().hex[:8]}"
        for rel, obj in objects.items():
            (fresh / rel).parent.mkdir(parents=True, exist_ok=True)
            os.link(obj, fresh / rel)
        if view.exists():
            stale = self.root / "views" / f".stale-{key}-{uuid.uuid4().hex[:8]}"
            os.replace(view, stale)
            shutil.rmtree(stale, ignore_errors=True)
        os.replace(fresh, view)
        return view

    # Index, lock, eviction -----------------------------------------------------
    @staticmethod
    def _key(uri: str) -> str:
        return hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:32]

    def _read_tree(self, key: str) -> dict[str, Any]:
        try:
            return json.loads((self.root / "trees" / f"{key}.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def _touch_tree(self, key: str, uri: str, files: Mapping[str, Any]) -> None:
        tmp = self.root / "trees" / f".{key}-{uuid.uuid4().hex[:8]}"
        tmp.write_text(
            json.dumps(
                {"uri": uri, "used_at": time.time(), "files": dict(files)},
                sort_keys=True,
            )
        )
        os.replace(tmp, self.root / "trees" / f"{key}.json")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with (self.root / ".lock").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def used_bytes(self) -> int:
        """The bytes the objects take (each file once, however many folders hold it)."""
        return sum(p.stat().st_size for p in (self.root / "objects").glob("??/*"))

    def _evict(self, keep: set[str]) -> None:
        """Remove what was used least recently (a whole folder with the files only it held, or a
        file no folder holds) until the objects fit in the bound. Folders in `keep` stay."""
        used = self.used_bytes()
        if used <= self.max_bytes:
            return
        candidates: list[tuple[float, str, Any]] = [
            (tree.get("used_at", 0.0), "folder", p.stem)
            for p in (self.root / "trees").glob("*.json")
            if p.stem not in keep and (tree := self._read_tree(p.stem))
        ]
        candidates += [(p.stat().st_mtime, "file", p) for p in (self.root / "objects").glob("??/*") if p.stat().st_nlink == 1]
        for _, kind, item in sorted(candidates, key=lambda c: c[0]):
            if used <= self.max_bytes:
                break
            if kind == "file":
                used -= self._unlink_loose(item)
                continue
            held = {e["sha256"] for e in self._read_tree(item).get("files", {}).values()}
            shutil.rmtree(self.root / "views" / item, ignore_errors=True)
            (self.root / "trees" / f"{item}.json").unlink(missing_ok=True)
            for sha in held:
                used -= self._unlink_loose(self._object(sha))

    @staticmethod
    def _unlink_loose(path: Path) -> int:
        """Remove an object no folder links to; the bytes freed (0 if a folder still holds it)."""
        try:
            stat = path.stat()
        except FileNotFoundError:
            return 0
        if stat.st_nlink > 1:
            return 0
        path.unlink(missing_ok=True)
        return stat.st_size
