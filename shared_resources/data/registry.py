"""The data registry: every curated dataset version in a git repository plus a DVC remote.

A registered version is the directory ``<dataset>/<version>`` of a DVC-tracked git
repository: the ``<dataset>/<version>.dvc`` file (committed, tagged
``<dataset>/<version>``) holds the directory's DVC hash and where it came from, and the
bytes live in the DVC remote ``<root>/registry/dvc-store``. Getting a version back needs
nothing of this project: ``dvc get GIT_URL cell/omics/V --rev cell/omics/V -o DEST``.
DVC is used for versioning and storage only; Dagster stays the orchestrator.

Where the git repository lives:

* a local storage root: the bare repository ``<root>/registry/datasets.git``;
* ``SINEWGRID_REGISTRY_GIT`` set: that path, or any git URL (production points it at a
  git server; a local mirror under the cache folder is fetched before each read);
* an object-store root and no override: a bare repository in the cache folder
  (``$XDG_CACHE_HOME`` or ``~/.cache``, ``sinewgrid/registry/<hash of root>/``) that is
  mirrored to ``<root>/registry/datasets.bundle`` after every registration and made
  exactly what the bundle holds before every read (restored when the cache is missing or
  behind, emptied when the bundle is gone). Concurrent registrations from two machines
  through the bundle are last-writer-wins (narrowed, not closed): production sets
  ``SINEWGRID_REGISTRY_GIT``.

Registration runs DVC in-process (no CLI start-up) and copies files straight from the
source to the remote; it does not use ``dvc add --to-remote``, which leaves a temporary
copy of every file in the remote (DVC issue #10783).

See docs/datasets.md for the user's side.
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import getpass
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from shared_resources.runtime.storage import Storage, fs_for
from shared_resources.settings import child_env, settings

ENV_GIT = "SINEWGRID_REGISTRY_GIT"
ENV_REGION = "SINEWGRID_STORAGE_REGION"
ENV_PROVIDER = "SINEWGRID_STORAGE_PROVIDER"
BRANCH = "main"
REMOTE_NAME = "storage"
_PUBLISH_TRIES = 5

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_NAME_RE = re.compile(rf"{_NAME}\Z")
_DATASET_HELP = "a dataset name is two parts '<area>/<name>' such as 'cell/omics' or 'robotics/teleop'"
_VERSION_HELP = (
    "a version starts with a letter or digit and uses only letters, digits, '.', '_' and '-' "
    "(e.g. a content hash, a drop id, a session id or '2026-11-20_cartpole-mujoco-randomized')"
)


# Errors ---------------------------------------------------------------------------
class RegistryError(RuntimeError):
    """Something about the data registry went wrong; the message says what, where and how to fix it."""


class VersionNotFound(RegistryError):
    """No such dataset version in the registry; the message lists the nearest and latest known ones."""


class RegistryUnreachable(RegistryError):
    """The registry's git repository or DVC remote cannot be reached."""


class DatasetChanged(RegistryError):
    """The data no longer hashes to what was registered (at the source, or in the DVC remote)."""


class _Rejected(Exception):
    """Someone else published first: sync and build the commit again."""


# Names ----------------------------------------------------------------------------
def _valid_part(part: str) -> bool:
    return bool(_NAME_RE.match(part)) and ".." not in part and not part.endswith((".", ".lock", ".dvc")) and len(part) <= 200


_RULES = "no '..', and not ending in '.', '.lock' or '.dvc'"


def validate_dataset(dataset: str) -> str:
    """`dataset` unchanged if it is a valid dataset name like 'cell/omics', else RegistryError."""
    parts = dataset.split("/") if isinstance(dataset, str) else []
    if len(parts) != 2 or not all(_valid_part(p) for p in parts):
        raise RegistryError(f"dataset {dataset!r} is not a valid name: {_DATASET_HELP}; each part starts with a letter or digit and uses only letters, digits, '.', '_' and '-' ({_RULES}).")
    return dataset


def validate_version(version: str) -> str:
    """`version` unchanged if it is a safe version name, else RegistryError."""
    if not isinstance(version, str) or not _valid_part(version):
        raise RegistryError(f"version {version!r} is not a valid name: {_VERSION_HELP} ({_RULES}).")
    return version


