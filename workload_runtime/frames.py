"""The body of a sealed object (an ESDK message), sealed and opened a frame at a time without copies.

The AWS Encryption SDK makes and checks every message's **header**: the data key from the
tenant's key, the message's own key (HKDF over its message id), key commitment and the header's
authentication tag (`envelope.py` asks the SDK's own encryptor and decryptor for them). The
**body** follows the SDK's documented layout ("Message format reference", Body: framed data), and
this module writes and reads it with AES-GCM from `cryptography` (the library the SDK itself
calls), using the SDK's own helpers for each frame's IV and associated data:

    regular frame   sequence number (4) | IV (12) | ciphertext (frame length) | tag (16)
    final frame     0xFFFFFFFF (4) | sequence number (4) | IV (12) | length (4) | ciphertext | tag (16)

Why not the SDK's own frame loop: in Python it copies each frame four or five times (a 268 MB
checkpoint opened in 2.3× the time of a plain read, figure 9). Here a frame is encrypted or opened
straight out of the caller's buffer, and a `SealedView` opens only the frames a read needs,
straight into the reader's memory. The bytes are the SDK's: the SDK opens what this writes, and
this opens what the SDK writes (`tests/test_frames.py`), so an auditor's ESDK reads every object.

Reading is stricter than the SDK: a message's layout follows from its size, so each frame must sit
where its sequence number puts it, carry the IV that number gives (never one read from the
message), and nothing may follow the final frame. The final frame is checked when a view is made,
so a message cut short at a frame boundary never opens, and every frame is checked by its own tag
before any of its bytes reach the reader.
"""

from __future__ import annotations

import io
import os
import struct
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np
from aws_encryption_sdk.identifiers import Algorithm, ContentType
from aws_encryption_sdk.internal.crypto.iv import frame_iv
from aws_encryption_sdk.internal.defaults import MAX_FRAME_COUNT
from aws_encryption_sdk.internal.formatting.encryption_context import assemble_content_aad
from aws_encryption_sdk.internal.utils import get_aad_content_string
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

FINAL_MARK = 0xFFFFFFFF
TAG = 16
_REGULAR = get_aad_content_string(ContentType.FRAMED_DATA, is_final_frame=False)
_FINAL = get_aad_content_string(ContentType.FRAMED_DATA, is_final_frame=True)
_SEQ = struct.Struct(">I")
_AAD_TAIL = struct.Struct(">IQ")  # a frame's sequence number and content length, after the message id and content string
_FINAL_HEAD = struct.Struct(">II12sI")  # mark, sequence number, IV, length


class SealedDataError(ValueError):
    """Bytes that claim to be sealed and are not whole, or fail their integrity check."""


class FrameError(SealedDataError):
    """A message body that is not whole, not in its place, or fails a frame's tag."""


