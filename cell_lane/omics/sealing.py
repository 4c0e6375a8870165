"""A tenant's omics dataset sealed object by object: a zarr v3 store wrapper that seals on write and opens on read.

A dataset written under a tenant's storage root (one whose keyring this process holds,
`workload_runtime/tenant_access.py`) is sealed before it leaves the writer: every object zarr
writes — chunks, and metadata too (`zarr.json` holds obs and var, the cell and gene names and
their annotations: assay data as much as the matrix) — goes through `SealedStore.set`, which seals
it with ONE `Sealer` for the whole dataset version (one data key, wrapped once by the tenant's key;
each object its own message, with its own derived key). Reading goes through `SealedStore.get` with one `Opener` per opened
dataset, so the tenant's key is asked once per dataset, not once per chunk.

Partial reads. zarr reads byte ranges inside an object: the index at the end of a shard, then
single chunks out of it. A sealed object is one message (`workload_runtime/envelope.py`) in 1 MiB
frames, each checked by its own tag, so a range is read as its frames (`frames.SealedView`): the
first range asked of an object reads its header (checked by the SDK: the data key, key commitment,
the header's tag) and its final frame (so an object cut short never opens), kept for the object's
later ranges; each range then reads only the stored frames that hold it. Sealed datasets are
therefore written in the same layout as plain ones, with shards, and a row-block read of a lazy
`X` opens only the frames of the chunks it spans. Objects sealed in the retired SGSEAL1 format are
opened whole, and the range cut from them.

A sealed dataset holds only sealed objects: an unsealed one found in it was not written by the
sealing writer, and reading it is refused (`SealedDataError`), never silently trusted.
"""

from __future__ import annotations

import asyncio
import io
import mmap
import os
from collections.abc import AsyncGenerator, Iterable, Iterator
from contextlib import contextmanager

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype
from zarr.storage import LocalStore, WrapperStore

from workload_runtime.envelope import FRAME_BYTES, HEADER_BYTES, Opener, SealedDataError, Sealer, is_sealed
from workload_runtime.frames import Layout, SealedView, new_buffer
from workload_runtime.keys import Keyring
from workload_runtime.legacy_seal import is_legacy
from workload_runtime.tenant_access import check_seal, resolve

ROOT_METADATA = "zarr.json"


