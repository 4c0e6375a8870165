"""The data registry's DVC side, run in-process: the remote's configuration in a new registry,
building a source folder's DVC objects and copying them straight to the remote, writing a
version's `.dvc` file, and downloading a version back, verified file by file.

Files go from the source to the remote without a local DVC cache; `dvc add --to-remote` is not
used because it leaves a temporary copy of every file in the remote (DVC issue #10783).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_layer.registry.dataset_version import DatasetVersion
from data_layer.registry.names import ENV_GIT, DatasetChanged, RegistryError, RegistryUnreachable, join_uri, unreachable
from workload_runtime.storage import fs_for

REMOTE_NAME = "storage"


# A new registry ---------------------------------------------------------------------
def init_dvc(work: Path, remote_url: str) -> None:
    """`dvc init` in the git checkout `work`, with the remote `remote_url` (verify = true) as default."""
    from dvc.repo import Repo

    logging.getLogger("dvc.repo.init").setLevel(logging.WARNING)  # no "Initialized DVC repository" on stdout
    repo = Repo.init(str(work))
    try:
        with repo.config.edit() as conf:
            conf["core"]["remote"] = REMOTE_NAME
            conf["remote"][REMOTE_NAME] = {"url": remote_url, "verify": True}
    finally:
        repo.close()
        shutil.rmtree(repo.site_cache_dir, ignore_errors=True)  # DVC's per-checkout state for this temporary checkout


# Registering ------------------------------------------------------------------------
def open_repo(work: Path) -> Any:
    """The DVC repository of the registry checkout `work` (use it as a context manager)."""
    from dvc.repo import Repo

    return Repo(str(work), config={"core": {"site_cache_dir": str(work / ".dvc" / "tmp" / "site-cache")}})


def check_remote(repo: Any, remote_url: str, git_url: str) -> None:
    """RegistryError unless the registry keeps its data in this storage root's remote."""
    recorded = repo.config["remote"].get(REMOTE_NAME, {}).get("url", "")
    if recorded.rstrip("/") != remote_url.rstrip("/"):
        raise RegistryError(
            f"the registry {git_url} keeps its data in the DVC remote {recorded or '(none)'}, but this "
            f"storage root's remote is {remote_url}: nothing was registered. Point {ENV_GIT} at this "
            "root's registry; or, if the root moved, record the new place in the registry (clone it, "
            f"`dvc remote modify {REMOTE_NAME} url {remote_url}`, commit, push)."
        )


@dataclass(frozen=True)
class HashedSource:
    """A source folder hashed for the remote: its directory object, staged, not yet uploaded."""

    odb: Any
    staging: Any
    meta: Any
    obj: Any

    @property
    def md5(self) -> str:
        return self.obj.hash_info.value


@contextlib.contextmanager
def hashed_source(repo: Any, source: str) -> Iterator[HashedSource]:
    """Hash the folder at `source` for the remote; the staging area is removed on exit."""
    from dvc.fs import get_cloud_fs
    from dvc_data.hashfile.build import build

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
    try:
        yield HashedSource(odb=odb, staging=staging, meta=src_meta, obj=obj)
    finally:
        with contextlib.suppress(Exception):
            staging.fs.rm(staging.path, recursive=True)


def upload(hashed: HashedSource, source: str, remote_url: str) -> None:
    """Copy every object of `hashed` from the source straight to the remote."""
    from dvc_data.hashfile.transfer import transfer

    try:
        result = transfer(hashed.staging, hashed.odb, {hashed.obj.hash_info}, hardlink=False, shallow=False)
    except Exception as exc:  # noqa: BLE001
        raise unreachable("DVC remote", remote_url, exc) from exc
    if result.failed:
        raise RegistryUnreachable(
            f"{len(result.failed)} objects of {source} could not be written to the DVC remote "
            f"{remote_url}; nothing was registered. Check its permissions, credentials and free space."
        )