class MessageKey:
    """One message's key and id: what seals or opens each frame of its body."""

    def __init__(self, algorithm: Algorithm, derived_key: bytes, message_id: bytes, frame_length: int) -> None:
        self._aes, self._algorithm = AESGCM(derived_key), algorithm
        self.message_id, self.frame_length = message_id, frame_length
        self.regular_bytes = 4 + algorithm.iv_len + frame_length + TAG  # one regular frame, stored
        # The SDK's frame IV and body AAD (`frame_iv`, `assemble_content_aad`), made without their
        # per-call checks and format strings: the first frame's are checked against the SDK's here.
        self._iv_pad = bytes(algorithm.iv_len - 4)
        self._aad_of = {final: message_id + (_FINAL if final else _REGULAR).value for final in (False, True)}
        if (self.iv(1), self._aad(1, 5, True)) != (frame_iv(algorithm, 1), assemble_content_aad(message_id, _FINAL, 1, 5)):
            raise FrameError("this SDK's frame IV or body AAD is not the one this module writes")

    def iv(self, sequence: int) -> bytes:
        if not 1 <= sequence <= MAX_FRAME_COUNT:
            raise FrameError(f"a message holds frames 1 to {MAX_FRAME_COUNT}; not {sequence}")
        return self._iv_pad + _SEQ.pack(sequence)

    def _aad(self, sequence: int, size: int, final: bool) -> bytes:
        return self._aad_of[final] + _AAD_TAIL.pack(sequence, size)

    def body_bytes(self, size: int) -> int:
        """The stored size of the body of a message of `size` plaintext bytes."""
        whole, rest = divmod(size, self.frame_length)
        return whole * self.regular_bytes + _FINAL_HEAD.size + rest + TAG

    def seal_into(self, sequence: int, plain: memoryview, final: bool, into: memoryview) -> None:
        """One frame written into `into` (exactly its stored size): its head (sequence number, IV,
        and a final frame's mark and length), then its ciphertext and tag."""
        iv = self.iv(sequence)
        head = _FINAL_HEAD.pack(FINAL_MARK, sequence, iv, len(plain)) if final else _SEQ.pack(sequence) + iv
        into[: len(head)] = head
        self._aes.encrypt_into(iv, plain, self._aad(sequence, len(plain), final), into[len(head) :])

    def open_into(self, sequence: int, sealed: memoryview, final: bool, into: memoryview) -> None:
        """One frame's ciphertext and tag opened into `into` (exactly its plaintext's size). The tag
        is checked before this returns; when it fails, `into` is left zeroed."""
        try:
            self._aes.decrypt_into(self.iv(sequence), sealed, self._aad(sequence, len(sealed) - TAG, final), into)
        except InvalidTag:
            raise FrameError(f"frame {sequence} fails its integrity check (its GCM tag): the object was changed") from None


def seal_body(key: MessageKey, data: memoryview, into: memoryview, first: int = 1) -> None:
    """The body of a message of `data` written into `into` (`key.body_bytes(len(data))` long):
    regular frames while a whole one is left, then the final frame with the rest (empty when `data`
    is whole frames, as the SDK writes it). Many frames are sealed on a few threads."""
    whole = len(data) // key.frame_length
    seal_frames(key, data, into, first, whole)
    rest, at = data[whole * key.frame_length :], whole * key.regular_bytes
    key.seal_into(first + whole, rest, True, into[at:])


def final_frame(key: MessageKey, sequence: int, rest: memoryview) -> bytearray:
    """The final frame, holding `rest` (less than a frame, maybe nothing)."""
    final = bytearray(key.body_bytes(len(rest)))
    key.seal_into(sequence, rest, True, memoryview(final))
    return final


def seal_frames(key: MessageKey, data: memoryview, into: memoryview, first: int, count: int) -> None:
    """Regular frames `first`… (`count` of them) of `data`'s first bytes, written into `into`."""
    length, stored = key.frame_length, key.regular_bytes

    def seal_some(part: range) -> None:
        for k in part:
            key.seal_into(first + k, data[k * length : (k + 1) * length], False, into[k * stored : (k + 1) * stored])

    _on_threads(seal_some, count)


class FrameWriter:
    """The body of a message written as its plaintext comes: the whole frames of each write sealed
    straight out of it, the rest held until the next (less than a frame held)."""

    def __init__(self, key: MessageKey, out: io.RawIOBase | io.BufferedIOBase | object) -> None:
        self._key, self._out = key, out
        self._held = bytearray()
        self._sequence = 1
        self._sealed = new_buffer(0)  # reused from write to write

    def write(self, data: bytes | memoryview) -> None:
        view, length = memoryview(data).cast("B"), self._key.frame_length
        if self._held:
            take = min(length - len(self._held), len(view))
            self._held += view[:take]
            view = view[take:]
            if len(self._held) < length:
                return
            self._frames(memoryview(self._held), 1)
            self._held = bytearray()
        whole = len(view) // length
        if whole:
            self._frames(view, whole)
        self._held += view[whole * length :]

    def close(self) -> None:
        """The final frame, with the held rest (less than a frame; nothing after whole frames, as
        the SDK writes it)."""
        self._out.write(final_frame(self._key, self._sequence, memoryview(self._held)))  # type: ignore[attr-defined]

    def _frames(self, plain: memoryview, count: int) -> None:
        size = count * self._key.regular_bytes
        if len(self._sealed) < size:
            self._sealed = new_buffer(size)
        sealed = self._sealed[:size]
        seal_frames(self._key, plain, sealed, self._sequence, count)
        self._out.write(sealed)  # type: ignore[attr-defined]
        self._sequence += count


