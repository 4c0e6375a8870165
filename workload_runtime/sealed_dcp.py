"""`torch.distributed.checkpoint` storage that seals each file with the tenant's key.

DCP writes a gang's checkpoint as one file per rank plus `.metadata`, through fsspec. Under a
tenant's root (its keyring registered in this process, `tenant_access.keyring_for`) each of those
files is sealed as DCP writes it (`envelope.SealingStream`: the whole frames of each write sealed
straight out of it, never the whole file held) and read by frames (`frames.SealedView`): when DCP
opens a file its header and final frame are checked, and each tensor DCP reads opens only the
frames that hold it, each checked by its tag, straight into DCP's buffer. A local file is mapped,
not read into memory; an object store's is fetched whole. Elsewhere (the platform's root, a
node's cached copy of a plain checkpoint) the files are DCP's own, read by parts. On a node's
cached copy of a sealed checkpoint the files stay sealed and open with the key this process holds.

`SealingWriter` and `SealingReader` are `FsspecWriter` and `FsspecReader` with this file system:
the folder stays DCP's format, and `sinewgrid data decrypt --to DEST` turns a sealed one into the
plain folder `dcp_to_torch_save` reads.
"""

from __future__ import annotations

import io
import mmap
import os
from collections.abc import Generator
from contextlib import contextmanager

from fsspec.implementations.local import LocalFileSystem
from torch.distributed.checkpoint._fsspec_filesystem import FileSystem, FsspecReader, FsspecWriter

from workload_runtime.envelope import HEADER_BYTES, Opener, Sealer, SealingStream, is_sealed
from workload_runtime.tenant_access import check_seal, keyring_for, opener


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
                head = stream.read(HEADER_BYTES)
                stream.seek(0)
                check_seal(self._uri(path), head)  # under a tenant's root: sealed for it, or refused
                if not is_sealed(head):
                    yield stream  # DCP's own file, read by parts
                    return
                with _stored(stream) as stored:
                    view = self._opener.view(stored)
                    try:
                        yield view
                    finally:
                        view.close()  # lets go of the mapped file
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


@contextmanager
def _stored(stream: io.IOBase) -> Generator[bytes | mmap.mmap, None, None]:
    """A file's stored bytes: mapped when it is a local file (no copy of a rank's whole file),
    else read whole (an object store's)."""
    try:
        mapped = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)
    except (AttributeError, io.UnsupportedOperation, OSError, ValueError):  # not a local file, or empty
        yield stream.read()
        return
    try:
        yield mapped
    finally:
        try:
            mapped.close()
        except BufferError:  # an error's traceback still holds a view of it: unmapped when that goes
            pass


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