class SealedStore(WrapperStore[Store]):
    """`store` with every object sealed by `sealer` on write and opened by `opener` on read.

    A writing store needs both (anndata reads back some of what it writes); a reading one only
    the opener. `where` names the dataset in error messages.
    """

    def __init__(self, store: Store, *, opener: Opener, sealer: Sealer | None = None, where: str = "") -> None:
        super().__init__(store)
        self._opener = opener
        self._sealer = sealer
        self._where = where or str(store)
        self._messages: dict[str, tuple[Layout, bytearray]] = {}  # each object's frame layout and final frame, read once
        self._written: dict[str, bytes] = {}  # the small objects (metadata) this writer wrote: zarr reads them back often

    def _with_store(self, store: Store) -> SealedStore:
        other = type(self)(store, opener=self._opener, sealer=self._sealer, where=self._where)
        other._messages, other._written = self._messages, self._written  # the same objects: what one copy wrote, the other reads
        return other

    def __repr__(self) -> str:
        return f"SealedStore({self._store!r})"

    def __str__(self) -> str:
        return f"sealed-{self._store}"

    # Writing ---------------------------------------------------------------------------------
    async def _seal(self, key: str, value: Buffer, *, surely_written: bool = True) -> Buffer:
        """`value` sealed, on a worker thread when large (zarr's other reads and writes go on
        meanwhile). A small one that is surely written is kept in plain for reading back."""
        if self._sealer is None:
            raise PermissionError(f"{self._where}: opened for reading only; {key} cannot be written (a sealed dataset is written by write_dataset)")
        self._messages.pop(key, None)  # what was read of the object before is not what it now holds
        plain = memoryview(value.as_buffer_like()).cast("B")
        if surely_written and len(plain) <= _KEEP_WRITTEN:
            self._written[key] = plain.tobytes()
        else:
            self._written.pop(key, None)
        if len(plain) <= _KEEP_WRITTEN:  # metadata: sealed here, quicker than a thread's hand-over
            return type(value).from_bytes(self._sealer.seal_buffer(plain))
        return type(value).from_bytes(await asyncio.to_thread(self._sealer.seal_buffer, plain))

    async def set(self, key: str, value: Buffer) -> None:
        await self._store.set(key, await self._seal(key, value))

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        await self._store.set_if_not_exists(key, await self._seal(key, value, surely_written=False))

    async def _set_many(self, values: Iterable[tuple[str, Buffer]]) -> None:
        await self._store._set_many([(key, await self._seal(key, value)) for key, value in values])

    async def delete(self, key: str) -> None:
        self._messages.pop(key, None)
        self._written.pop(key, None)
        await self._store.delete(key)

    # Reading ---------------------------------------------------------------------------------
    def _check(self, key: str, stored: bytes | memoryview) -> None:
        check_seal(f"{self._where}/{key}", stored)  # under a tenant's root: sealed for that tenant, or refused
        if not is_sealed(stored):
            raise SealedDataError(
                f"{self._where}/{key} is not sealed, but the dataset is: it was not written by the sealing writer "
                "(copied in or replaced by hand). It is not read; write the dataset version again."
            )

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        if key in self._written:  # what this writer sealed a moment ago, read back without opening it
            return prototype.buffer.from_bytes(_cut(memoryview(self._written[key]), byte_range))
        if byte_range is not None and (message := await self._message(key, prototype)) is not None:
            return prototype.buffer.from_bytes(await self._read_range(key, prototype, message, byte_range))
        with self._whole(key) as mapped:  # a local file is mapped, not read into memory first
            stored = mapped if mapped is not None else await self._store.get(key, prototype)
            if stored is None:
                return None
            with memoryview(stored if mapped is not None else stored.as_buffer_like()) as data:  # type: ignore[union-attr]
                self._check(key, data)
                view = self._opener.view(data)  # here: the header, and the data key unwrapped once per dataset
                try:
                    return prototype.buffer.from_bytes(_cut(_read_rest(view), byte_range))
                finally:
                    view.close()

    @contextmanager
    def _whole(self, key: str) -> Iterator[mmap.mmap | None]:
        """Object `key` mapped from its file when the store is a local folder (else None: read it)."""
        mapped = None
        if isinstance(self._store, LocalStore):
            try:
                with open(os.path.join(self._store.root, key), "rb") as fh:
                    mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):  # no such file, or an empty one: the store says which
                mapped = None
        try:
            yield mapped
        finally:
            if mapped is not None:
                try:
                    mapped.close()
                except BufferError:  # an error's traceback still holds a view of it: unmapped when that goes
                    pass

    async def _message(self, key: str, prototype: BufferPrototype) -> tuple[Layout, bytearray] | None:
        """Object `key`'s frame layout and checked final frame, read once (its size, header and end,
        asked for at once), or None for an object that is missing or opens only whole (SGSEAL1)."""
        if key not in self._messages:
            try:
                size, head, tail = await asyncio.gather(
                    self._store.getsize(key),
                    self._store.get(key, prototype, RangeByteRequest(0, HEADER_BYTES)),
                    self._store.get(key, prototype, SuffixByteRequest(_FINAL_BYTES)),  # the final frame, when frames are ours
                )
            except FileNotFoundError:
                return None
            if head is None or tail is None:
                return None
            data = memoryview(head.as_buffer_like())[: min(size, HEADER_BYTES)]
            self._check(key, data)
            if is_legacy(data):
                return None
            layout = self._opener.layout(data, size)
            end = memoryview(tail.as_buffer_like())
            if size - layout.final_at > len(end):  # frames longer than ours: read the final frame itself
                tail = await self._store.get(key, prototype, RangeByteRequest(layout.final_at, size))
                end = memoryview(tail.as_buffer_like()) if tail is not None else end
            self._messages[key] = (layout, layout.open_final(end[len(end) - (size - layout.final_at) :]))
        return self._messages[key]

    async def _read_range(self, key: str, prototype: BufferPrototype, message: tuple[Layout, bytearray], byte_range: ByteRequest) -> memoryview:
        """Plaintext bytes `byte_range` of object `key`: only the stored frames that hold them are read."""
        layout, final = message
        start, end = _bounds(byte_range, layout.size)
        begin, stop = layout.stored_span(start, end)
        stored = await self._store.get(key, prototype, RangeByteRequest(begin, stop)) if stop > begin else None
        view = SealedView(layout, final, stored.as_buffer_like() if stored is not None else b"", offset=begin)
        try:
            view.seek(start)
            return _read_rest(view, end - start)
        finally:
            view.close()

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]

    async def _get_many(
        self, requests: Iterable[tuple[str, BufferPrototype, ByteRequest | None]]
    ) -> AsyncGenerator[tuple[str, Buffer | None], None]:
        for key, prototype, byte_range in requests:
            yield key, await self.get(key, prototype, byte_range)

    async def getsize(self, key: str) -> int:
        # The plaintext's size (what zarr means by it), from the object's header and end.
        message = await self._message(key, default_buffer_prototype())
        if message is None:
            return await Store.getsize(self, key)
        return message[0].size


def sealing_store(store: Store, keyring: Keyring, where: str = "") -> SealedStore:
    """A store for writing one dataset version: one Sealer (one data key, the tenant's key used once)."""
    sealer = Sealer(keyring)
    # The writer reads back what it has just written (anndata does) with the data key it made,
    # without asking the tenant's key (KMS) again.
    opener = Opener(lambda tenant, key_id: keyring if tenant == keyring.tenant else resolve(tenant, key_id), sealer=sealer)
    return SealedStore(store, sealer=sealer, opener=opener, where=where)


_FINAL_BYTES = FRAME_BYTES + 64  # a final frame of our frames, whole, with room to spare
_KEEP_WRITTEN = 1 << 16  # metadata, and other objects this small, a writer keeps in plain to read back


def _read_rest(view: SealedView | io.BytesIO, size: int = -1) -> memoryview:
    """`size` bytes (or the rest) of `view` from where it is, into a new buffer (on a worker
    thread: the frames' decryption lets go of the GIL)."""
    if isinstance(view, io.BytesIO):  # an SGSEAL1 object, opened whole
        return view.getbuffer()[view.tell() :]
    out = new_buffer(view.size - view.tell() if size < 0 else size)
    view.readinto(out)
    return out


def _bounds(byte_range: ByteRequest, size: int) -> tuple[int, int]:
    """The plaintext bytes (from, to) that `byte_range` asks for of an object of `size` bytes."""
    if isinstance(byte_range, RangeByteRequest):
        start, end = byte_range.start, byte_range.end
    elif isinstance(byte_range, OffsetByteRequest):
        start, end = byte_range.offset, size
    elif isinstance(byte_range, SuffixByteRequest):
        start, end = size - min(byte_range.suffix, size), size
    else:
        raise TypeError(f"unexpected byte range {byte_range!r}")
    start = min(max(start, 0), size)
    return start, min(max(end, start), size)


def _cut(data: memoryview, byte_range: ByteRequest | None) -> memoryview:
    """The part of an opened object that `byte_range` asks for."""
    if byte_range is None:
        return data
    start, end = _bounds(byte_range, len(data))
    return data[start:end]