@dataclass(frozen=True)
class Layout:
    """Where each frame of a message's body lies, which follows from the message's stored size."""

    key: MessageKey
    body: int  # where the body starts in the stored message
    frames: int  # regular frames; the final frame is frame `frames` (from 0)
    size: int  # plaintext bytes

    @classmethod
    def of(cls, key: MessageKey, body: int, stored: int) -> Layout:
        room = stored - body - _FINAL_HEAD.size - TAG
        frames, rest = divmod(room, key.regular_bytes) if room >= 0 else (0, -1)
        if not 0 <= rest <= key.frame_length:
            raise FrameError(f"the message fails its integrity check: a body of {stored - body} bytes is not whole frames of {key.frame_length} bytes and a final frame (cut short, or bytes added)")
        return cls(key, body, frames, frames * key.frame_length + rest)

    @property
    def final_at(self) -> int:
        return self.body + self.frames * self.key.regular_bytes

    def stored_span(self, start: int, end: int) -> tuple[int, int]:
        """The stored bytes (from, to) that hold the regular frames of plaintext bytes `start`…`end`
        (`end` excluded); empty when only the final frame holds them."""
        first, last = start // self.key.frame_length, min((end - 1) // self.key.frame_length, self.frames - 1)
        if end <= start or first > last:
            return 0, 0
        return self.body + first * self.key.regular_bytes, self.body + (last + 1) * self.key.regular_bytes

    def open_final(self, stored: memoryview) -> bytearray:
        """The final frame's plaintext, out of its stored bytes (from its mark to the end)."""
        rest = self.size - self.frames * self.key.frame_length
        mark, sequence, iv, length = _FINAL_HEAD.unpack_from(stored)
        if (mark, sequence, iv, length, len(stored)) != (FINAL_MARK, self.frames + 1, self.key.iv(self.frames + 1), rest, _FINAL_HEAD.size + rest + TAG):
            raise FrameError("the message fails its integrity check: it does not end with its final frame in its place (cut short, reordered or bytes added)")
        final = bytearray(rest)
        self.key.open_into(self.frames + 1, stored[_FINAL_HEAD.size :], True, memoryview(final))
        return final


