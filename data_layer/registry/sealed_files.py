"""Sealed files in a fetched dataset folder: which tenants sealed them, and opening them in place.

Data registered from a tenant's storage root is stored sealed (`workload_runtime/envelope.py`), so its DVC
remote holds only ciphertext and `dvc get` gives sealed files back. `decrypt_folder` turns such a
folder into the plain dataset for whoever holds the tenant's key (`sinewgrid data get --tenant`,
`sinewgrid data decrypt`):

1. every sealed file is opened and its plaintext written to a hidden temporary sibling;
2. only when all of them opened, each temporary file is renamed over its sealed original.

So a file is replaced only by its complete plain form, and on any failure (the key unavailable:
`KeyUnavailable`; a file that fails its integrity tag: `SealedDataError` naming it) the temporary
files are removed and the folder is left exactly as it was. Plain files are left alone: running it again after an interruption finishes
the job.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from workload_runtime.envelope import Opener, SealedDataError, is_sealed, read_header

_TEMP_MARK = ".sinewgrid-plain-"


@dataclass(frozen=True)
class Decrypted:
    files: int  # sealed files replaced by their plain form
    plain: int  # files that were plain already (left alone)
    bytes: int  # plaintext bytes written


def _files(where: Path) -> list[Path]:
    if where.is_file():
        return [where]
    return sorted(p for p in where.rglob("*") if p.is_file() and _TEMP_MARK not in p.name)


def _head(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(1 << 16)  # a header is well under 64 KiB


def sealed_tenants(where: Path) -> Counter[str]:
    """{tenant: sealed files} under `where` (a folder or one file); empty when nothing is sealed."""
    found: Counter[str] = Counter()
    for path in _files(where):
        head = _head(path)
        if is_sealed(head):
            found[read_header(head).tenant] += 1
    return found


def decrypt_folder(where: Path, opener: Opener) -> Decrypted:
    """Replace every sealed file under `where` (a folder or one file) by its plain form, all or none."""
    if not where.exists():
        raise FileNotFoundError(f"{where} does not exist: nothing to decrypt")
    written: list[tuple[Path, Path]] = []
    plain_files = total = 0
    try:
        for path in _files(where):
            if not is_sealed(_head(path)):
                plain_files += 1
                continue
            try:
                data = opener.open(path.read_bytes())
            except SealedDataError as exc:
                raise SealedDataError(f"{path}: {exc}") from None
            temp = path.with_name(f".{path.name}{_TEMP_MARK}{uuid.uuid4().hex[:8]}")
            written.append((temp, path))
            with open(temp, "wb") as fh:
                fh.write(data)
            os.chmod(temp, path.stat().st_mode & 0o777)
            total += len(data)
    except BaseException:
        for temp, _ in written:
            temp.unlink(missing_ok=True)
        raise
    for temp, path in written:
        os.replace(temp, path)
    return Decrypted(files=len(written), plain=plain_files, bytes=total)

