"""Sealed objects' bodies written and read a frame at a time (`workload_runtime/frames.py`).

The bytes are the AWS Encryption SDK's own: the SDK opens what Sinewgrid seals and Sinewgrid
opens what the SDK seals, at every size that ends a frame differently. Reading at random opens
only the frames a read needs, and every way of changing a message an attacker has — a bit
flipped, frames swapped, cut at a frame boundary, bytes added, a frame from another message of the
same data key spliced in — is refused, with no plaintext of the changed frame left behind.
"""

from __future__ import annotations

import io
import struct
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import zarr.storage

from workload_runtime.envelope import _CLIENT, FRAME_BYTES, SUITE, TENANT, Opener, SealedDataError, Sealer, SealingStream
from workload_runtime.frames import Layout
from workload_runtime.keys import LocalKeyring

MIB = FRAME_BYTES
SIZES = [0, 1, MIB - 1, MIB, MIB + 1, 3 * MIB, 5 * MIB + 12_345]


@pytest.fixture(scope="module")
def keyring(tmp_path_factory) -> LocalKeyring:
    return LocalKeyring("lab-a", tmp_path_factory.mktemp("keys") / "lab-a.key", create=True)


@pytest.fixture(scope="module")
def sealer(keyring) -> Sealer:
    return Sealer(keyring)


@pytest.fixture(scope="module")
def opener(keyring) -> Opener:
    return Opener(lambda tenant, key_id: keyring)


