"""The landing-zone protocol shared by every kind of drop (assay plates, teleop episodes, …).

A drop is a folder `landing/<kind>/<drop_id>/` holding data files and a `manifest.json`
written last. The manifest's presence means the drop is complete. The platform never
changes or removes anything in landing: accepted drops are copied byte for byte to
`raw/<kind>/<drop_id>/`, rejected ones to `quarantine/<kind>/<drop_id>/` beside a
readable reason. See docs/drop-protocol.md.
"""

from __future__ import annotations

import datetime as dt
import json
import posixpath
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from workload_runtime.data_issues import DropIssue
from workload_runtime.storage import Storage, fs_for, read_bytes, read_json, sha256_bytes, write_bytes_atomic, write_json_atomic

MANIFEST_NAME = "manifest.json"
DROP_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
QUARANTINE_JSON = "QUARANTINE.json"
QUARANTINE_MD = "QUARANTINE.md"


def tenant_drop_key(tenant: str, drop_id: str) -> str:
    """The partition of one tenant's drop: `<tenant>/<drop_id>`. One key per drop a tenant sent, so
    the UI lists only drops that exist (two tenants' drops with the same id are two keys)."""
    return f"{tenant}/{drop_id}"


def split_tenant_drop_key(key: str) -> tuple[str, str]:
    """`<tenant>/<drop_id>` -> (tenant, drop_id)."""
    tenant, sep, drop_id = key.partition("/")
    if not (sep and tenant and drop_id):
        raise ValueError(f"partition {key!r} is not a tenant's drop: expected <tenant>/<drop_id>, as the landing sensor adds them")
    return tenant, drop_id


@dataclass(frozen=True)
class DropFile:
    path: str
    sha256: str
    bytes: int


@dataclass(frozen=True)
class DropManifest:
    drop_id: str
    files: list[DropFile]
    fields: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**self.fields, "drop_id": self.drop_id, "files": [asdict(f) for f in self.files]}


@dataclass(frozen=True)
class CompleteDrop:
    drop_id: str
    manifest_uri: str
    mtime: float


def _mtime(info: dict[str, Any]) -> float:
    value = info.get("mtime", info.get("LastModified", info.get("last_modified", 0.0)))
    if isinstance(value, dt.datetime):
        return value.timestamp()
    return float(value or 0.0)


def list_complete_drops(landing_uri: str) -> list[CompleteDrop]:
    """Every drop whose manifest is present, oldest manifest first.

    On an object store, one paged listing of every object under the zone: a pattern would list
    each drop's folder on its own (10,000 drops: 10,000 requests)."""
    fs, path = fs_for(landing_uri)
    if not fs.exists(path):
        return []
    if isinstance(fs, LocalFileSystem):
        found = fs.glob(posixpath.join(path, "*", MANIFEST_NAME), detail=True)
    else:
        path = path.rstrip("/")
        listed = fs.find(path, detail=True)
        found = {p: info for p, info in listed.items() if posixpath.basename(p) == MANIFEST_NAME and posixpath.dirname(posixpath.dirname(p)) == path}
    drops = [
        CompleteDrop(posixpath.basename(posixpath.dirname(p)), fs.unstrip_protocol(p) if "://" in landing_uri else p, _mtime(info))
        for p, info in found.items()
    ]
    return sorted(drops, key=lambda d: (d.mtime, d.drop_id))


