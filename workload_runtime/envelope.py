"""Envelope encryption of weights and data: AES-256-GCM (`cryptography`), data keys wrapped by the tenant's key.

A sealed object is::

    SGSEAL1\\n | header length (4 bytes, big-endian) | header (JSON) | nonce (12 bytes) | ciphertext + GCM tag

The header names the algorithm, the tenant, the tenant's key id and the data key wrapped by that
key (never the data key itself); it is authenticated as associated data, so a header moved onto
other bytes, or bytes changed by one bit, fail to open. One `Sealer` holds one data key for all
the objects of one dataset version or one checkpoint (a fresh 96-bit random nonce per object);
an `Opener` unwraps each data key once for its lifetime, so reading a dataset asks the key once.

Decrypting by hand needs only this header and the key: `sinewgrid data get` does it, and
docs/tenancy.md shows the ten lines of Python that do it without Sinewgrid.
"""

from __future__ import annotations

import base64
import io
import json
import os
import struct
from collections.abc import Callable, Iterator
from typing import BinaryIO
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from workload_runtime.keys import Keyring

MAGIC = b"SGSEAL1\n"
ALG = "AES-256-GCM"
_LEN = struct.Struct(">I")
CHUNK_BYTES = 8 << 20  # what `seal_chunks` hands a writer at a time


class SealedDataError(ValueError):
    """Bytes that claim to be sealed and are not whole, or fail their tag."""


@dataclass(frozen=True)
class SealedHeader:
    tenant: str
    key_id: str
    wrapped_key: bytes

    def to_bytes(self) -> bytes:
        return json.dumps(
            {"alg": ALG, "tenant": self.tenant, "key_id": self.key_id, "wrapped_key": base64.b64encode(self.wrapped_key).decode()},
            sort_keys=True, separators=(",", ":"),
        ).encode()


def is_sealed(data: bytes | memoryview) -> bool:
    return bytes(data[: len(MAGIC)]) == MAGIC


def read_header(blob: bytes | memoryview) -> tuple[SealedHeader, int]:
    """The header of a sealed object and where its nonce starts."""
    if not is_sealed(blob):
        raise SealedDataError("not a sealed object (it does not start with SGSEAL1)")
    start = len(MAGIC) + _LEN.size
    if len(blob) < start:
        raise SealedDataError("sealed object cut short before its header")
    (size,) = _LEN.unpack_from(blob, len(MAGIC))
    try:
        doc = json.loads(bytes(blob[start : start + size]))
        header = SealedHeader(doc["tenant"], doc["key_id"], base64.b64decode(doc["wrapped_key"]))
    except (ValueError, KeyError) as exc:
        raise SealedDataError(f"sealed object with an unreadable header ({exc})") from None
    if doc.get("alg") != ALG:
        raise SealedDataError(f"sealed with {doc.get('alg')!r}; this version reads {ALG}")
    return header, start + size


class Sealer:
    """Seals objects with one data key, made by `keyring` (one tenant key use per Sealer)."""

    def __init__(self, keyring: Keyring) -> None:
        plain, wrapped = keyring.new_data_key()
        self.tenant, self.key_id = keyring.tenant, keyring.key_id
        self._key = plain
        self._aes = AESGCM(plain)
        header = SealedHeader(self.tenant, self.key_id, wrapped).to_bytes()
        self._prefix = MAGIC + _LEN.pack(len(header)) + header

    def seal(self, data: bytes | memoryview) -> bytes:
        """The sealed object, encrypted straight into its one buffer (no copy of a large object)."""
        nonce = os.urandom(12)
        head = len(self._prefix) + len(nonce)
        out = bytearray(head + len(data) + 16)
        out[: len(self._prefix)], out[len(self._prefix) : head] = self._prefix, nonce
        self._aes.encrypt_into(nonce, data, self._prefix, memoryview(out)[head:])
        return out  # a bytearray: every writer takes it as bytes

    def seal_chunks(self, data: bytes | memoryview, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The same sealed object as `seal`, made a chunk at a time (GCM is a stream cipher: the
        bytes are identical), so a writer can write and hash one chunk while the next is made."""
        nonce = os.urandom(12)
        encryptor = Cipher(algorithms.AES(self._key), modes.GCM(nonce)).encryptor()
        encryptor.authenticate_additional_data(self._prefix)
        yield self._prefix + nonce
        view = memoryview(data)
        for start in range(0, len(view), chunk_bytes):
            yield encryptor.update(view[start : start + chunk_bytes])
        yield encryptor.finalize() + encryptor.tag


class SealingStream(io.RawIOBase):
    """A writable stream that seals what is written to it into `out` as it comes: the bytes
    `Sealer.seal` would make of the whole, without holding it (GCM is a stream cipher). `tell`
    counts the plaintext written, as a reader of the opened object sees it; `close` writes the
    tag and leaves `out` open for its owner to close."""

    def __init__(self, sealer: Sealer, out: BinaryIO) -> None:
        super().__init__()
        nonce = os.urandom(12)
        self._encryptor = Cipher(algorithms.AES(sealer._key), modes.GCM(nonce)).encryptor()
        self._encryptor.authenticate_additional_data(sealer._prefix)
        self._out, self._written = out, 0
        out.write(sealer._prefix + nonce)

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | memoryview) -> int:  # type: ignore[override]
        self._out.write(self._encryptor.update(data))
        self._written += len(data)
        return len(data)

    def tell(self) -> int:
        return self._written

    def close(self) -> None:
        if not self.closed:
            self._out.write(self._encryptor.finalize() + self._encryptor.tag)
        super().close()


class Opener:
    """Opens sealed objects; `resolve(tenant, key_id)` gives the keyring that unwraps their data keys.

    Each distinct data key is unwrapped once per Opener (one KMS call for a whole dataset version).
    """

    def __init__(self, resolve: Callable[[str, str], Keyring]) -> None:
        self._resolve = resolve
        self._keys: dict[bytes, AESGCM] = {}

    def open(self, blob: bytes | memoryview) -> bytes:
        header, at = read_header(blob)
        aes = self._keys.get(header.wrapped_key)
        if aes is None:
            aes = AESGCM(self._resolve(header.tenant, header.key_id).unwrap(header.wrapped_key))
            self._keys[header.wrapped_key] = aes
        view = memoryview(blob)  # slices of the stored bytes, not copies of a large object
        try:
            return aes.decrypt(view[at : at + 12], view[at + 12 :], view[:at])
        except InvalidTag:
            raise SealedDataError(f"sealed object of tenant `{header.tenant}` fails its integrity tag: it was changed or cut short") from None


def seal_bytes(data: bytes, keyring: Keyring) -> bytes:
    """One object sealed with a data key of its own."""
    return Sealer(keyring).seal(data)


def open_bytes(blob: bytes, keyring: Keyring) -> bytes:
    """One sealed object opened with `keyring` (which must be the tenant key named in its header)."""
    return Opener(lambda tenant, key_id: keyring).open(blob)
