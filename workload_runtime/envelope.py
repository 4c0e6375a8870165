"""Envelope encryption of weights and data, in the AWS Encryption SDK's message format.

A sealed object is one ESDK message (docs.aws.amazon.com/encryption-sdk, "Message format
reference"). The `aws-encryption-sdk` library makes and checks each message's header (its own
encryptor and decryptor, asked for the header alone); `frames.py` writes and reads the body's
frames in the SDK's layout, without the copies of the SDK's Python frame loop, and at random:

- algorithm suite 0x0478, `AES_256_GCM_HKDF_SHA512_COMMIT_KEY`: AES-256-GCM with a key derived per
  message by HKDF-SHA512, and **key commitment** (the header commits to the one key that opens it,
  so no crafted message opens to different plaintexts under different keys). No signature: the
  readers of a tenant's data are trusted as much as its writers (docs/tenancy.md says why);
- the **encryption context** `{"tenant": <tenant>}`, authenticated in the header and bound into the
  wrapping of the data key, so a message cannot be passed off as another tenant's;
- one encrypted data key, wrapped by the tenant's key (`master_keys.py`: a raw AES keyring for a
  local key file, AWS KMS in production);
- the body in 1 MiB frames, each with its own GCM tag, and a final frame, so a message cut short
  never opens.

One `Sealer` asks the tenant's key for one data key for all the objects of one dataset version or
one checkpoint; an `Opener` unwraps each data key once for its lifetime, so reading a dataset asks
the key once. Objects sealed in the retired SGSEAL1 format (`legacy_seal.py`) still open, and
`sinewgrid tenants reseal` rewrites them in this one.

An auditor opens any sealed object with the ESDK alone (docs/tenancy.md, "Opening data without
Sinewgrid"); `sinewgrid data get` and `data decrypt` do it here.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import aws_encryption_sdk
from aws_encryption_sdk.exceptions import AWSEncryptionSDKClientError
from aws_encryption_sdk.identifiers import Algorithm, CommitmentPolicy, ContentType
from aws_encryption_sdk.internal.formatting.deserialize import deserialize_header
from aws_encryption_sdk.materials_managers import EncryptionMaterialsRequest
from cryptography.exceptions import InvalidTag

from workload_runtime import legacy_seal
from workload_runtime.frames import FrameError, FrameWriter, Layout, MessageKey, SealedDataError, SealedView, final_frame, new_buffer, seal_body, seal_frames
from workload_runtime.keys import Keyring, KeyUnavailable
from workload_runtime.master_keys import OneDataKey, key_id_of

SUITE = Algorithm.AES_256_GCM_HKDF_SHA512_COMMIT_KEY
FRAME_BYTES = 1 << 20
CHUNK_BYTES = 8 << 20  # what a writer of plain bytes is handed at a time
TENANT = "tenant"  # the encryption context's one entry
PREFIX = b"\x02" + SUITE.algorithm_id.to_bytes(2, "big")  # message format version 2, then the suite
FORMAT = "aws-encryption-sdk message v2, suite 0x0478"
HEADER_BYTES = 1 << 16  # a header (one data key, one context entry) is well under 64 KiB
_CLIENT = aws_encryption_sdk.EncryptionSDKClient(commitment_policy=CommitmentPolicy.REQUIRE_ENCRYPT_REQUIRE_DECRYPT, max_encrypted_data_keys=1)


@dataclass(frozen=True)
class SealedHeader:
    tenant: str
    key_id: str
    format: str = FORMAT


def is_sealed(data: bytes | memoryview) -> bool:
    return bytes(data[: len(PREFIX)]) == PREFIX or legacy_seal.is_legacy(data)


def read_header(blob: bytes | memoryview) -> SealedHeader:
    """Whose a sealed object is and which key wrapped it, read without any key."""
    if legacy_seal.is_legacy(blob):
        try:
            old = legacy_seal.read_legacy_header(blob)
        except legacy_seal.LegacySealError as exc:
            raise SealedDataError(str(exc)) from None
        return SealedHeader(old.tenant, old.key_id, "SGSEAL1")
    if bytes(blob[: len(PREFIX)]) != PREFIX:
        raise SealedDataError(f"not a sealed object (it does not start as a message in {FORMAT})")
    try:
        header, _ = deserialize_header(io.BytesIO(bytes(blob[:HEADER_BYTES])), max_encrypted_data_keys=1)
        (data_key,) = header.encrypted_data_keys
        return SealedHeader(header.encryption_context[TENANT], key_id_of(data_key))
    except (AWSEncryptionSDKClientError, KeyError, ValueError) as exc:
        raise SealedDataError(f"sealed object with an unreadable header ({type(exc).__name__}: {exc})") from None


class Sealer:
    """Seals objects with one data key from `keyring` (the tenant's key asked once per Sealer)."""

    def __init__(self, keyring: Keyring) -> None:
        self._materials = OneDataKey(keyring)  # reads the key now: its id is the one it has now
        self.tenant, self.key_id = keyring.tenant, keyring.key_id
        self._context = {TENANT: keyring.tenant}
        # The data key is made now: a disabled or unreachable key stops the writer before it writes.
        self._materials.get_encryption_materials(EncryptionMaterialsRequest(
            encryption_context=dict(self._context), frame_length=FRAME_BYTES, algorithm=SUITE, commitment_policy=_CLIENT.config.commitment_policy,
        ))  # fmt: skip

    def message(self) -> tuple[bytes, MessageKey]:
        """A new message's header and key, made by the SDK's own encryptor: a fresh message id, its
        key derived from the data key, the key commitment and the header's tag."""
        encryptor = _CLIENT.stream(
            mode="e", source=io.BytesIO(b""), materials_manager=self._materials, encryption_context=dict(self._context),
            algorithm=SUITE, frame_length=FRAME_BYTES,
        )  # fmt: skip
        encryptor._prep_message()
        key = MessageKey(SUITE, encryptor._derived_data_key, encryptor._header.message_id, FRAME_BYTES)
        return bytes(encryptor.output_buffer), key

    def seal_chunks(self, data: bytes | memoryview) -> Iterator[bytes | memoryview]:
        """The sealed object a part at a time (the header, then runs of frames), so a writer writes
        and hashes one part while the next is sealed."""
        header, key = self.message()
        yield header
        view, length = memoryview(data).cast("B"), key.frame_length
        whole, run = len(view) // length, max(1, CHUNK_BYTES // length)
        for first in range(0, whole, run):
            count = min(run, whole - first)
            sealed = new_buffer(count * key.regular_bytes)  # a new buffer: the writer may still hold the last
            seal_frames(key, view[first * length :], sealed, first + 1, count)
            yield sealed
        yield final_frame(key, whole + 1, view[whole * length :])

    def seal(self, data: bytes | memoryview) -> bytes:
        return bytes(self.seal_buffer(data))

    def seal_buffer(self, data: bytes | memoryview) -> memoryview:
        """`seal`, made in one new buffer (no copy to make it `bytes`)."""
        header, key = self.message()
        view = memoryview(data).cast("B")
        out = new_buffer(len(header) + key.body_bytes(len(view)))
        out[: len(header)] = header
        seal_body(key, view, out[len(header) :])
        return out


class SealingStream(io.RawIOBase):
    """A writable stream that seals what is written to it into `out` as it comes, a frame at a
    time, without holding the whole. `tell` counts the plaintext written, as a reader of the opened
    object sees it; `close` writes the final frame and leaves `out` open for its owner to close."""

    def __init__(self, sealer: Sealer, out: BinaryIO) -> None:
        super().__init__()
        header, key = sealer.message()
        out.write(header)
        self._frames = FrameWriter(key, out)
        self._written = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | memoryview) -> int:  # type: ignore[override]
        self._frames.write(data)
        size = memoryview(data).nbytes
        self._written += size
        return size

    def tell(self) -> int:
        return self._written

    def close(self) -> None:
        if not self.closed:
            self._frames.close()
        super().close()


