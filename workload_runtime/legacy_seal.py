"""The retired SGSEAL1 format, read only: what `sinewgrid tenants reseal` moves to the standard one.

Objects sealed before the AWS Encryption SDK's format (`envelope.py`) are::

    SGSEAL1\\n | header length (4 bytes, big-endian) | header (JSON) | nonce (12 bytes) | ciphertext + GCM tag

with the tenant, its key id and the data key wrapped by that key in the header, which is
authenticated as associated data. They still open, so nothing is lost, until resealed.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MAGIC = b"SGSEAL1\n"
ALG = "AES-256-GCM"
_LEN = struct.Struct(">I")


class LegacySealError(ValueError):
    """An SGSEAL1 object that is not whole, or fails its tag."""


@dataclass(frozen=True)
class LegacyHeader:
    tenant: str
    key_id: str
    wrapped_key: bytes
    body_at: int


def is_legacy(blob: bytes | memoryview) -> bool:
    return bytes(blob[: len(MAGIC)]) == MAGIC


def read_legacy_header(blob: bytes | memoryview) -> LegacyHeader:
    start = len(MAGIC) + _LEN.size
    if not is_legacy(blob) or len(blob) < start:
        raise LegacySealError("not a whole SGSEAL1 object")
    (size,) = _LEN.unpack_from(blob, len(MAGIC))
    try:
        doc = json.loads(bytes(blob[start : start + size]))
        header = LegacyHeader(doc["tenant"], doc["key_id"], base64.b64decode(doc["wrapped_key"]), start + size)
    except (ValueError, KeyError) as exc:
        raise LegacySealError(f"sealed object with an unreadable header ({exc})") from None
    if doc.get("alg") != ALG:
        raise LegacySealError(f"sealed with {doc.get('alg')!r}; SGSEAL1 is {ALG}")
    return header


def open_legacy(blob: bytes | memoryview, header: LegacyHeader, data_key: bytes) -> bytes:
    """The plaintext of an SGSEAL1 object whose data key (`header.wrapped_key`, unwrapped) is `data_key`."""
    view, at = memoryview(blob), header.body_at
    try:
        return AESGCM(data_key).decrypt(view[at : at + 12], view[at + 12 :], view[:at])
    except InvalidTag:
        raise LegacySealError(f"sealed object of tenant `{header.tenant}` fails its integrity tag: it was changed or cut short") from None