def _drop_name(kind: str, drop_id: str) -> str:
    return f"{kind} drop `{drop_id}`" if kind else f"drop `{drop_id}`"


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each written once (json keeps the last of a repeated key, silently)."""
    keys = [k for k, _ in pairs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        names = ", ".join(f"`{k}`" for k in repeated)
        raise ValueError(f"key {names} is written twice in one object" if len(repeated) == 1 else f"keys {names} are each written twice in one object")
    return dict(pairs)


def _path_problem(path: str) -> str | None:
    """Why a manifest `path` cannot name a file inside the drop, with the fix; None when it can."""
    example = "relative to the drop folder, e.g. `plates/plate_0001.csv`"
    if not path:
        return f"is empty; give the file's path {example}"
    if "\\" in path:
        return f"uses backslashes; write it with forward slashes, {example}"
    if path.startswith("/") or re.match(r"^[A-Za-z]:/", path):
        return f"is absolute; give the path {example}"
    if ".." in path.split("/"):
        return f"contains `..`, which points outside the drop folder; list only files inside the drop, {example}"
    if posixpath.normpath(path) == MANIFEST_NAME:
        return "is the manifest itself; the manifest lists the files beside it, never itself: remove this entry"
    if posixpath.normpath(path) != path:
        return f"is not written plainly; write it as {posixpath.normpath(path)!r}"
    return None


def parse_manifest(
    data: bytes, drop_id: str, required_fields: Iterable[str] = (), kind: str = ""
) -> tuple[DropManifest | None, list[DropIssue]]:
    """Read a drop manifest; any problem is returned as an issue naming the field (and the drop, for entries)."""
    issues: list[DropIssue] = []
    drop = _drop_name(kind, drop_id)
    resend = "then send the drop again under a new drop_id"
    try:
        doc = json.loads(data.decode("utf-8-sig"), object_pairs_hook=_unique_keys)
    except UnicodeDecodeError:
        return None, [DropIssue("manifest_encoding", "manifest.json is not UTF-8 text; write it as UTF-8 JSON.", MANIFEST_NAME)]
    except json.JSONDecodeError as exc:
        return None, [DropIssue("manifest_json", f"manifest.json is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}).", MANIFEST_NAME)]
    except ValueError as exc:  # a repeated key: a JSON reader would keep only the last one
        return None, [DropIssue("manifest_json", f"{drop}: manifest.json is ambiguous: {exc}; write each key once, {resend}.", MANIFEST_NAME)]
    if not isinstance(doc, dict):
        return None, [DropIssue("manifest_json", "manifest.json must hold a JSON object.", MANIFEST_NAME)]
    for name in ("drop_id", "files", *required_fields):
        if name not in doc:
            issues.append(DropIssue("manifest_field", f"manifest.json has no `{name}` field; add it (see docs/drop-protocol.md).", MANIFEST_NAME))
    if issues:
        return None, issues
    if doc["drop_id"] != drop_id:
        issues.append(DropIssue("manifest_drop_id", f"manifest.json says drop_id {doc['drop_id']!r} but the folder is {drop_id!r}; they must be equal.", MANIFEST_NAME))
    files: list[DropFile] = []
    if not isinstance(doc["files"], list):
        issues.append(DropIssue("manifest_field", "`files` must be a list of {path, sha256, bytes}.", MANIFEST_NAME))
    else:
        first_at: dict[str, int] = {}
        for i, entry in enumerate(doc["files"]):
            try:
                if not isinstance(entry, dict):
                    raise TypeError(f"it is a {type(entry).__name__}, not an object")
                path = str(entry["path"])
                files.append(DropFile(path, str(entry["sha256"]).lower(), int(entry["bytes"])))
            except (KeyError, TypeError, ValueError) as exc:
                issues.append(DropIssue("manifest_field", f"files[{i}] is not a valid {{path, sha256, bytes}} entry ({exc}).", MANIFEST_NAME))
                continue
            if (problem := _path_problem(path)) is not None:
                issues.append(DropIssue("manifest_path", f"{drop}: manifest.json files[{i}] path {path!r} {problem}; {resend}.", MANIFEST_NAME))
            elif path in first_at:
                msg = f"{drop}: manifest.json lists {path!r} twice (files[{first_at[path]}] and files[{i}]); list each file once: remove files[{i}], {resend}."
                issues.append(DropIssue("duplicate_entry", msg, MANIFEST_NAME))
            first_at.setdefault(path, i)
        if not doc["files"]:
            issues.append(DropIssue("empty_drop", "The drop lists no files; a drop must hold at least one data file.", MANIFEST_NAME))
    fields = {k: v for k, v in doc.items() if k not in ("drop_id", "files")}
    return DropManifest(drop_id, files, fields), issues


def read_verified_files(storage: Storage, kind: str, manifest: DropManifest) -> tuple[dict[str, bytes], list[DropIssue]]:
    """Read every file the manifest names from landing and check its size and sha256."""
    base = storage.landing(kind, manifest.drop_id)
    contents: dict[str, bytes] = {}
    issues: list[DropIssue] = []
    for f in manifest.files:
        uri = posixpath.join(base, f.path)
        try:
            data = read_bytes(uri)
        except (FileNotFoundError, IsADirectoryError):
            issues.append(DropIssue("missing_file", f"manifest.json names {f.path} but it is not a file in the drop folder; add the file or fix the manifest.", f.path))
            continue
        if len(data) != f.bytes:
            issues.append(
                DropIssue(
                    "size_mismatch",
                    f"{f.path} has {len(data)} bytes but the manifest says {f.bytes}: the file is truncated or was changed after the manifest was written. Re-send the drop.",
                    f.path,
                )
            )
        elif sha256_bytes(data) != f.sha256:
            issues.append(
                DropIssue(
                    "checksum_mismatch",
                    f"{f.path} has sha256 {sha256_bytes(data)} but the manifest says {f.sha256}: the file was corrupted or changed in transit. Re-send the drop.",
                    f.path,
                )
            )
        contents[f.path] = data
    return contents, issues


def unlisted_files(storage: Storage, kind: str, manifest: DropManifest) -> list[DropIssue]:
    """Files in the drop folder that the manifest does not list: the drop is not what the sender meant to send."""
    fs, base = fs_for(storage.landing(kind, manifest.drop_id))
    listed = {f.path for f in manifest.files} | {MANIFEST_NAME}
    present = sorted(posixpath.relpath(p, base) for p in fs.find(base)) if fs.exists(base) else []
    drop = _drop_name(kind, manifest.drop_id)
    return [
        DropIssue(
            "unlisted_file",
            f"{drop} holds {rel} but manifest.json does not list it; list it in `files` with its sha256 and bytes, "
            "or leave it out of the drop, then send the drop again under a new drop_id.",
            rel,
        )
        for rel in present
        if rel not in listed
    ]


def read_drop(storage: Storage, kind: str, drop_id: str, required_fields: Iterable[str] = ()) -> tuple[DropManifest | None, dict[str, bytes], list[DropIssue]]:
    """Parse a landing drop's manifest and read every file it names, checked against it.

    Returns the manifest, the verified contents by path, and every problem found (empty if
    the drop can be trusted: the manifest is sound, lists exactly the files in the folder,
    and every file matches its size and sha256).
    """
    manifest, issues = parse_manifest(read_bytes(posixpath.join(storage.landing(kind, drop_id), MANIFEST_NAME)), drop_id, required_fields, kind)
    if manifest is None or issues:
        return manifest, {}, issues
    contents, issues = read_verified_files(storage, kind, manifest)
    issues += unlisted_files(storage, kind, manifest)
    if issues:
        return manifest, {}, issues
    return manifest, contents, issues


def write_raw(storage: Storage, kind: str, manifest: DropManifest, contents: dict[str, bytes]) -> str:
    """Copy verified files byte for byte into the raw zone; the manifest goes last.

    The raw zone is immutable: a drop already there with the same manifest is left as it is.
    Under a tenant's root (its key held here) the files and the manifest are sealed with its key;
    `read_bytes` gives the lab's bytes back, so the manifest's checksums, of those bytes, still hold.
    """
    base = storage.raw(kind, manifest.drop_id)
    manifest_uri = posixpath.join(base, MANIFEST_NAME)
    fs, manifest_path = fs_for(manifest_uri)
    if fs.exists(manifest_path):
        if read_json(manifest_uri) == manifest.to_dict():
            return base
        raise FileExistsError(
            f"{base} already holds a different drop with id {manifest.drop_id!r}; a drop id is used once. "
            "Send the corrected files as a new drop with a new id."
        )
    for path, data in contents.items():
        write_bytes_atomic(posixpath.join(base, path), data)
    write_json_atomic(posixpath.join(base, MANIFEST_NAME), manifest.to_dict())
    return base


def quarantine_drop(storage: Storage, kind: str, drop_id: str, issues: list[DropIssue], *, stage: str) -> str:
    """Copy every file of a landing drop into quarantine with the reasons. Landing is left as it was.

    Under a tenant's root (its key held here) the copies and the reasons are sealed with its key,
    as everything there is outside landing/ and outbox/: the reasons quote the lab's values. Its
    people read them in the UI's metadata or with `sinewgrid data decrypt --tenant ... --to DEST`.
    """
    source = storage.landing(kind, drop_id)
    target = storage.quarantine(kind, drop_id)
    fs, source_path = fs_for(source)
    copied = []
    if fs.exists(source_path):
        for path in sorted(fs.find(source_path)):
            rel = posixpath.relpath(path, source_path)
            data = read_bytes(fs.unstrip_protocol(path) if "://" in source else path)
            write_bytes_atomic(posixpath.join(target, "original", rel), data)
            copied.append(rel)
    report = {
        "drop_id": drop_id,
        "kind": kind,
        "stage": stage,
        "quarantined_at": dt.datetime.now(dt.UTC).isoformat(),
        "landing": source,
        "original_files": copied,
        "issues": [asdict(i) for i in issues],
    }
    write_json_atomic(posixpath.join(target, QUARANTINE_JSON), report)
    lines = [
        f"# Drop `{drop_id}` was quarantined at the {stage} stage",
        "",
        "The original files are kept unchanged in `original/` (and in landing). Nothing was deleted.",
        "To fix it, correct the files and send them again as a new drop with a new drop_id.",
        "",
        "## Reasons",
        "",
        *[f"- {i.describe()}" for i in issues],
        "",
    ]
    write_bytes_atomic(posixpath.join(target, QUARANTINE_MD), "\n".join(lines).encode())
    return target


def write_drop(storage: Storage, kind: str, drop_id: str, files: dict[str, bytes], **fields: Any) -> str:
    """Write a drop the way the protocol asks a lab system to: data files, then the manifest last."""
    if not DROP_ID_PATTERN.match(drop_id):
        raise ValueError(f"drop_id {drop_id!r} must match {DROP_ID_PATTERN.pattern}")
    base = storage.landing(kind, drop_id)
    entries = []
    for path, data in files.items():
        write_bytes_atomic(posixpath.join(base, path), data)
        entries.append({"path": path, "sha256": sha256_bytes(data), "bytes": len(data)})
    write_json_atomic(posixpath.join(base, MANIFEST_NAME), {"drop_id": drop_id, **fields, "files": entries})
    return base


def seal_drop(storage: Storage, kind: str, drop_id: str, **fields: Any) -> str:
    """Write the manifest of a drop whose files are already in place (every file in the folder).

    For producers that write the data with their own tools first (e.g. a LeRobot dataset);
    the manifest, written last, is what makes the drop complete.
    """
    base = storage.landing(kind, drop_id)
    fs, path = fs_for(base)
    entries = []
    for file in sorted(fs.find(path)):
        rel = posixpath.relpath(file, path)
        if rel == MANIFEST_NAME:
            continue
        data = fs.cat_file(file)
        entries.append({"path": rel, "sha256": sha256_bytes(data), "bytes": len(data)})
    write_json_atomic(posixpath.join(base, MANIFEST_NAME), {"drop_id": drop_id, **fields, "files": entries})
    return base