class Opener:
    """Opens sealed objects; `resolve(tenant, key_id)` gives the keyring that unwraps their data keys.

    Each distinct data key is unwrapped once per Opener (one KMS call for a whole dataset version).
    """

    def __init__(self, resolve: Callable[[str, str], Keyring], sealer: Sealer | None = None) -> None:
        self._resolve = resolve
        self._materials: dict[tuple[str, str], OneDataKey] = {}
        if sealer is not None:  # what `sealer` sealed opens with the data key it made
            self._materials[(sealer.tenant, sealer.key_id)] = sealer._materials
        self._legacy_keys: dict[bytes, bytes] = {}

    def open(self, blob: bytes | memoryview) -> bytes:
        """The plaintext of a sealed object, every frame checked (SGSEAL1 objects too)."""
        if legacy_seal.is_legacy(blob):
            return self._open_legacy(blob)
        return bytes(self.open_buffer(blob))

    def open_buffer(self, blob: bytes | memoryview) -> memoryview:
        """`open`, into a new buffer (no copy to make it `bytes`)."""
        if legacy_seal.is_legacy(blob):
            return memoryview(self._open_legacy(blob))
        view = self.view(blob)
        try:
            return view.read_buffer()
        finally:
            view.close()

    def view(self, blob: bytes | memoryview) -> SealedView | io.BytesIO:
        """A sealed object read at random (`frames.SealedView`): its header and final frame checked
        now, each frame checked as a read reaches it."""
        if legacy_seal.is_legacy(blob):
            return io.BytesIO(self._open_legacy(blob))
        layout = self.layout(blob[:HEADER_BYTES], len(blob))
        return SealedView(layout, layout.open_final(memoryview(blob)[layout.final_at :]), blob)

    def layout(self, head: bytes | memoryview, stored: int) -> Layout:
        """Where the frames of a sealed object lie, from its first bytes (`HEADER_BYTES` of them,
        or all when it is shorter) and its stored size: its header read and checked by the SDK's
        own decryptor (policy, the data key, key commitment, the header's tag)."""
        header = read_header(head)
        if header.format == "SGSEAL1":
            raise SealedDataError("an SGSEAL1 object is opened whole (Opener.open), not by frames")
        materials = self._materials.get((header.tenant, header.key_id))
        if materials is None:
            keyring = self._resolve(header.tenant, header.key_id)
            if keyring.tenant != header.tenant:
                raise KeyUnavailable(keyring.tenant, keyring.key_id, f"the object is sealed for tenant `{header.tenant}`", "A tenant's key opens only that tenant's data.")
            materials = self._materials[(header.tenant, header.key_id)] = OneDataKey(keyring, wrapped_by=header.key_id)
        source = io.BytesIO(bytes(head[:HEADER_BYTES]))
        decryptor = _CLIENT.stream(mode="d", source=source, materials_manager=materials)
        try:
            message = decryptor.header
            if message.encryption_context.get(TENANT) != header.tenant:
                raise SealedDataError(f"sealed object names tenant `{header.tenant}` but its message says otherwise")
            if (message.algorithm, message.content_type, decryptor.verifier) != (SUITE, ContentType.FRAMED_DATA, None):
                raise SealedDataError(f"sealed object of tenant `{header.tenant}` is not framed in {FORMAT}")
            key = MessageKey(SUITE, decryptor._derived_data_key, message.message_id, message.frame_length)
            return Layout.of(key, source.tell(), stored)
        except (AWSEncryptionSDKClientError, FrameError, InvalidTag) as exc:
            raise SealedDataError(f"sealed object of tenant `{header.tenant}` fails its integrity check: it was changed or cut short ({exc})") from None

    def _open_legacy(self, blob: bytes | memoryview) -> bytes:
        old = legacy_seal.read_legacy_header(blob)
        data_key = self._legacy_keys.get(old.wrapped_key)
        if data_key is None:
            data_key = self._legacy_keys[old.wrapped_key] = self._resolve(old.tenant, old.key_id).unwrap(old.wrapped_key)
        try:
            return legacy_seal.open_legacy(blob, old, data_key)
        except legacy_seal.LegacySealError as exc:
            raise SealedDataError(str(exc)) from None


def seal_bytes(data: bytes, keyring: Keyring) -> bytes:
    """One object sealed with a data key of its own."""
    return Sealer(keyring).seal(data)


def open_bytes(blob: bytes, keyring: Keyring) -> bytes:
    """One sealed object opened with `keyring` (which must be the tenant key named in its header)."""
    return Opener(lambda tenant, key_id: keyring).open(blob)
