"""The data registry facade (`DataRegistry`): find, list, get and register dataset versions of a
storage root, over its git repository (git_mirror.py) and its DVC remote (dvc_store.py).

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

See docs/datasets.md for the user's side.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import socket
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from data_layer.registry import dvc_store
from data_layer.registry.dataset_version import DatasetVersion
from data_layer.registry.git_mirror import BRANCH, GitMirror, PublishRejected, commit_identity, file_lock, run_git, user_name
from data_layer.registry.names import (
    DatasetChanged,
    RegistryError,
    VersionNotFound,
    join_uri,
    storage_location,
    validate_dataset,
    validate_version,
)
from data_layer.registry.sealed_files import decrypt_folder
from workload_runtime.storage import Storage, fs_for
from control_plane.settings import settings
from workload_runtime.envelope import Opener

_PUBLISH_TRIES = 5


class DataRegistry:
    """Dataset versions in a DVC-tracked git repository plus a DVC remote under the storage root."""

    def __init__(self, root: str, *, git_spec: str | None = None) -> None:
        storage = Storage.at(root)
        self.root = storage.root
        root_path = self.root[len("file://"):] if self.root.startswith("file://") else self.root
        self.remote_url = join_uri(root_path if storage.is_local else self.root, "registry", "dvc-store")
        self._mirror = GitMirror.choose(self.root, root_path if storage.is_local else None, git_spec)
        self.git_url = self._mirror.git_url
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
        self._mirror.sync_down()
        found = self._read_tags([f"{dataset}/{version}"])
        if found:
            return found[0]
        raise self._not_found(dataset, version)

    def versions(self, dataset: str | None = None) -> list[DatasetVersion]:
        """Every registered version (of one dataset, or of all), oldest first."""
        if dataset is not None:
            validate_dataset(dataset)
        self._mirror.sync_down()
        return self._all_versions(dataset)

    def get(self, dataset: str, version: str, dest: str, *, opener: Opener | None = None) -> DatasetVersion:
        """Download a version into `dest` (a new local path or URI), verified file by file.

        Refuses a `dest` that exists. Downloads into a temporary sibling, checks every file
        against the registered hashes (DatasetChanged if any differs, and `dest` is not
        created), then renames it into place.

        With `opener` (a tenant's data, stored sealed): after the check every sealed file is
        replaced by its plain form (`sealed_files.decrypt_folder`), so `dest` holds the plain
        dataset; if one cannot be opened (`KeyUnavailable`, `SealedDataError`) `dest` is not created.
        """
        version_info = self.find(dataset, version)
        manifest = dvc_store.manifest(version_info, self.remote_url)
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
            dvc_store.download(self._mirror.path, version_info, partial, self.remote_url)
            dvc_store.verify(version_info, manifest, partial)
            if opener is not None:
                decrypt_folder(partial, opener)
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
        source = _normalise_source(source_uri)
        tag = f"{dataset}/{version}"
        with file_lock(self._mirror.register_lock):
            for _ in range(_PUBLISH_TRIES):
                try:
                    self._mirror.sync_down()
                    self._ensure_initialised()
                    with tempfile.TemporaryDirectory(prefix="sinewgrid-registry-") as tmp:
                        work = Path(tmp) / "work"
                        run_git("clone", "--quiet", "--branch", BRANCH, str(self._mirror.path), str(work))
                        return self._register_in(work, dataset, version, tag, source, extra)
                except PublishRejected:
                    continue
        raise RegistryError(
            f"could not publish {dataset}@{version} to {self.git_url} after {_PUBLISH_TRIES} tries: other "
            "registrations kept landing first. Try again."
        )

    def _register_in(self, work: Path, dataset: str, version: str, tag: str, source: str, extra: dict) -> DatasetVersion:
        with dvc_store.open_repo(work) as repo:
            dvc_store.check_remote(repo, self.remote_url, self.git_url)
            with dvc_store.hashed_source(repo, source) as hashed:
                existing = self._read_tags([tag])
                if existing:
                    if existing[0].md5 == hashed.md5:
                        return existing[0]
                    raise DatasetChanged(
                        f"{dataset}@{version} was registered at rev {existing[0].rev[:12]} with md5 {existing[0].md5}; "
                        f"the data at {source} now hashes to {hashed.md5}: it changed after registration; nothing was "
                        "overwritten; register it under a new version."
                    )
                if not hashed.meta.nfiles:
                    raise RegistryError(f"{source} holds no files: there is nothing to register.")
                dvc_store.upload(hashed, source, self.remote_url)

            provider, region = self._storage_location()
            record = {
                "dataset": dataset,
                "version": version,
                "source_uri": source,
                "provider": provider,
                "region": region,
                "registered_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "registered_by": f"{user_name()}@{socket.gethostname()}",
                "extra": extra,
            }
            dvc_store.write_dvcfile(repo, work, dataset, version, hashed, record)

        run_git("add", f"{tag}.dvc", cwd=work)
        run_git(*commit_identity(), "commit", "--quiet", "-m",
                f"Register {dataset}@{version}\n\nsource: {source}\nmd5: {hashed.md5}\nfiles: {hashed.meta.nfiles}, bytes: {hashed.meta.size}", cwd=work)
        run_git("tag", tag, cwd=work)
        old_main = self._mirror.rev(f"refs/heads/{BRANCH}")
        run_git("push", "--quiet", "--atomic", "origin", f"HEAD:refs/heads/{BRANCH}", f"refs/tags/{tag}:refs/tags/{tag}", cwd=work)
        try:
            self._mirror.publish([f"refs/heads/{BRANCH}", f"refs/tags/{tag}"])
        except BaseException:
            self._mirror.rollback(old_main, tag)
            raise
        found = self._read_tags([tag])
        if not found:
            raise RegistryError(f"{tag} was pushed to {self._mirror.path} but cannot be read back: inspect that repository.")
        return found[0]

    def republish(self, dataset: str, version: str, folder: Path, reason: str) -> DatasetVersion:
        """Store `dataset@version` anew from `folder`: the same data in other bytes (`sinewgrid
        tenants reseal`: the same plaintext sealed under the tenant's new key). The version's tag
        moves to a new commit that says why and names the md5 it replaces; the old commit stays in
        the history. Returns the version as now registered (unchanged if `folder` hashes the same)."""
        tag = f"{dataset}/{version}"
        with file_lock(self._mirror.register_lock):
            for _ in range(_PUBLISH_TRIES):
                self._mirror.sync_down()
                (old,) = self._read_tags([tag]) or [None]
                if old is None:
                    raise self._not_found(dataset, version)
                ((_, _, dvcfile),) = self._mirror.tagged_dvcfiles([tag])
                with tempfile.TemporaryDirectory(prefix="sinewgrid-registry-") as tmp:
                    work = Path(tmp) / "work"
                    run_git("clone", "--quiet", "--branch", BRANCH, str(self._mirror.path), str(work))
                    with dvc_store.open_repo(work) as repo:
                        dvc_store.check_remote(repo, self.remote_url, self.git_url)
                        with dvc_store.hashed_source(repo, str(folder)) as hashed:
                            if hashed.md5 == old.md5:
                                return old
                            dvc_store.upload(hashed, str(folder), self.remote_url)
                        record = dict(yaml.safe_load(dvcfile).get("meta") or {})
                        record["republished"] = {"at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "reason": reason,
                                                 "replaces_md5": old.md5, "replaces_rev": old.rev}  # fmt: skip
                        (work / f"{tag}.dvc").unlink()  # written anew: DVC keeps an existing file's meta
                        dvc_store.write_dvcfile(repo, work, dataset, version, hashed, record)
                    run_git("add", f"{tag}.dvc", cwd=work)
                    run_git(*commit_identity(), "commit", "--quiet", "-m", f"Republish {dataset}@{version}: {reason}\n\nmd5: {hashed.md5} (was {old.md5})", cwd=work)
                    run_git("tag", "-f", tag, cwd=work)
                    old_main = self._mirror.rev(f"refs/heads/{BRANCH}")
                    run_git("push", "--quiet", "--atomic", "origin", f"HEAD:refs/heads/{BRANCH}", f"+refs/tags/{tag}:refs/tags/{tag}", cwd=work)
                try:
                    self._mirror.publish([f"refs/heads/{BRANCH}", f"refs/tags/{tag}"], moved=(f"refs/tags/{tag}",))
                except PublishRejected:
                    self._mirror.rollback(old_main, tag, old.rev)
                    continue
                except BaseException:
                    self._mirror.rollback(old_main, tag, old.rev)
                    raise
                return self.find(dataset, version)
        raise RegistryError(f"could not republish {dataset}@{version} to {self.git_url} after {_PUBLISH_TRIES} tries: other registrations kept landing first. Try again.")

    def _ensure_initialised(self) -> None:
        """A registry's first commit: `dvc init` and the remote (verify = true) on branch main."""
        if self._mirror.rev(f"refs/heads/{BRANCH}"):
            return
        self._mirror.init()  # a missing SINEWGRID_REGISTRY_GIT path was refused by sync_down
        with tempfile.TemporaryDirectory(prefix="sinewgrid-registry-init-") as tmp:
            work = Path(tmp)
            run_git("init", "--quiet", f"--initial-branch={BRANCH}", cwd=work)
            dvc_store.init_dvc(work, self.remote_url)
            (work / "README.md").write_text(_README.format(remote=self.remote_url))
            run_git("add", "-A", cwd=work)
            run_git(*commit_identity(), "commit", "--quiet", "-m", f"Create the Sinewgrid data registry (DVC remote {self.remote_url})", cwd=work)
            run_git("push", "--quiet", str(self._mirror.path), f"HEAD:refs/heads/{BRANCH}", cwd=work)
        run_git("symbolic-ref", "HEAD", f"refs/heads/{BRANCH}", cwd=self._mirror.path)
        try:
            self._mirror.publish([f"refs/heads/{BRANCH}"])
        except PublishRejected:
            self._mirror.rollback(None, None)
            raise

    # Internals ------------------------------------------------------------------------
    def _read_tags(self, tags: list[str]) -> list[DatasetVersion]:
        """The versions behind these tags (missing ones skipped), read in one git call."""
        return [DatasetVersion.from_dvcfile(tag, rev, text, git_url=self.git_url, remote_url=self.remote_url)
                for tag, rev, text in self._mirror.tagged_dvcfiles(tags)]

    def _all_versions(self, dataset: str | None) -> list[DatasetVersion]:
        refs = sorted(self._mirror.tag_refs(), key=lambda r: (r[2], r[0]))
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

    def _storage_location(self) -> tuple[str, str]:
        if self._location is None:
            self._location = storage_location(self.root)
        return self._location


def _normalise_source(source_uri: str) -> str:
    if not isinstance(source_uri, str) or not source_uri:
        raise RegistryError(f"source_uri {source_uri!r} must be a folder path or URI such as s3://bucket/prefix/folder.")
    if source_uri.startswith("file://"):
        source_uri = source_uri[len("file://"):]
    if "://" in source_uri:
        return source_uri.rstrip("/")
    return str(Path(source_uri).expanduser().resolve())


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


_README = """# Sinewgrid data registry

Every curated dataset version is `<dataset>/<version>` here: a `.dvc` file, committed and
tagged `<dataset>/<version>`. The bytes live in the DVC remote {remote}.

Get one back without Sinewgrid:

    dvc get <this repository> cell/omics/VERSION --rev cell/omics/VERSION -o VERSION

A tenant's data is stored sealed with the tenant's key (each file an AWS Encryption SDK message: docs/tenancy.md); whoever
holds the key opens them in place with `sinewgrid data decrypt VERSION --tenant NAME`, or
gets them plain at once with `sinewgrid data get DATASET VERSION DEST --tenant NAME`.

Do not edit or move files here by hand: register a new version instead.
"""
