"""One registered dataset version (`DatasetVersion`): what the registry returns for
`dataset@version`, read from its `.dvc` file, and how to get it back with plain DVC.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

import yaml


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

    @classmethod
    def from_dvcfile(cls, tag: str, rev: str, text: str, *, git_url: str, remote_url: str) -> DatasetVersion:
        """The version tagged `tag` at commit `rev`, from the text of its `<tag>.dvc` file."""
        doc = yaml.safe_load(text) or {}
        out = (doc.get("outs") or [{}])[0]
        record = doc.get("meta") or {}
        dataset, version = tag.rsplit("/", 1)
        return cls(
            dataset=dataset, version=version, md5=str(out.get("md5", "")), rev=rev, tag=tag, path=tag,
            source_uri=str(record.get("source_uri", "")), provider=str(record.get("provider", "")),
            region=str(record.get("region", "")), registered_at=str(record.get("registered_at", "")),
            files=int(out.get("nfiles") or 0), bytes=int(out.get("size") or 0), meta=record.get("extra") or {},
            git_url=git_url, remote_url=remote_url,
        )

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
