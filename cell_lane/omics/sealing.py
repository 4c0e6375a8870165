"""A tenant's omics dataset sealed object by object: a zarr v3 store wrapper that seals on write and opens on read.

A dataset written under a tenant's storage root (one whose keyring this process holds,
`workload_runtime/tenant_access.py`) is sealed before it leaves the writer: every object zarr
writes — chunks, and metadata too (`zarr.json` holds obs and var, the cell and gene names and
their annotations: assay data as much as the matrix) — goes through `SealedStore.set`, which seals
it with ONE `Sealer` for the whole dataset version (one data key, wrapped once by the tenant's key;
each object its own message, with its own derived key). Reading goes through `SealedStore.get` with one `Opener` per opened
dataset, so the tenant's key is asked once per dataset, not once per chunk.

Partial reads. zarr reads byte ranges inside an object: the index at the end of a shard, then
single chunks out of it. A sealed object is one message (`workload_runtime/envelope.py`) whose
header and frames are checked together, so a range cannot be checked on its own. Two things follow:

- sealed datasets are written **without shards** (`store.py`): one object per chunk (1 MiB of
  values), so the object zarr needs is exactly the chunk it reads, and a row-block read of a lazy
  `X` opens only the chunks it spans, as on a plain dataset;
- for any byte range asked of it anyway (a sealed dataset someone wrote with shards, a codec that
  reads part of a chunk) the wrapper fetches the whole object, opens it and cuts the range from
  the plaintext: always correct, never a torn or unchecked read.

A sealed dataset holds only sealed objects: an unsealed one found in it was not written by the
sealing writer, and reading it is refused (`SealedDataError`), never silently trusted.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import WrapperStore

from workload_runtime.tenant_access import check_seal, resolve
from workload_runtime.envelope import Opener, SealedDataError, Sealer, is_sealed
from workload_runtime.keys import Keyring

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

    def _with_store(self, store: Store) -> SealedStore:
        return type(self)(store, opener=self._opener, sealer=self._sealer, where=self._where)

    def __repr__(self) -> str:
        return f"SealedStore({self._store!r})"

    def __str__(self) -> str:
        return f"sealed-{self._store}"

    # Writing ---------------------------------------------------------------------------------
    def _seal(self, key: str, value: Buffer) -> Buffer:
        if self._sealer is None:
            raise PermissionError(f"{self._where}: opened for reading only; {key} cannot be written (a sealed dataset is written by write_dataset)")
        return type(value).from_bytes(self._sealer.seal(memoryview(value.as_buffer_like())))

    async def set(self, key: str, value: Buffer) -> None:
        await self._store.set(key, self._seal(key, value))

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        await self._store.set_if_not_exists(key, self._seal(key, value))

    async def _set_many(self, values: Iterable[tuple[str, Buffer]]) -> None:
        await self._store._set_many([(key, self._seal(key, value)) for key, value in values])

    # Reading ---------------------------------------------------------------------------------
    def _open(self, key: str, stored: Buffer) -> bytes:
        data = memoryview(stored.as_buffer_like())
        check_seal(f"{self._where}/{key}", data)  # under a tenant's root: sealed for that tenant, or refused
        if not is_sealed(data):
            raise SealedDataError(
                f"{self._where}/{key} is not sealed, but the dataset is: it was not written by the sealing writer "
                "(copied in or replaced by hand). It is not read; write the dataset version again."
            )
        return self._opener.open(data)

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        stored = await self._store.get(key, prototype)  # always the whole object: a range of it cannot be opened
        if stored is None:
            return None
        return prototype.buffer.from_bytes(_cut(self._open(key, stored), byte_range))

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
        # The plaintext's size (what zarr means by it), which only opening the object tells.
        return await Store.getsize(self, key)


def sealing_store(store: Store, keyring: Keyring, where: str = "") -> SealedStore:
    """A store for writing one dataset version: one Sealer (one data key, the tenant's key used once)."""
    sealer = Sealer(keyring)
    # The writer reads back what it has just written (anndata does) with the data key it made,
    # without asking the tenant's key (KMS) again.
    opener = Opener(lambda tenant, key_id: keyring if tenant == keyring.tenant else resolve(tenant, key_id), sealer=sealer)
    return SealedStore(store, sealer=sealer, opener=opener, where=where)


def _cut(data: bytes, byte_range: ByteRequest | None) -> bytes:
    """The part of an opened object that `byte_range` asks for."""
    if byte_range is None:
        return data
    if isinstance(byte_range, RangeByteRequest):
        return data[byte_range.start : byte_range.end]
    if isinstance(byte_range, OffsetByteRequest):
        return data[byte_range.offset :]
    if isinstance(byte_range, SuffixByteRequest):
        return data[len(data) - min(byte_range.suffix, len(data)) :]
    raise TypeError(f"unexpected byte range {byte_range!r}")

