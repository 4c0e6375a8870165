"""`sinewgrid tenants reseal TENANT`: a tenant's data moved to its current key and the current format.

What it moves, under the tenant's storage root (the landing zone and the outbox are the lab's
plain areas and stay as they are):

- every sealed object: opened with the key its header names (the tenant's current key, a retired
  local key kept by `sinewgrid tenants key rotate`, or an old KMS key passed with `--old-kms-key`),
  sealed again with the current key, checked, then put in place of the old one (one atomic write);
- each checkpoint step as a whole: its files are resealed beside it (`.reseal-<name>`), then a new
  manifest naming their new sha256 and key is made, then the files and the manifest are moved into
  place. A reseal stopped half-way picks a step up where it stopped (a step stopped between its
  moves reads as corrupt, so a loader takes the one before, until then);
- each registered dataset version: downloaded (sealed), resealed file by file, and stored again
  under the same version (`DataRegistry.republish`: the tag moves to a commit that says why). Once
  every version reads under the new key, the old copies in the DVC remote are removed.

Every object is checked before it replaces the old one: the new bytes open, under the new key, to
exactly the plaintext the old bytes opened to. Nothing is changed that does not check;
a run that stops (a key refused, a crash) leaves every object either old or new and whole, and
running it again finishes the work: objects already under the current key are left alone.
"""

from __future__ import annotations

import json
import posixpath
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from fsspec.implementations.local import LocalFileSystem

from data_layer.registry.registry import DataRegistry
from workload_runtime.checkpoints import FORMAT as CHECKPOINT_FORMAT
from workload_runtime.checkpoints import MANIFEST
from workload_runtime.envelope import FORMAT, Opener, SealedDataError, Sealer, is_sealed, read_header
from workload_runtime.keys import Keyring
from workload_runtime.storage import fs_for, write_chunks_atomic, write_json_atomic
from workload_runtime.tenant_access import PLAIN_AREAS, NotSealedForTenant, check_seal, open_stored

PENDING = ".reseal-"  # a resealed file waiting for its checkpoint step's new manifest
REGISTRY = "registry"  # the data registry's git repository and DVC remote (resealed by version)


class ResealCheckFailed(RuntimeError):
    """A resealed object did not open to the plaintext of the original: the original is kept."""


@dataclass
class ResealReport:
    tenant: str
    key_id: str
    root: str
    resealed: int = 0
    current: int = 0
    bytes: int = 0
    steps: int = 0
    versions: int = 0
    removed: int = 0
    plain: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def lines(self) -> list[str]:
        rate = self.bytes / self.seconds / 1e6 if self.seconds else 0.0
        return [
            f"tenant {self.tenant}: {self.resealed} objects resealed under {self.key_id} ({FORMAT}), {self.bytes / 1e6:.1f} MB in {self.seconds:.1f}s ({rate:.0f} MB/s)",
            f"{self.current} already under that key; {self.steps} checkpoint steps and {self.versions} registered versions moved; "
            f"{self.removed} old copies removed from the DVC remote",
            *([f"{len(self.plain)} plain objects outside the plain areas left as they are (not the tenant's sealed data): "
               + ", ".join(self.plain[:5]) + (" …" if len(self.plain) > 5 else "")] if self.plain else []),
        ]  # fmt: skip


def is_current(stored: bytes | memoryview, keyring: Keyring) -> bool:
    """Sealed in the current format under `keyring`'s key."""
    header = read_header(stored)
    return header.format == FORMAT and keyring.names(header.key_id)


class Resealer:
    """Reseals one tenant's objects: opens with whichever of its keys sealed them, seals with the current one."""

    def __init__(self, keyring: Keyring, opener: Opener, root: str = "") -> None:
        self.keyring, self._opener, self.root = keyring, opener, root
        self._sealer = Sealer(keyring)
        self._check = Opener(lambda tenant, key_id: keyring, sealer=self._sealer)

    def reseal(self, uri: str, stored: bytes) -> memoryview | None:
        """The object at `uri` sealed under the current key, checked; None when it already is."""
        if is_current(stored, self.keyring):
            return None
        if (sealed_for := read_header(stored).tenant) != self.keyring.tenant:
            raise NotSealedForTenant(uri, self.root, self.keyring.tenant, f"an object sealed for tenant `{sealed_for}`")
        check_seal(uri, stored)  # refuses a plain or another tenant's object
        plain = self._opener.open_buffer(stored)  # into one buffer: a checkpoint's 268 MB is not copied again
        new = self._sealer.seal_buffer(plain)
        if self._check.open_buffer(new) != plain:
            raise ResealCheckFailed(f"{uri}: resealed, it does not open to what it held; the original is kept")
        return new


def reseal_tenant(root: str, keyring: Keyring, opener: Opener, *, say: Callable[[str], None] = lambda line: None) -> ResealReport:
    """Move everything the tenant holds under `root` to `keyring` (module docstring)."""
    started = time.monotonic()
    report = ResealReport(keyring.tenant, keyring.key_id, root)
    resealer = Resealer(keyring, opener, root)
    fs, base = fs_for(root)
    base = base.rstrip("/")
    files = [p for p in fs.find(base) if _tenant_object(posixpath.relpath(p, base))]
    steps = {posixpath.dirname(p) for p in files if posixpath.basename(p) == MANIFEST and "/checkpoints/" in f"/{posixpath.relpath(p, base)}"}
    for step in sorted(steps):
        if _reseal_step(fs, step, resealer, report):
            report.steps += 1
    in_steps = tuple(f"{s}/" for s in steps)
    for path in files:
        if path.startswith(in_steps):
            continue
        _reseal_object(fs, path, resealer, report)
    say(f"objects done: {report.resealed} resealed, {report.current} already current")
    registry = DataRegistry.for_root(root)
    report.versions, report.removed = _reseal_registry(registry, resealer, report, say)
    report.seconds = time.monotonic() - started
    return report