class SealedView(io.RawIOBase):
    """The plaintext of one message, read at random without opening the whole.

    `stored` holds the message's stored bytes from `offset` on (all of them, or the span a read
    needs: `Layout.stored_span`), and `final` is its final frame's plaintext, already checked. A
    read opens the frames it spans, each checked by its tag, whole ones straight into the reader's
    buffer; a frame read in part is kept for the read of its rest.
    """

    def __init__(self, layout: Layout, final: bytearray, stored: bytes | memoryview, offset: int = 0) -> None:
        super().__init__()
        self._layout, self._key, self._final = layout, layout.key, final
        self._whole = memoryview(stored)
        self._stored, self._offset = self._whole.cast("B"), offset
        self.size = layout.size
        self._parts: OrderedDict[int, bytearray] = OrderedDict()  # the last regular frames read in part, by index
        self._at = 0

    @classmethod
    def whole(cls, key: MessageKey, stored: bytes | memoryview, body: int) -> SealedView:
        """A view of a whole stored message whose body starts at `body`: its final frame checked now."""
        view = memoryview(stored).cast("B")
        layout = Layout.of(key, body, len(view))
        return cls(layout, layout.open_final(view[layout.final_at :]), view)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        """Lets go of the stored bytes (an mmap can then be closed)."""
        if not self.closed:
            self._stored.release()
            self._whole.release()
            self._parts.clear()  # no plaintext outlives the view
        super().close()

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._at = max(0, {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self.size}[whence] + offset)
        return self._at

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        """Reads at the current place into `buffer`. If a frame fails its tag this raises, and
        `buffer` holds nothing to use."""
        out = memoryview(buffer).cast("B")
        want = max(0, min(len(out), self.size - self._at))
        done, length = 0, self._key.frame_length
        while done < want:
            index, inside = divmod(self._at + done, length)
            whole = 0 if inside else min(self._layout.frames - index, (want - done) // length)
            if whole > 0:  # whole regular frames: opened straight into the buffer
                self._open_frames(index, whole, out[done : done + whole * length])
                done += whole * length
                continue
            plain = self._frame(index)
            take = min(len(plain) - inside, want - done)
            out[done : done + take] = plain[inside : inside + take]
            done += take
        self._at += done
        return done

    def read_buffer(self) -> memoryview:
        """The rest of the plaintext in one new buffer, every frame checked."""
        out = new_buffer(max(0, self.size - self._at))
        self.readinto(out)
        return out

    def readall(self) -> bytes:
        return bytes(self.read_buffer())

    def _frame(self, index: int) -> memoryview:
        """The plaintext of frame `index` (from 0), checked by its tag."""
        if index == self._layout.frames:
            return memoryview(self._final)
        part = self._parts.get(index)
        if part is None:  # opened into the buffer of the frame read longest ago (a reader of a zip or a
            # shard reads its end, its start, then its middle: three kept, none is opened twice)
            part = self._parts.popitem(last=False)[1] if len(self._parts) >= _KEPT_FRAMES else bytearray(self._key.frame_length)
            self._key.open_into(index + 1, self._sealed(index), False, memoryview(part))
            self._parts[index] = part
        self._parts.move_to_end(index)
        return memoryview(part)

    def _sealed(self, index: int) -> memoryview:
        """Regular frame `index`'s ciphertext and tag, once its sequence number and IV are the ones
        its place gives."""
        at = self._layout.body + index * self._key.regular_bytes - self._offset
        if at < 0 or at + self._key.regular_bytes > len(self._stored):
            raise FrameError(f"frame {index + 1} is not in the stored bytes read")
        head = _SEQ.pack(index + 1) + self._key.iv(index + 1)
        if self._stored[at : at + len(head)] != head:
            raise FrameError(f"frame {index + 1} fails its integrity check: its sequence number or IV is not the one its place gives (the object was changed)")
        return self._stored[at + len(head) : at + self._key.regular_bytes]

    def _open_frames(self, first: int, count: int, into: memoryview) -> None:
        """Regular frames `first`… (`count` of them, from 0) opened into `into`."""
        length = self._key.frame_length

        def open_some(part: range) -> None:
            for k in part:
                self._key.open_into(first + k + 1, self._sealed(first + k), False, into[k * length : (k + 1) * length])

        _on_threads(open_some, count)


def new_buffer(size: int) -> memoryview:
    """`size` writable bytes, not zeroed first (each is written once, by the cipher, which can then
    fault the fresh pages in on several threads)."""
    return memoryview(np.empty(size, dtype=np.uint8)).cast("B")


_KEPT_FRAMES = 3
_WORKERS = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
_POOL: tuple[int, ThreadPoolExecutor] | None = None


def _on_threads(work: Callable[[range], None], count: int) -> None:
    """`work` over frames 0…count-1: in a few contiguous parts on this process's threads when there
    are enough frames to share (`cryptography` lets go of the GIL while it encrypts and decrypts),
    else here. The first error is raised once every part has stopped."""
    if _WORKERS < 2 or count < 2 * _WORKERS:
        work(range(count))
        return
    step = -(-count // _WORKERS)
    futures = [_pool().submit(work, range(at, min(at + step, count))) for at in range(0, count, step)]
    wait(futures)
    for future in futures:
        future.result()


def _pool() -> ThreadPoolExecutor:
    """This process's sealing threads (made again in a forked child, which has none)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="sealed-frames"))
    return _POOL[1]
