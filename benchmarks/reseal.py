"""Figure 9, last row: how fast `sinewgrid tenants reseal` moves a tenant's data to a new key.

A tenant root is filled once, sealed under an old local key, with what a lab's root holds most of:
one checkpoint step (``CheckpointStore.save`` of the ~268 MB state of the checkpoint row) and
1,000 objects of 64 KB (``write_bytes_atomic``, as curated tables and zarr chunks are written).
Each repeat copies it to a fresh folder (outside the timed region), then times either

* **reseal**: ``data_layer.reseal.reseal_tenant`` under the new key: every object opened with the
  old key, sealed with the new one, checked (opened again and compared with the plaintext) and written
  in place; the checkpoint step through its pending files and new manifest; or
* **rewrite** (the baseline): every object read and written back in place as it is
  (``write_chunks_atomic``), the same reads and atomic writes with no cryptography.

MB/s = stored bytes moved ÷ seconds.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np

from benchmarks import Timing, time_pair

SMALL_OBJECTS, SMALL_BYTES = 1_000, 64 << 10


def _fill(root: Path, keyring, state: dict[str, np.ndarray]) -> None:  # type: ignore[no-untyped-def]
    from workload_runtime import tenant_access as access
    from workload_runtime.checkpoints import CheckpointStore
    from workload_runtime.storage import write_bytes_atomic

    access.register(str(root), keyring)
    CheckpointStore(str(root / "checkpoints" / "model" / "run-1"), framework="numpy").save(1, {"model": state})
    rng = np.random.default_rng(7)
    for i in range(SMALL_OBJECTS):
        write_bytes_atomic(str(root / "curated" / f"part-{i // 100}" / f"object-{i:04d}"), rng.bytes(SMALL_BYTES))
    access.register(str(root), None)


def _rewrite(root: Path) -> None:
    from workload_runtime.storage import write_chunks_atomic

    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        write_chunks_atomic(str(path), [path.read_bytes()])


def measure(work: Path, state: dict[str, np.ndarray], repeats: int) -> tuple[Timing, Timing, int]:
    """(reseal, rewrite, stored bytes) for the tenant root described above."""
    from data_layer.reseal import reseal_tenant
    from workload_runtime import tenant_access as access
    from workload_runtime.envelope import Opener, read_header
    from workload_runtime.keys import LocalKeyring

    old = LocalKeyring("bench-reseal", work / "keys" / "old.key", create=True)
    new = LocalKeyring("bench-reseal", work / "keys" / "new.key", create=True)
    template, runs = work / "template", work / "runs"
    _fill(template, old, state)
    stored = sum(p.stat().st_size for p in template.rglob("*") if p.is_file())
    keys = {old.key_id: old, new.key_id: new}
    current = {"root": work}

    def fresh() -> None:
        current["root"] = runs / f"run-{time.perf_counter_ns()}"
        shutil.copytree(template, current["root"])
        access.register(str(current["root"]), new)

    def done() -> None:
        access.register(str(current["root"]), None)
        shutil.rmtree(runs, ignore_errors=True)

    # Before timing: a reseal leaves every object under the new key.
    fresh()
    report = reseal_tenant(str(current["root"]), new, Opener(lambda tenant, key_id: keys[key_id]))
    assert report.resealed == SMALL_OBJECTS + 2 and report.steps == 1, report  # the objects, the checkpoint's file and manifest
    assert all(read_header(p.read_bytes()).key_id == new.key_id for p in current["root"].rglob("*") if p.is_file())
    done()

    reseal_t, rewrite_t = time_pair(
        lambda: reseal_tenant(str(current["root"]), new, Opener(lambda tenant, key_id: keys[key_id])),
        lambda: _rewrite(current["root"]),
        repeats=repeats, before_each=fresh, after_each=done,
    )
    return reseal_t, rewrite_t, stored