def parse_ref(ref: str) -> tuple[str, str]:
    """'cell/omics@abc123' -> ('cell/omics', 'abc123'), with a clear error for anything else."""
    dataset, sep, version = ref.partition("@") if isinstance(ref, str) else ("", "", "")
    if not sep or "@" in version:
        raise RegistryError(f"{ref!r} is not a dataset reference: write DATASET@VERSION, e.g. 'cell/omics@2026-11-20'.")
    return validate_dataset(dataset), validate_version(version)


# Where the storage is --------------------------------------------------------------
def storage_location(root: str) -> tuple[str, str]:
    """(provider, region) of a storage root, for the registry's records.

    `SINEWGRID_STORAGE_PROVIDER` / `SINEWGRID_STORAGE_REGION` win when set. Otherwise a
    local root is ("local", "local"); `s3://` is ("aws", the bucket's region from
    GetBucketLocation, None meaning us-east-1; `AWS_DEFAULT_REGION` if the call fails);
    `gs://` is "gcp" and `az://`/`abfs://` "azure" (region "unknown" unless set).
    """
    root = Storage.at(root).root
    scheme = root.split("://", 1)[0].lower() if "://" in root else "file"
    provider = {"file": "local", "local": "local", "s3": "aws", "s3a": "aws", "gs": "gcp", "gcs": "gcp",
                "az": "azure", "abfs": "azure", "abfss": "azure"}.get(scheme, scheme)
    env = settings()
    region = env.storage_region
    if not region:
        if provider == "local":
            region = "local"
        elif provider == "aws":
            region = _s3_bucket_region(root)
        else:
            region = "unknown"
    return env.storage_provider or provider, region


def _s3_bucket_region(root: str) -> str:
    import s3fs

    bucket = root.split("://", 1)[1].split("/", 1)[0]
    fallback = settings().aws_region or "unknown"
    try:
        answer = s3fs.S3FileSystem().call_s3("get_bucket_location", Bucket=bucket)
    except Exception:  # noqa: BLE001 - no permission or no network: the configured region is the best guess
        return fallback
    return answer.get("LocationConstraint") or "us-east-1"


# A registered version --------------------------------------------------------------
@dataclass(frozen=True)
class DatasetVersion:
    """One registered dataset version and how to get it back.

    `md5` is the DVC hash of the directory exactly as the `.dvc` file writes it, with its
    ".dir" suffix (e.g. "5369cb52...a27.dir"): it names the manifest object in the remote.
    `rev` is the registry commit that registered it; `meta` is what the caller passed.
    """

    dataset: str
    version: str
    md5: str
    rev: str
    tag: str
    path: str
    source_uri: str
    provider: str
    region: str
    registered_at: str
    files: int
    bytes: int
    meta: dict = field(default_factory=dict, hash=False)
    git_url: str = ""
    remote_url: str = ""

    @property
    def ref(self) -> str:
        return f"{self.dataset}@{self.version}"

    @property
    def get_command(self) -> str:
        """The plain DVC line (no Sinewgrid needed) that downloads this version."""
        return (
            f"dvc get {shlex.quote(self.git_url)} {shlex.quote(self.path)} "
            f"--rev {shlex.quote(self.tag)} -o {shlex.quote(self.version)}"
        )

    def metadata(self) -> dict[str, Any]:
        """Plain values for Dagster metadata."""
        return {
            "dataset_ref": self.ref,
            "dvc_md5": self.md5,
            "registry_rev": self.rev,
            "registry_tag": self.tag,
            "registry_git": self.git_url,
            "dvc_remote": self.remote_url,
            "provider": self.provider,
            "region": self.region,
            "source_uri": self.source_uri,
            "files": self.files,
            "bytes": self.bytes,
            "registered_at": self.registered_at,
            "get_command": self.get_command,
        }