def _tenant_object(rel: str) -> bool:
    top = rel.split("/", 1)[0]
    return top not in PLAIN_AREAS and top != REGISTRY and ".tmp-" not in rel


def _uri(fs, path: str) -> str:  # type: ignore[no-untyped-def]
    return path if isinstance(fs, LocalFileSystem) else fs.unstrip_protocol(path)


def _reseal_object(fs, path: str, resealer: Resealer, report: ResealReport) -> None:  # type: ignore[no-untyped-def]
    uri = _uri(fs, path)
    stored = fs.cat_file(path)
    if not is_sealed(stored):
        report.plain.append(uri)
        return
    new = resealer.reseal(uri, stored)
    if new is None:
        report.current += 1
        return
    write_chunks_atomic(uri, [new])
    report.resealed += 1
    report.bytes += len(new)


def _pending(path: str) -> str:
    return posixpath.join(posixpath.dirname(path), PENDING + posixpath.basename(path))


def _reseal_step(fs, step: str, resealer: Resealer, report: ResealReport) -> bool:  # type: ignore[no-untyped-def]
    """One checkpoint step: files resealed beside it, a new manifest, then all moved into place."""
    manifest_path, pending_manifest = posixpath.join(step, MANIFEST), _pending(posixpath.join(step, MANIFEST))
    if not fs.exists(pending_manifest):
        for stray in [p for p in fs.find(step) if posixpath.basename(p).startswith(PENDING)]:
            fs.rm_file(stray)  # a run stopped before this step's new manifest: its work is redone
        stored_manifest = fs.cat_file(manifest_path)
        manifest = _manifest(_uri(fs, manifest_path), stored_manifest, resealer)
        if manifest is None:
            _reseal_object(fs, manifest_path, resealer, report)  # not a checkpoint's manifest after all
            for path in fs.find(step):
                if posixpath.basename(path) != MANIFEST:
                    _reseal_object(fs, path, resealer, report)
            return False
        entries, moved = dict(manifest["files"]), False
        for rel in sorted(entries):
            path = posixpath.join(step, rel)
            new = resealer.reseal(_uri(fs, path), fs.cat_file(path))
            if new is None:
                report.current += 1
                continue
            sha256, size, _ = write_chunks_atomic(_uri(fs, _pending(path)), [new])
            entries[rel] = {**entries[rel], "sha256": sha256, "bytes": size}
            report.resealed += 1
            report.bytes += size
            moved = True
        if not moved and is_current(stored_manifest, resealer.keyring):
            report.current += 1
            return False
        sealed_with = {"tenant": resealer.keyring.tenant, "key_id": resealer.keyring.key_id}
        write_json_atomic(_uri(fs, pending_manifest), {**manifest, "files": entries, **({"sealed_with": sealed_with} if "sealed_with" in manifest else {})})
        report.resealed += 1
    for path in [p for p in fs.find(step) if posixpath.basename(p).startswith(PENDING) and p != pending_manifest]:
        fs.mv(path, posixpath.join(posixpath.dirname(path), posixpath.basename(path).removeprefix(PENDING)))
    fs.mv(pending_manifest, manifest_path)  # last: from now on the step reads as resealed
    return True


def _manifest(uri: str, stored: bytes, resealer: Resealer) -> dict | None:
    """The checkpoint manifest `stored` holds, or None when it is not one."""
    if not is_sealed(stored):
        return None
    try:
        doc = json.loads(open_stored(uri, stored, resealer._opener))
    except (ValueError, SealedDataError):
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == CHECKPOINT_FORMAT and isinstance(doc.get("files"), dict) else None


def _reseal_registry(registry: DataRegistry, resealer: Resealer, report: ResealReport, say: Callable[[str], None]) -> tuple[int, int]:
    """Each registered version stored again under the current key; then the old copies removed."""
    versions = registry.versions()  # none when the root has no registry yet
    moved = 0
    for version in versions:
        with tempfile.TemporaryDirectory(prefix="sinewgrid-reseal-") as tmp:
            folder = Path(tmp) / "v"
            registry.get(version.dataset, version.version, str(folder))  # sealed as stored, checked against its md5s
            changed = False
            for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                stored = path.read_bytes()
                new = resealer.reseal(f"{version.ref}:{path.relative_to(folder)}", stored) if is_sealed(stored) else None
                if new is not None:
                    path.write_bytes(new)  # sealed bytes only: nothing plain is ever written here
                    report.resealed += 1
                    report.bytes += len(new)
                    changed = True
            if changed:
                registry.republish(version.dataset, version.version, folder, f"resealed under {resealer.keyring.key_id}")
                moved += 1
                say(f"{version.ref}: resealed")
    return moved, _remove_old_copies(registry, resealer.keyring, registry.versions() if versions else [])


def _remove_old_copies(registry: DataRegistry, keyring: Keyring, versions: Iterable) -> int:
    """Objects of the DVC remote sealed under another key or format, which no version names any more."""
    from data_layer.registry import dvc_store

    named = {md5 for v in versions for md5 in dvc_store.manifest(v, registry.remote_url).values()}
    fs, base = fs_for(posixpath.join(registry.remote_url, "files", "md5"))
    removed = 0
    for path in fs.find(base) if fs.exists(base) else []:
        md5 = "".join(path.rsplit("/", 2)[-2:])
        if md5 in named or path.endswith(".dir"):
            continue
        stored = fs.cat_file(path)
        if is_sealed(stored) and not is_current(stored, keyring):
            fs.rm_file(path)
            removed += 1
    return removed