def _data(size: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def _sdk_seal(sealer: Sealer, data: bytes) -> bytes:
    encryptor = _CLIENT.stream(mode="e", source=io.BytesIO(data), materials_manager=sealer._materials,
                               encryption_context={TENANT: sealer.tenant}, algorithm=SUITE, frame_length=FRAME_BYTES)  # fmt: skip
    return encryptor.read()


def _sdk_open(sealer: Sealer, blob: bytes) -> bytes:
    with _CLIENT.stream(mode="d", source=io.BytesIO(blob), materials_manager=sealer._materials) as decryptor:
        return decryptor.read()


@pytest.mark.parametrize("size", SIZES)
def test_the_sdk_and_sinewgrid_open_each_others_messages_at_every_frame_boundary(sealer, opener, size):
    data = _data(size, size)
    ours = sealer.seal(data)
    theirs = _sdk_seal(sealer, data)
    assert len(ours) == len(theirs)  # the same layout: frames, final frame, an empty one after whole frames
    assert _sdk_open(sealer, ours) == data
    assert opener.open(theirs) == data
    streamed = io.BytesIO()
    stream = SealingStream(sealer, streamed)
    for at in range(0, size, 300_007):  # writes that end inside frames and across them
        stream.write(data[at : at + 300_007])
    stream.close()
    assert _sdk_open(sealer, streamed.getvalue()) == data
    assert b"".join(sealer.seal_chunks(data)) != ours  # a new message id each time…
    assert _sdk_open(sealer, b"".join(sealer.seal_chunks(data))) == data  # …and the same plaintext


def test_a_read_at_random_opens_only_the_frames_it_spans(sealer, opener, monkeypatch):
    data = _data(7 * MIB + 999, 7)
    blob = sealer.seal(data)
    view = opener.view(blob)
    opened: list[int] = []
    real = view._key.open_into
    monkeypatch.setattr(view._key, "open_into", lambda seq, *a: (opened.append(seq), real(seq, *a))[1])
    view.seek(3 * MIB + 10)
    assert view.read(MIB) == data[3 * MIB + 10 : 4 * MIB + 10]
    assert opened == [4, 5]  # frames 4 and 5 of 8 (the final frame was checked when the view was made)
    out = bytearray(2 * MIB)
    view.seek(5 * MIB)
    assert view.readinto(out) == 2 * MIB and out == data[5 * MIB : 7 * MIB]
    view.seek(7 * MIB + 500)
    assert view.read() == data[7 * MIB + 500 :]  # the final frame, kept


def _frames(blob: bytes, opener: Opener) -> Layout:
    return opener.layout(blob[:65536], len(blob))


def test_every_change_an_attacker_can_make_to_a_message_is_refused(sealer, opener):
    data = _data(4 * MIB + 77, 4)
    blob = sealer.seal(data)
    layout = _frames(blob, opener)
    frame = layout.key.regular_bytes

    def regular(i: int) -> slice:
        return slice(layout.body + i * frame, layout.body + (i + 1) * frame)

    flipped = bytearray(blob)
    flipped[layout.body + 2 * frame + 100] ^= 1  # one bit of frame 3's ciphertext
    swapped = bytearray(blob)  # two whole frames swapped, each with its own sequence number and IV
    swapped[regular(1)], swapped[regular(2)] = blob[regular(2)], blob[regular(1)]
    renumbered = bytearray(blob)  # their ciphertexts swapped under the heads their places give
    one, two = regular(1), regular(2)
    renumbered[one.start + 16 : one.stop], renumbered[two.start + 16 : two.stop] = blob[two.start + 16 : two.stop], blob[one.start + 16 : one.stop]
    cut = blob[: layout.final_at]  # the final frame dropped: whole frames left
    other = sealer.seal(data)  # the same data key, another message
    spliced = bytearray(blob)
    spliced[regular(1)] = other[regular(1)]
    changed = {
        "a bit flipped": bytes(flipped),
        "two frames swapped": bytes(swapped),
        "two frames swapped, renumbered": bytes(renumbered),
        "cut at a frame boundary": cut,
        "cut inside a frame": blob[: layout.final_at - 1000],
        "bytes added": blob + b"\0" * 20,
        "a frame of another message spliced in": bytes(spliced),
        "the header changed": blob[:40] + bytes([blob[40] ^ 1]) + blob[41:],
    }
    for what, tampered in changed.items():
        with pytest.raises(SealedDataError):
            opener.open(tampered)
        if what == "bytes added":
            assert _sdk_open(sealer, tampered) == data  # the SDK stops at the final frame; this reader refuses what follows
            continue
        with pytest.raises(Exception):  # noqa: B017, PT011  # the SDK refuses each as well, in its own words
            _sdk_open(sealer, tampered)


def test_a_frame_that_fails_its_tag_leaves_no_plaintext_in_the_readers_buffer(sealer, opener):
    data = _data(3 * MIB, 3)
    blob = bytearray(sealer.seal(data))
    layout = _frames(bytes(blob), opener)
    blob[layout.body + layout.key.regular_bytes + 5000] ^= 1  # frame 2
    view = opener.view(bytes(blob))
    out = bytearray(b"\xaa" * (3 * MIB))
    with pytest.raises(SealedDataError, match="frame 2 fails its integrity check"):
        view.readinto(out)
    assert data[MIB : 2 * MIB] not in out  # frame 2's bytes are zeroed, never left readable
    view.seek(0)
    assert view.read(MIB) == data[:MIB]  # frame 1 still checks: a change is pinned to its frame


def test_a_message_cut_short_names_what_is_wrong(sealer, opener):
    blob = sealer.seal(_data(2 * MIB + 5, 2))
    layout = _frames(blob, opener)
    assert blob[layout.final_at : layout.final_at + 4] == struct.pack(">I", 0xFFFFFFFF)  # the final frame's mark, where the layout puts it
    with pytest.raises(SealedDataError, match="does not end with its final frame"):
        opener.open(blob[:-3])
    with pytest.raises(SealedDataError, match="not whole frames"):
        opener.open(blob[: layout.body + 30])


def test_a_sealed_shard_read_by_range_reads_only_the_frames_of_its_chunk(tmp_path, keyring):
    """A sealed dataset keeps the plain layout (shards); one chunk read out of a shard reads its
    frames, not the shard."""
    from cell_lane.omics.sealing import sealing_store
    from cell_lane.omics.store import XLayout, _write_local  # noqa: PLC2701  # the writer, without a tenant root to register

    rng = np.random.default_rng(11)
    x = sp.random(8_000, 2_000, density=0.2, format="csr", random_state=rng, dtype=np.float32)
    import anndata as ad

    adata = ad.AnnData(X=x)
    path = tmp_path / "sealed.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _write_local(adata, str(path), XLayout(chunk_values=1 << 16, shard_chunks=64), keyring)
    shard = path / "X" / "data" / "c" / "0"
    assert shard.stat().st_size > 8 * MIB  # one shard of many frames

    read: list[int] = []

    class Counting(zarr.storage.LocalStore):
        async def get(self, key, prototype, byte_range=None):  # type: ignore[override]
            got = await super().get(key, prototype, byte_range)
            if key == "X/data/c/0" and got is not None:
                read.append(len(got.as_buffer_like()))
            return got

    store = sealing_store(Counting(str(path), read_only=True), keyring, where=str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lazy = ad.io.sparse_dataset(zarr.open_group(store, mode="r")["X"])
        read.clear()
        rows = lazy[1_000:1_040].toarray()
    np.testing.assert_array_equal(rows, x[1_000:1_040].toarray())
    # Its header, its final frame (which holds the shard's index) and the frame or two of the rows.
    assert 0 < sum(read) < shard.stat().st_size / 3, read


def _seal_in_child(keyring: LocalKeyring, out) -> None:  # noqa: ANN001
    data = _data(12 * MIB, 12)
    out.put(Opener(lambda tenant, key_id: keyring).open(Sealer(keyring).seal(data)) == data)


def test_a_forked_child_seals_and_opens_on_threads_of_its_own(sealer, opener, keyring):
    """Many frames are sealed and opened on a few threads; a process forked after its parent used
    them (a DataLoader worker, a forkserver child) has none of them and makes its own."""
    import multiprocessing

    data = _data(12 * MIB, 13)
    assert opener.open(sealer.seal(data)) == data  # the parent's threads are started
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_seal_in_child, args=(keyring, out))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0 and out.get(timeout=1) is True