# Git and locks --------------------------------------------------------------------
def _git(*args: str, cwd: str | Path | None = None, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = child_env({"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "LC_ALL": "C"})
    proc = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        raise RegistryError(f"git {' '.join(args)} failed in {cwd or os.getcwd()}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive fcntl lock: serialises threads and processes on this machine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _is_git_url(spec: str) -> bool:
    return "://" in spec or bool(re.match(r"^[\w.-]+@[\w.-]+:", spec))


def _cache_home() -> Path:
    return settings().user_cache / "sinewgrid" / "registry"


def _plain_value(value: Any) -> Any:
    """numpy scalars become numbers; anything else JSON cannot hold becomes its string."""
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (TypeError, ValueError):
            pass
    return str(value)


def _plain_meta(meta: dict | None) -> dict:
    """The caller's meta as plain JSON-like values (what the `.dvc` file can hold)."""
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise RegistryError(f"meta must be a dict of plain values (e.g. {{'drops': [...]}}), got {type(meta).__name__}.")
    try:
        return json.loads(json.dumps(meta, default=_plain_value))
    except (TypeError, ValueError) as exc:
        raise RegistryError(f"meta must hold plain values (str, numbers, lists, dicts with string keys): {exc}") from exc


def _unreachable(what: str, url: str, exc: BaseException | str) -> RegistryUnreachable:
    return RegistryUnreachable(
        f"cannot reach the registry's {what} at {url}: {exc}. Check {ENV_GIT} (the git repository), "
        "your credentials (AWS_PROFILE / AWS_ACCESS_KEY_ID), AWS_ENDPOINT_URL for an S3-compatible "
        "store, and the network."
    )


# The registry ---------------------------------------------------------------------
class DataRegistry:
    """Dataset versions in a DVC-tracked git repository plus a DVC remote under the storage root."""

    def __init__(self, root: str, *, git_spec: str | None = None) -> None:
        storage = Storage.at(root)
        self.root = storage.root
        self._local_root = storage.is_local
        root_path = self.root[len("file://"):] if self.root.startswith("file://") else self.root
        self.remote_url = _join(root_path if self._local_root else self.root, "registry", "dvc-store")
        self._bundle_uri: str | None = None
        self._create_mirror = False
        if git_spec and _is_git_url(git_spec):
            self._mode = "git"
            self.git_url = git_spec
            self._mirror = _cache_home() / _short_hash(git_spec) / "datasets.git"
        elif git_spec:
            self._mode = "local"
            self._mirror = Path(git_spec).expanduser().resolve()
            self.git_url = str(self._mirror)
        elif self._local_root:
            self._mode = "local"
            self._mirror = Path(root_path) / "registry" / "datasets.git"
            self.git_url = str(self._mirror)
            self._create_mirror = True
        else:
            self._mode = "bundle"
            self._mirror = _cache_home() / _short_hash(self.root) / "datasets.git"
            self.git_url = str(self._mirror)
            self._bundle_uri = _join(self.root, "registry", "datasets.bundle")
            self._create_mirror = True
        self._register_lock = self._mirror.with_name(self._mirror.name + ".register.lock")
        self._sync_lock = self._mirror.with_name(self._mirror.name + ".sync.lock")
        self._location: tuple[str, str] | None = None

    @classmethod
    def for_root(cls, root: str) -> DataRegistry:
        """The registry of a storage root (a path or a URI such as s3://bucket/prefix)."""
        return cls(root, git_spec=settings().registry_git or None)

    def __repr__(self) -> str:
        return f"DataRegistry(git={self.git_url!r}, remote={self.remote_url!r})"

    # Reading ------------------------------------------------------------------------
    def find(self, dataset: str, version: str) -> DatasetVersion:
        """The registered version, or VersionNotFound naming the nearest and latest known ones."""
        validate_dataset(dataset)
        validate_version(version)
        self._sync_down()
        found = self._read_tags([f"{dataset}/{version}"])
        if found:
            return found[0]
        raise self._not_found(dataset, version)

    def versions(self, dataset: str | None = None) -> list[DatasetVersion]:
        """Every registered version (of one dataset, or of all), oldest first."""
        if dataset is not None:
            validate_dataset(dataset)
        self._sync_down()
        return self._all_versions(dataset)

    def get(self, dataset: str, version: str, dest: str) -> DatasetVersion:
        """Download a version into `dest` (a new local path or URI), verified file by file.

        Refuses a `dest` that exists. Downloads into a temporary sibling, checks every file
        against the registered hashes (DatasetChanged if any differs, and `dest` is not
        created), then renames it into place.
        """
        version_info = self.find(dataset, version)
        manifest = self._manifest(version_info)
        dest_is_local = "://" not in dest or dest.startswith("file://")
        if dest_is_local:
            target = Path(dest[len("file://"):] if dest.startswith("file://") else dest).expanduser().resolve()
            if target.exists() or target.is_symlink():
                raise RegistryError(f"{target} already exists: nothing was overwritten. Choose a new destination, or move that one away.")
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.partial-{uuid.uuid4().hex[:8]}")
        else:
            fs, path = fs_for(dest)
            if fs.exists(path):
                raise RegistryError(f"{dest} already exists: nothing was overwritten. Choose a new destination, or move that one away.")
            partial = Path(tempfile.mkdtemp(prefix="sinewgrid-get-")) / "data"
        try:
            self._download(version_info, partial)
            self._verify(version_info, manifest, partial)
            if dest_is_local:
                if target.exists():
                    raise RegistryError(f"{target} appeared while downloading: nothing was overwritten; the download was discarded.")
                os.rename(partial, target)
            else:
                for rel in sorted(manifest):
                    fs.put_file(str(partial / rel), f"{path.rstrip('/')}/{rel}")
        finally:
            if dest_is_local:
                shutil.rmtree(partial, ignore_errors=True)
            else:
                shutil.rmtree(partial.parent, ignore_errors=True)
        return version_info

    # Registering ----------------------------------------------------------------------
    def register(self, dataset: str, version: str, source_uri: str, *, meta: dict | None = None) -> DatasetVersion:
        """Register the directory at `source_uri` (a local folder or e.g. an s3:// folder) as `dataset@version`.

        The files go straight from the source to the DVC remote (no local DVC cache); the
        `.dvc` file is committed and tagged. Registering the same content again returns the
        existing version; different content under an existing version raises DatasetChanged.
        """
        validate_dataset(dataset)
        validate_version(version)
        extra = _plain_meta(meta)
        source = self._normalise_source(source_uri)
        tag = f"{dataset}/{version}"
        with _file_lock(self._register_lock):
            for _ in range(_PUBLISH_TRIES):
                try:
                    self._sync_down()
                    self._ensure_initialised()
                    with tempfile.TemporaryDirectory(prefix="sinewgrid-registry-") as tmp:
                        work = Path(tmp) / "work"
                        _git("clone", "--quiet", "--branch", BRANCH, str(self._mirror), str(work))
                        return self._register_in(work, dataset, version, tag, source, extra)
                except _Rejected:
                    continue
        raise RegistryError(
            f"could not publish {dataset}@{version} to {self.git_url} after {_PUBLISH_TRIES} tries: other "
            "registrations kept landing first. Try again."
        )

    def _register_in(self, work: Path, dataset: str, version: str, tag: str, source: str, extra: dict) -> DatasetVersion:
        from dvc.fs import get_cloud_fs
        from dvc.repo import Repo
        from dvc_data.hashfile.build import build
        from dvc_data.hashfile.transfer import transfer

        site = work / ".dvc" / "tmp" / "site-cache"
        with Repo(str(work), config={"core": {"site_cache_dir": str(site)}}) as repo:
            recorded = repo.config["remote"].get(REMOTE_NAME, {}).get("url", "")
            if recorded.rstrip("/") != self.remote_url.rstrip("/"):
                raise RegistryError(
                    f"the registry {self.git_url} keeps its data in the DVC remote {recorded or '(none)'}, but this "
                    f"storage root's remote is {self.remote_url}: nothing was registered. Point {ENV_GIT} at this "
                    "root's registry; or, if the root moved, record the new place in the registry (clone it, "
                    f"`dvc remote modify {REMOTE_NAME} url {self.remote_url}`, commit, push)."
                )
            odb = repo.cloud.get_remote_odb(REMOTE_NAME, "add")
            cls, config, src_path = get_cloud_fs(repo.config, url=source)
            src_fs = cls(**config)
            try:
                if not src_fs.isdir(src_path):
                    raise RegistryError(f"{source} is not a directory: register a dataset's folder (a zarr store, a LeRobot dataset, ...).")
                staging, src_meta, obj = build(odb, src_path, src_fs, "md5", upload=False)
            except RegistryError:
                raise
            except FileNotFoundError as exc:
                raise RegistryError(f"nothing at {source}: {exc}. Check the source URI.") from exc
            except Exception as exc:  # noqa: BLE001 - network or credentials at the source
                raise RegistryUnreachable(f"cannot read the source {source}: {exc}. Check credentials, AWS_ENDPOINT_URL and the network.") from exc
            md5 = obj.hash_info.value
            try:
                existing = self._read_tags([tag])
                if existing:
                    if existing[0].md5 == md5:
                        return existing[0]
                    raise DatasetChanged(
                        f"{dataset}@{version} was registered at rev {existing[0].rev[:12]} with md5 {existing[0].md5}; "
                        f"the data at {source} now hashes to {md5}: it changed after registration; nothing was "
                        "overwritten; register it under a new version."
                    )
                if not src_meta.nfiles:
                    raise RegistryError(f"{source} holds no files: there is nothing to register.")
                try:
                    result = transfer(staging, odb, {obj.hash_info}, hardlink=False, shallow=False)
                except Exception as exc:  # noqa: BLE001
                    raise _unreachable("DVC remote", self.remote_url, exc) from exc
                if result.failed:
                    raise RegistryUnreachable(
                        f"{len(result.failed)} objects of {source} could not be written to the DVC remote "
                        f"{self.remote_url}; nothing was registered. Check its permissions, credentials and free space."
                    )
            finally:
                with contextlib.suppress(Exception):
                    staging.fs.rm(staging.path, recursive=True)

            provider, region = self._storage_location()
            record = {
                "dataset": dataset,
                "version": version,
                "source_uri": source,
                "provider": provider,
                "region": region,
                "registered_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "registered_by": f"{_user()}@{socket.gethostname()}",
                "extra": extra,
            }
            (work / dataset).mkdir(parents=True, exist_ok=True)
            stage = repo.stage.create(
                single_stage=True,
                validate=False,
                fname=str(work / f"{tag}.dvc"),
                wdir=str(work / dataset),
                outs=[version],
                meta=record,
                desc=f"{dataset}@{version} registered by Sinewgrid",
            )
            out = stage.outs[0]
            out.hash_info, out.meta, out.files = obj.hash_info, src_meta, None
            stage.dump()

        _git("add", f"{tag}.dvc", cwd=work)
        _git(*_identity(), "commit", "--quiet", "-m",
             f"Register {dataset}@{version}\n\nsource: {source}\nmd5: {md5}\nfiles: {src_meta.nfiles}, bytes: {src_meta.size}", cwd=work)
        _git("tag", tag, cwd=work)
        old_main = self._rev(f"refs/heads/{BRANCH}")
        _git("push", "--quiet", "--atomic", "origin", f"HEAD:refs/heads/{BRANCH}", f"refs/tags/{tag}:refs/tags/{tag}", cwd=work)
        try:
            self._publish([f"refs/heads/{BRANCH}", f"refs/tags/{tag}"])
        except BaseException:
            self._rollback(old_main, tag)
            raise
        found = self._read_tags([tag])
        if not found:
            raise RegistryError(f"{tag} was pushed to {self._mirror} but cannot be read back: inspect that repository.")
        return found[0]

    # Internals: names, hashes, downloads ------------------------------------------------
    def _normalise_source(self, source_uri: str) -> str:
        if not isinstance(source_uri, str) or not source_uri:
            raise RegistryError(f"source_uri {source_uri!r} must be a folder path or URI such as s3://bucket/prefix/folder.")
        if source_uri.startswith("file://"):
            source_uri = source_uri[len("file://"):]
        if "://" in source_uri:
            return source_uri.rstrip("/")
        return str(Path(source_uri).expanduser().resolve())

    def _storage_location(self) -> tuple[str, str]:
        if self._location is None:
            self._location = storage_location(self.root)
        return self._location

    def _object_uri(self, md5: str) -> str:
        return _join(self.remote_url, "files", "md5", md5[:2], md5[2:])

    def _manifest(self, version_info: DatasetVersion) -> dict[str, str]:
        """{relpath: md5} from the registered `.dir` object, itself checked against the `.dvc` hash."""
        uri = self._object_uri(version_info.md5)
        fs, path = fs_for(uri)
        try:
            data = fs.cat_file(path)
        except FileNotFoundError as exc:
            raise RegistryError(
                f"{version_info.ref}: its manifest {uri} is missing from the DVC remote: the remote was "
                "pruned or points elsewhere. Nothing was downloaded."
            ) from exc
        except Exception as exc:  # noqa: BLE001
            raise _unreachable("DVC remote", self.remote_url, exc) from exc
        actual = hashlib.md5(data).hexdigest()
        if actual != version_info.md5.split(".")[0]:
            raise DatasetChanged(
                f"{version_info.ref}: the manifest object {uri} hashes to {actual}, not the registered "
                f"{version_info.md5}: it was changed in the DVC remote behind the registry's back. Nothing was "
                "downloaded; restore the remote from a backup or register the data again under a new version."
            )
        return {entry["relpath"]: entry["md5"] for entry in json.loads(data)}

    def _download(self, version_info: DatasetVersion, partial: Path) -> None:
        from dvc.api import DVCFileSystem

        try:
            # The bytes are read from this root's remote, even if the registry recorded another place (a moved root).
            fs = DVCFileSystem(url=str(self._mirror), rev=version_info.tag, remote=REMOTE_NAME, remote_config={"url": self.remote_url})
            try:
                fs.get(version_info.path, str(partial), recursive=True)
            finally:
                fs.close()
        except Exception as exc:  # noqa: BLE001
            raise RegistryError(
                f"downloading {version_info.ref} from {self.remote_url} failed: {exc}. If objects are missing the "
                "remote was pruned; if the remote cannot be reached check credentials, AWS_ENDPOINT_URL and the network."
            ) from exc

    @staticmethod
    def _verify(version_info: DatasetVersion, manifest: dict[str, str], partial: Path) -> None:
        from dvc_data.hashfile.hash import file_md5

        got = {p.relative_to(partial).as_posix(): p for p in partial.rglob("*") if p.is_file()}
        problems: list[str] = []
        for rel in sorted(set(manifest) - set(got)):
            problems.append(f"{rel}: missing")
        for rel in sorted(set(got) - set(manifest)):
            problems.append(f"{rel}: not in the registered manifest")
        for rel in sorted(set(manifest) & set(got)):
            actual = file_md5(str(got[rel]))
            if actual != manifest[rel]:
                problems.append(f"{rel}: md5 {actual}, registered {manifest[rel]}")
        if problems:
            shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
            raise DatasetChanged(
                f"{version_info.ref} (registered at rev {version_info.rev[:12]}, md5 {version_info.md5}) does not "
                f"match what the DVC remote {version_info.remote_url} returned: {shown}. The remote was changed "
                "behind the registry's back; nothing was written to the destination."
            )

    # Internals: the git side --------------------------------------------------------------
    def _rev(self, ref: str) -> str | None:
        if not (self._mirror / "HEAD").exists():
            return None
        proc = _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=self._mirror, check=False)
        return proc.stdout.strip() or None

    def _tag_refs(self) -> list[tuple[str, str, int]]:
        """(tag, commit, commit time) of every tag that names a dataset version."""
        if not (self._mirror / "HEAD").exists():
            return []
        out = _git("for-each-ref", "--format=%(refname:strip=2)%09%(objectname)%09%(*objectname)%09%(committerdate:unix)%09%(*committerdate:unix)",
                   "refs/tags", cwd=self._mirror).stdout
        refs = []
        for line in out.splitlines():
            name, obj, peeled, when, peeled_when = (line.split("\t") + [""] * 5)[:5]
            if name.count("/") == 2:
                refs.append((name, peeled or obj, int(peeled_when or when or 0)))
        return refs

    def _read_tags(self, tags: list[str]) -> list[DatasetVersion]:
        """The versions behind these tags (missing ones skipped), read in one git call."""
        known = {name: (commit, when) for name, commit, when in self._tag_refs()}
        wanted = [t for t in tags if t in known]
        if not wanted:
            return []
        batch = "".join(f"{known[t][0]}:{t}.dvc\n" for t in wanted)
        raw = subprocess.run(["git", "cat-file", "--batch"], cwd=self._mirror, input=batch.encode(), capture_output=True, check=True).stdout
        versions, pos = [], 0
        for tag in wanted:
            end = raw.index(b"\n", pos)
            header = raw[pos:end].decode().split()
            pos = end + 1
            if len(header) < 3 or header[1] == "missing":
                continue
            size = int(header[2])
            text = raw[pos:pos + size].decode()
            pos += size + 1
            versions.append(self._parse_dvcfile(tag, known[tag][0], text))
        return versions

    def _parse_dvcfile(self, tag: str, rev: str, text: str) -> DatasetVersion:
        doc = yaml.safe_load(text) or {}
        out = (doc.get("outs") or [{}])[0]
        record = doc.get("meta") or {}
        dataset, version = tag.rsplit("/", 1)
        return DatasetVersion(
            dataset=dataset, version=version, md5=str(out.get("md5", "")), rev=rev, tag=tag, path=tag,
            source_uri=str(record.get("source_uri", "")), provider=str(record.get("provider", "")),
            region=str(record.get("region", "")), registered_at=str(record.get("registered_at", "")),
            files=int(out.get("nfiles") or 0), bytes=int(out.get("size") or 0), meta=record.get("extra") or {},
            git_url=self.git_url, remote_url=self.remote_url,
        )

    def _all_versions(self, dataset: str | None) -> list[DatasetVersion]:
        refs = sorted(self._tag_refs(), key=lambda r: (r[2], r[0]))
        tags = [name for name, _, _ in refs if dataset is None or name.rsplit("/", 1)[0] == dataset]
        order = {tag: i for i, tag in enumerate(tags)}
        return sorted(self._read_tags(tags), key=lambda v: (v.registered_at, order[v.tag]))

    def _not_found(self, dataset: str, version: str) -> VersionNotFound:
        known = [v.version for v in self._all_versions(dataset)]
        if not known:
            datasets = sorted({v.dataset for v in self._all_versions(None)})
            listed = ", ".join(datasets) if datasets else "none yet"
            return VersionNotFound(f"{dataset}@{version} is not registered in {self.git_url}: that dataset has no versions (datasets registered: {listed}).")
        near = difflib.get_close_matches(version, known, n=3, cutoff=0.5)
        parts = [f"nearest: {', '.join(near)}"] if near else []
        parts.append(f"latest: {', '.join(reversed(known[-5:]))}")
        return VersionNotFound(
            f"{dataset}@{version} is not registered in {self.git_url} ({len(known)} versions of {dataset}; "
            f"{'; '.join(parts)}). List them with DataRegistry.versions('{dataset}')."
        )

    def _ensure_initialised(self) -> None:
        """A registry's first commit: `dvc init` and the remote (verify = true) on branch main."""
        if self._rev(f"refs/heads/{BRANCH}"):
            return
        self._init_mirror()  # a missing SINEWGRID_REGISTRY_GIT path was refused by _sync_down
        from dvc.repo import Repo

        with tempfile.TemporaryDirectory(prefix="sinewgrid-registry-init-") as tmp:
            work = Path(tmp)
            _git("init", "--quiet", f"--initial-branch={BRANCH}", cwd=work)
            logging.getLogger("dvc.repo.init").setLevel(logging.WARNING)  # no "Initialized DVC repository" on stdout
            repo = Repo.init(str(work))
            try:
                with repo.config.edit() as conf:
                    conf["core"]["remote"] = REMOTE_NAME
                    conf["remote"][REMOTE_NAME] = {"url": self.remote_url, "verify": True}
            finally:
                repo.close()
                shutil.rmtree(repo.site_cache_dir, ignore_errors=True)  # DVC's per-checkout state for this temporary checkout
            (work / "README.md").write_text(_README.format(remote=self.remote_url))
            _git("add", "-A", cwd=work)
            _git(*_identity(), "commit", "--quiet", "-m", f"Create the Sinewgrid data registry (DVC remote {self.remote_url})", cwd=work)
            _git("push", "--quiet", str(self._mirror), f"HEAD:refs/heads/{BRANCH}", cwd=work)
        _git("symbolic-ref", "HEAD", f"refs/heads/{BRANCH}", cwd=self._mirror)
        try:
            self._publish([f"refs/heads/{BRANCH}"])
        except _Rejected:
            self._rollback(None, None)
            raise

    def _rollback(self, old_main: str | None, tag: str | None) -> None:
        """Undo a local commit whose publication failed: the mirror stays what upstream has."""
        if tag:
            _git("tag", "-d", tag, cwd=self._mirror, check=False)
        if old_main:
            _git("update-ref", f"refs/heads/{BRANCH}", old_main, cwd=self._mirror)
        else:
            _git("update-ref", "-d", f"refs/heads/{BRANCH}", cwd=self._mirror, check=False)

    # Upstream: a git server, or the bundle on the object store -----------------------------
    def _sync_down(self) -> None:
        """Make the local mirror exactly what upstream holds (nothing to do for a local repository).

        Upstream is the truth: refs it no longer has are pruned, and a cache whose bundle is gone
        (a wiped or recreated root) is emptied rather than trusted.
        """
        if self._mode == "local":
            if not self._create_mirror and not (self._mirror / "HEAD").exists():
                raise _unreachable("git repository", self.git_url, "no git repository there; create it with `git init --bare` or fix " + ENV_GIT)
            return
        with _file_lock(self._sync_lock):
            if self._mode == "git":
                self._init_mirror()
                self._fetch(self.git_url, what="git repository")
                return
            fingerprint = self._bundle_fingerprint()
            if fingerprint is None:
                if self._saved_fingerprint() is not None or self._has_refs():
                    shutil.rmtree(self._mirror, ignore_errors=True)  # our cache of a registry that no longer exists
                    self._fingerprint_file.unlink(missing_ok=True)
                self._init_mirror()
                return
            if fingerprint == self._saved_fingerprint() and (self._mirror / "HEAD").exists():
                return
            self._init_mirror()
            fs, path = fs_for(self._bundle_uri)
            local = self._mirror.with_name(f"datasets.bundle.{uuid.uuid4().hex[:8]}")
            try:
                try:
                    fs.get_file(path, str(local))
                except Exception as exc:  # noqa: BLE001
                    raise _unreachable("git bundle", self._bundle_uri, exc) from exc
                self._fetch(str(local), what="git bundle")
            finally:
                local.unlink(missing_ok=True)
            self._fingerprint_file.write_text(fingerprint)

    def _init_mirror(self) -> None:
        if not (self._mirror / "HEAD").exists():
            self._mirror.parent.mkdir(parents=True, exist_ok=True)
            _git("init", "--bare", "--quiet", f"--initial-branch={BRANCH}", str(self._mirror))
            self._fingerprint_file.unlink(missing_ok=True)

    def _has_refs(self) -> bool:
        if not (self._mirror / "HEAD").exists():
            return False
        return bool(_git("for-each-ref", "--count=1", cwd=self._mirror).stdout.strip())

    def _fetch(self, source: str, *, what: str) -> None:
        proc = _git("fetch", "--quiet", "--prune", "--update-head-ok", source, "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*",
                    cwd=self._mirror, check=False)
        if proc.returncode == 0:
            return
        if what == "git bundle":
            raise RegistryError(
                f"the git bundle {self._bundle_uri} cannot be read ({proc.stderr.strip()}): restore it from the object "
                "store's versioning or a backup."
            )
        raise _unreachable(what, self.git_url, proc.stderr.strip())

    def _publish(self, refs: list[str]) -> None:
        """Send the mirror's new refs upstream; _Rejected when someone else published first."""
        if self._mode == "local":
            return
        with _file_lock(self._sync_lock):
            if self._mode == "git":
                proc = _git("push", "--quiet", "--atomic", "--porcelain", self.git_url, *[f"{r}:{r}" for r in refs], cwd=self._mirror, check=False)
                if proc.returncode == 0:
                    return
                text = proc.stdout + proc.stderr
                if "[rejected]" in text or "non-fast-forward" in text or "fetch first" in text or "already exists" in text:
                    raise _Rejected(text)
                raise _unreachable("git repository", self.git_url, proc.stderr.strip())
            if self._bundle_fingerprint() != self._saved_fingerprint():
                raise _Rejected("the bundle changed since it was read")
            fs, path = fs_for(self._bundle_uri)
            local = self._mirror.with_name(f"datasets.bundle.{uuid.uuid4().hex[:8]}")
            try:
                _git("bundle", "create", "--quiet", str(local), "--all", cwd=self._mirror)
                try:
                    fs.put_file(str(local), path)
                except Exception as exc:  # noqa: BLE001
                    raise _unreachable("git bundle", self._bundle_uri, exc) from exc
            finally:
                local.unlink(missing_ok=True)
            self._fingerprint_file.write_text(self._bundle_fingerprint() or "")

    @property
    def _fingerprint_file(self) -> Path:
        return self._mirror.with_name("bundle.fingerprint")

    def _saved_fingerprint(self) -> str | None:
        try:
            return self._fingerprint_file.read_text() or None
        except FileNotFoundError:
            return None

    def _bundle_fingerprint(self) -> str | None:
        """What identifies the bundle object now (ETag, size, time), or None if there is none yet."""
        fs, path = fs_for(self._bundle_uri)
        try:
            fs.invalidate_cache(path)
            info = fs.info(path)
        except FileNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001
            raise _unreachable("git bundle", self._bundle_uri, exc) from exc
        keys = ("ETag", "etag", "md5Hash", "size", "LastModified", "mtime", "generation")
        return json.dumps({k: info.get(k) for k in keys if info.get(k) is not None}, sort_keys=True, default=str)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container user with no name
        return "sinewgrid"


def _identity() -> list[str]:
    user = _user()
    return ["-c", f"user.name={user} (sinewgrid)", "-c", f"user.email={user}@{socket.gethostname()}"]


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


_README = """# Sinewgrid data registry

Every curated dataset version is `<dataset>/<version>` here: a `.dvc` file, committed and
tagged `<dataset>/<version>`. The bytes live in the DVC remote {remote}.

Get one back without Sinewgrid:

    dvc get <this repository> cell/omics/VERSION --rev cell/omics/VERSION -o VERSION

Do not edit or move files here by hand: register a new version instead.
"""
