"""The data registry's names and errors: what a dataset and a version may be called, how
`dataset@version` references parse, the errors every part of the registry raises, and which
provider and region a storage root is in (recorded with every registered version).
"""

from __future__ import annotations

import re

from control_plane.settings import settings
from workload_runtime.storage import Storage

ENV_GIT = "SINEWGRID_REGISTRY_GIT"
ENV_REGION = "SINEWGRID_STORAGE_REGION"
ENV_PROVIDER = "SINEWGRID_STORAGE_PROVIDER"

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


def unreachable(what: str, url: str, exc: BaseException | str) -> RegistryUnreachable:
    """The error for a git repository, bundle or DVC remote that cannot be reached, with what to check."""
    return RegistryUnreachable(
        f"cannot reach the registry's {what} at {url}: {exc}. Check {ENV_GIT} (the git repository), "
        "your credentials (AWS_PROFILE / AWS_ACCESS_KEY_ID), AWS_ENDPOINT_URL for an S3-compatible "
        "store, and the network."
    )


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


def join_uri(base: str, *parts: str) -> str:
    """`base/part/part`, for a local path or a URI alike."""
    return "/".join([base.rstrip("/"), *parts])


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
