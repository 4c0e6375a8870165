"""`torch.distributed.checkpoint` storage that seals each file with the tenant's key.

DCP writes a gang's checkpoint as one file per rank plus `.metadata`, through fsspec. Under a
tenant's root (its keyring registered in this process, `tenant_access.keyring_for`) each of those
files is sealed as DCP writes it (`envelope.SealingStream`: encrypted a frame at a time as it
streams, never held whole) and opened whole as it is read (the message is checked to its final
frame before any byte is used): DCP then reads its tensors out of the opened bytes by offset as it
would out of the file. A rank's file is in memory twice while it is opened, once while DCP reads
it. Elsewhere (the platform's root, a node's cached copy of a plain checkpoint) the files
are DCP's own, unchanged. On a node's cached copy of a sealed checkpoint the files stay sealed
and open with the key this process holds.

`SealingWriter` and `SealingReader` are `FsspecWriter` and `FsspecReader` with this file system:
the folder stays DCP's format, and `sinewgrid data decrypt --to DEST` turns a sealed one into the
plain folder `dcp_to_torch_save` reads.
"""

from __future__ import annotations

import io
import os
from collections.abc import Generator
from contextlib import contextmanager

from fsspec.implementations.local import LocalFileSystem
from torch.distributed.checkpoint._fsspec_filesystem import FileSystem, FsspecReader, FsspecWriter

from workload_runtime.envelope import Opener, Sealer, SealingStream
from workload_runtime.tenant_access import keyring_for, open_stored, opener


class SealingFileSystem(FileSystem):
    """DCP's fsspec file system, each file sealed with `sealer` as it is written (a reader's has
    none) and checked and opened on read (`tenant_access.open_stored`)."""

    def __init__(self, sealer: Sealer | None) -> None:
        super().__init__()
        self._sealer = sealer
        self._opener: Opener = opener()  # one unwrap of each data key for the whole load

    def _uri(self, path: str | os.PathLike) -> str:
        path = os.fspath(path)
        return path if isinstance(self.fs, LocalFileSystem) else self.fs.unstrip_protocol(path)

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        if "r" in mode:
            with super().create_stream(path, mode) as stream:
                stored = stream.read()
            plain = open_stored(self._uri(path), stored, self._opener)
            del stored  # only the opened bytes stay while DCP reads them
            yield io.BytesIO(plain)
            return
        if self._sealer is None:
            raise PermissionError(f"{path}: this file system only reads (a sealed checkpoint is written by SealingWriter)")
        with super().create_stream(path, mode) as stream:
            sealing = SealingStream(self._sealer, stream)
            yield sealing
            sealing.close()  # DCP closes it itself: the tag is written once
            stream.flush()
            try:
                os.fsync(stream.fileno())  # durable before the manifest names it, as DCP's own writer makes it
            except (AttributeError, io.UnsupportedOperation):
                pass  # an object store's upload is durable once closed


class SealingWriter(FsspecWriter):
    """DCP's fsspec writer, each file sealed when a tenant's key seals `path`'s root (else DCP's own)."""

    def __init__(self, path: str) -> None:
        keyring = keyring_for(path)
        super().__init__(path, sync_files=keyring is None)  # sealed files are synced as they are written (above)
        if keyring is not None:
            self.fs = SealingFileSystem(Sealer(keyring))
            self.path = self.fs.init_path(path)


class SealingReader(FsspecReader):
    """DCP's fsspec reader, each file checked and opened as `storage.read_bytes` does."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.fs = SealingFileSystem(None)
        self.path = self.fs.init_path(path)