def write_dvcfile(repo: Any, work: Path, dataset: str, version: str, hashed: HashedSource, record: dict) -> None:
    """Write `<dataset>/<version>.dvc` in the checkout `work`: the hash of `hashed`, with `record` as its meta."""
    (work / dataset).mkdir(parents=True, exist_ok=True)
    stage = repo.stage.create(
        single_stage=True,
        validate=False,
        fname=str(work / f"{dataset}/{version}.dvc"),
        wdir=str(work / dataset),
        outs=[version],
        meta=record,
        desc=f"{dataset}@{version} registered by Sinewgrid",
    )
    out = stage.outs[0]
    out.hash_info, out.meta, out.files = hashed.obj.hash_info, hashed.meta, None
    stage.dump()


# Getting a version back ----------------------------------------------------------------
def manifest(version_info: DatasetVersion, remote_url: str) -> dict[str, str]:
    """{relpath: md5} from the registered `.dir` object, itself checked against the `.dvc` hash."""
    md5 = version_info.md5
    uri = join_uri(remote_url, "files", "md5", md5[:2], md5[2:])
    fs, path = fs_for(uri)
    try:
        data = fs.cat_file(path)
    except FileNotFoundError as exc:
        raise RegistryError(
            f"{version_info.ref}: its manifest {uri} is missing from the DVC remote: the remote was "
            "pruned or points elsewhere. Nothing was downloaded."
        ) from exc
    except Exception as exc:  # noqa: BLE001
        raise unreachable("DVC remote", remote_url, exc) from exc
    actual = hashlib.md5(data).hexdigest()
    if actual != version_info.md5.split(".")[0]:
        raise DatasetChanged(
            f"{version_info.ref}: the manifest object {uri} hashes to {actual}, not the registered "
            f"{version_info.md5}: it was changed in the DVC remote behind the registry's back. Nothing was "
            "downloaded; restore the remote from a backup or register the data again under a new version."
        )
    return {entry["relpath"]: entry["md5"] for entry in json.loads(data)}


def download(git_repo: Path, version_info: DatasetVersion, partial: Path, remote_url: str) -> None:
    """The files of `version_info` from `remote_url` into the new folder `partial`."""
    from dvc.api import DVCFileSystem

    try:
        # The bytes are read from this root's remote, even if the registry recorded another place (a moved root).
        fs = DVCFileSystem(url=str(git_repo), rev=version_info.tag, remote=REMOTE_NAME, remote_config={"url": remote_url})
        try:
            fs.get(version_info.path, str(partial), recursive=True)
        finally:
            fs.close()
    except Exception as exc:  # noqa: BLE001
        raise RegistryError(
            f"downloading {version_info.ref} from {remote_url} failed: {exc}. If objects are missing the "
            "remote was pruned; if the remote cannot be reached check credentials, AWS_ENDPOINT_URL and the network."
        ) from exc


def verify(version_info: DatasetVersion, expected: dict[str, str], partial: Path) -> None:
    """DatasetChanged unless the files under `partial` are exactly the manifest `expected`."""
    from dvc_data.hashfile.hash import file_md5

    got = {p.relative_to(partial).as_posix(): p for p in partial.rglob("*") if p.is_file()}
    problems: list[str] = []
    for rel in sorted(set(expected) - set(got)):
        problems.append(f"{rel}: missing")
    for rel in sorted(set(got) - set(expected)):
        problems.append(f"{rel}: not in the registered manifest")
    for rel in sorted(set(expected) & set(got)):
        actual = file_md5(str(got[rel]))
        if actual != expected[rel]:
            problems.append(f"{rel}: md5 {actual}, registered {expected[rel]}")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise DatasetChanged(
            f"{version_info.ref} (registered at rev {version_info.rev[:12]}, md5 {version_info.md5}) does not "
            f"match what the DVC remote {version_info.remote_url} returned: {shown}. The remote was changed "
            "behind the registry's back; nothing was written to the destination."
        )
