"""Figure 9: what sealing a tenant's weights and data with its key costs (issue 17: at most 10 % slower).

Each write timed sealed against the same write plain, in the same run, in alternation:

* **checkpoint save**: ``CheckpointStore(folder, framework="numpy").save(step, {"model": state})``
  of a ~256 MB float32 state (16 arrays of 4M values, fixed seed) into a local folder: plain where
  no key is registered for the folder; sealed where a ``LocalKeyring`` is registered for it
  (``access.register(folder, LocalKeyring(tenant, keyfile, create=True))``), so ``save`` seals the
  safetensors bytes with the checkpoint's data key before writing them (checked on the first
  write: the stored file must be sealed, ``envelope.is_sealed``).
  Its **load** (``latest_valid()``: read, checked against the manifest, opened) is timed too.
* **gang checkpoint save and load**: ``save_sharded`` / ``load_sharded`` (torch.distributed.checkpoint
  on one process) of the same state as torch tensors, sealed through ``workload_runtime.sealed_dcp``.
* **omics write**: ``cell_lane.omics.write_dataset(adata, path)`` of a figure-2 style generated
  sparse matrix (``omics_write.sparse_expression``, 20,000 cells × 20,000 genes at 5 %: 20M
  non-zeros, 160 MB as CSR; cell and gene names as obs and var), plain (an unregistered folder:
  zarr's own store, shards) against sealed (a registered folder: every object sealed through
  ``cell_lane.omics.sealing.SealedStore``, one data key for the dataset, the same shards).

  Its **read** (``read_dataset(path)``, X in memory) is timed too.
* **reseal** (``benchmarks/reseal.py``): ``sinewgrid tenants reseal``'s work on a tenant root of a
  checkpoint and 1,000 small objects, against the same objects rewritten as they are.

Each repeat writes into fresh folders (made and removed outside the timed region; the sealed and
plain roots are separate folders so only the sealed one has a key). Before timing, both forms are
written once and read back equal (the sealed ones through the readers, which open them). Writes
land in the OS page cache (no ``fsync``), for both.

**Ratio** = sealed median ÷ plain median (1.10 = 10 % slower: the issue's limit).
"""

from __future__ import annotations

import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp
from rich.table import Table

from benchmarks import REPEATS, Timing, time_pair

MB = 1_000_000
SEED = 20261217
CHECKPOINT_ARRAYS, CHECKPOINT_VALUES = 16, 4 << 20  # 16 × 4M float32 = 268 MB
OMICS_CELLS, OMICS_GENES, OMICS_DENSITY = 20_000, 20_000, 0.05
TENANT = "bench-tenant"


@dataclass
class SealingResult:
    name: str
    subject: str  # the function timed
    label: str  # what the row is, said plainly in the table
    bytes: int  # bytes the write handles (the safetensors file; X's CSR arrays)
    sealed: Timing
    plain: Timing
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """Sealed time as a multiple of plain time (1.0 = sealing costs nothing)."""
        return self.sealed.median / self.plain.median

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.name,
            "label": self.label,
            "function": self.subject,
            "bytes": self.bytes,
            "sealed": {"mb_per_s": self.bytes / MB / self.sealed.median, **self.sealed.to_dict()},
            "plain": {"mb_per_s": self.bytes / MB / self.plain.median, **self.plain.to_dict()},
            "ratio_sealed_over_plain": self.ratio,
            **self.facts,
        }


class _Roots:
    """A sealed root (its key registered) and a plain root; fresh subfolders per repeat."""

    def __init__(self, work: Path) -> None:
        from workload_runtime import tenant_access as access
        from workload_runtime.keys import LocalKeyring

        self.sealed_root, self.plain_root = work / "sealed", work / "plain"
        self.sealed_root.mkdir()
        self.plain_root.mkdir()
        keyring = LocalKeyring(TENANT, work / "keys" / f"{TENANT}.key", create=True)
        access.register(str(self.sealed_root), keyring)
        self.current = ""

    def make(self) -> None:
        self.current = f"run-{time.perf_counter_ns()}"

    def clean(self) -> None:
        for root in (self.sealed_root, self.plain_root):
            for child in root.iterdir():
                shutil.rmtree(child, ignore_errors=True)

    def sealed(self, name: str) -> str:
        return str(self.sealed_root / self.current / name)

    def plain(self, name: str) -> str:
        return str(self.plain_root / self.current / name)


def _quiet(fn: Callable[[], Any]) -> Callable[[], Any]:
    def call() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zarr's note on consolidated metadata
            return fn()

    return call


# (a) Checkpoint save ----------------------------------------------------------------------------
def checkpoint_state() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    return {f"layer{i:02d}.weight": rng.standard_normal(CHECKPOINT_VALUES, dtype=np.float32) for i in range(CHECKPOINT_ARRAYS)}


def measure_checkpoint(roots: _Roots, repeats: int) -> list[SealingResult]:
    from workload_runtime.checkpoints import CheckpointStore, to_safetensors
    from workload_runtime.envelope import is_sealed

    state = checkpoint_state()
    size = len(to_safetensors(state))

    # Before timing: does save seal, and do both read back equal?
    roots.make()
    sealed_store, plain_store = CheckpointStore(roots.sealed("ckpt"), framework="numpy"), CheckpointStore(roots.plain("ckpt"), framework="numpy")
    sealed_store.save(1, {"model": state})
    plain_store.save(1, {"model": state})
    stored = next(Path(roots.sealed("ckpt")).rglob("model.safetensors")).read_bytes()
    save_seals = is_sealed(stored)
    if save_seals:
        back = sealed_store.latest_valid()
        if back is None or any(not np.array_equal(back.tensors["model"][k], v) for k, v in state.items()):
            raise RuntimeError("the sealed checkpoint does not read back equal to the state saved")
    if is_sealed(next(Path(roots.plain("ckpt")).rglob("model.safetensors")).read_bytes()):
        raise RuntimeError("the plain checkpoint was sealed: its folder has a key registered")
    loaded = time_pair(sealed_store.latest_valid, plain_store.latest_valid, repeats=repeats)
    roots.clean()

    if not save_seals:
        raise RuntimeError("CheckpointStore.save did not seal under a folder with a key registered")
    subject = 'CheckpointStore(folder, framework="numpy").save(step, {"model": state})'
    label = "checkpoint save, 16 × 4M float32 (CheckpointStore.save)"
    steps = iter(range(2, 1_000_000))

    def sealed() -> None:
        CheckpointStore(roots.sealed("ckpt"), framework="numpy").save(next(steps), {"model": state})

    def plain() -> None:
        CheckpointStore(roots.plain("ckpt"), framework="numpy").save(next(steps), {"model": state})

    sealed_t, plain_t = time_pair(sealed, plain, repeats=repeats, before_each=roots.make, after_each=roots.clean)
    return [
        SealingResult("checkpoint", subject, label, size, sealed_t, plain_t, {"save_seals": save_seals, "safetensors_bytes": size}),
        SealingResult("checkpoint_load", "CheckpointStore(folder).latest_valid()", "checkpoint load, same state (CheckpointStore.latest_valid)", size, *loaded),
    ]


# (c) Gang checkpoint save and load ---------------------------------------------------------------
def measure_sharded(roots: _Roots, repeats: int) -> list[SealingResult]:
    """A gang's checkpoint (`save_sharded` / `load_sharded`, DCP on one process) of the same state
    as (a) as torch tensors: sealed, each DCP file sealed as DCP writes it and read by frames
    (`sealed_dcp.py`)."""
    import torch

    from workload_runtime.checkpoints import CheckpointStore
    from workload_runtime.envelope import is_sealed
    from workload_runtime.sharded import load_sharded, save_sharded

    state = {name: torch.from_numpy(array) for name, array in checkpoint_state().items()}
    size = sum(t.numel() * t.element_size() for t in state.values())
    empty = lambda: {"model": {name: torch.empty_like(t) for name, t in state.items()}}  # noqa: E731

    roots.make()
    stores = {"sealed": CheckpointStore(roots.sealed("gang")), "plain": CheckpointStore(roots.plain("gang"))}
    for kind, store in stores.items():
        _quiet(lambda store=store: save_sharded(store, 1, {"model": state}))()
        files = [p for p in Path(store.step_uri(1), "dcp").rglob("*") if p.is_file()]
        if any(is_sealed(p.read_bytes()) for p in files) != (kind == "sealed"):
            raise RuntimeError(f"the {kind} gang checkpoint is {'not ' if kind == 'sealed' else ''}sealed")
        back = empty()
        load_sharded(store.latest_valid(), back)
        if any(not torch.equal(back["model"][k], v) for k, v in state.items()):
            raise RuntimeError(f"the {kind} gang checkpoint does not load back equal")
    steps = iter(range(2, 1_000_000))
    save = {kind: _quiet(lambda store=store: save_sharded(store, next(steps), {"model": state})) for kind, store in stores.items()}

    def keep_first_step() -> None:  # each save writes 268 MB: only step 1 stays between repeats
        for store in stores.values():
            for step in store.steps()[1:]:
                shutil.rmtree(store.step_uri(step), ignore_errors=True)

    saved = time_pair(save["sealed"], save["plain"], repeats=repeats, after_each=keep_first_step)
    keep_first_step()
    checkpoints = {kind: store.latest_valid() for kind, store in stores.items()}
    load = {kind: _quiet(lambda c=c: load_sharded(c, empty())) for kind, c in checkpoints.items()}
    loaded = time_pair(load["sealed"], load["plain"], repeats=repeats)
    roots.clean()
    return [
        SealingResult("gang_save", "save_sharded(store, step, {\"model\": state})", "gang checkpoint save, same state (DCP, sealed_dcp.py)", size, *saved),
        SealingResult("gang_load", "load_sharded(checkpoint, state)", "gang checkpoint load, same state (DCP, sealed_dcp.py)", size, *loaded),
    ]


# (b) Omics write --------------------------------------------------------------------------------
def omics_adata() -> ad.AnnData:
    from benchmarks.omics_write import sparse_expression

    matrix = sparse_expression(OMICS_CELLS, OMICS_GENES, OMICS_DENSITY, SEED)
    return ad.AnnData(
        X=matrix,
        obs=pd.DataFrame(index=pd.Index([f"cell-{i}" for i in range(OMICS_CELLS)])),
        var=pd.DataFrame(index=pd.Index([f"gene-{j}" for j in range(OMICS_GENES)])),
    )


def _stored(folder: Path) -> dict[str, int]:
    files = [p for p in folder.rglob("*") if p.is_file()]
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def measure_omics(roots: _Roots, repeats: int) -> list[SealingResult]:
    from cell_lane.omics import is_sealed_dataset, read_dataset, write_dataset

    adata = omics_adata()
    matrix: sp.csr_matrix = adata.X
    size = int(matrix.data.nbytes + matrix.indices.nbytes + matrix.indptr.nbytes)

    roots.make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_dataset(adata, roots.sealed("dataset.zarr"))
        write_dataset(adata, roots.plain("dataset.zarr"))
        if not is_sealed_dataset(roots.sealed("dataset.zarr")) or is_sealed_dataset(roots.plain("dataset.zarr")):
            raise RuntimeError("the sealed dataset is not sealed, or the plain one is")
        for uri in (roots.sealed("dataset.zarr"), roots.plain("dataset.zarr")):
            if (read_dataset(uri).X != matrix).nnz:
                raise RuntimeError(f"{uri}: X does not read back equal")
    facts = {"sealed_stored": _stored(Path(roots.sealed("dataset.zarr"))), "plain_stored": _stored(Path(roots.plain("dataset.zarr"))),
             "shape": list(matrix.shape), "nnz": int(matrix.nnz)}
    read = time_pair(_quiet(lambda: read_dataset(roots.sealed("dataset.zarr"))), _quiet(lambda: read_dataset(roots.plain("dataset.zarr"))), repeats=repeats)
    roots.clean()

    sealed_t, plain_t = time_pair(
        _quiet(lambda: write_dataset(adata, roots.sealed("dataset.zarr"))),
        _quiet(lambda: write_dataset(adata, roots.plain("dataset.zarr"))),
        repeats=repeats, before_each=roots.make, after_each=roots.clean,
    )
    label = f"omics write, {OMICS_CELLS:,} × {OMICS_GENES:,} at {OMICS_DENSITY:.0%} (write_dataset; sealed: every object, same shards)"
    return [
        SealingResult("omics", "cell_lane.omics.write_dataset(adata, path)", label, size, sealed_t, plain_t, facts),
        SealingResult("omics_read", "cell_lane.omics.read_dataset(path)", "omics read, same dataset (read_dataset, X in memory)", size, *read),
    ]


def measure_reseal(work: Path, repeats: int) -> SealingResult:
    from benchmarks import reseal

    reseal_t, rewrite_t, size = reseal.measure(work / "reseal", checkpoint_state(), repeats)
    label = (f"reseal a tenant root to a new key: a {CHECKPOINT_ARRAYS * CHECKPOINT_VALUES * 4 / MB:.0f} MB checkpoint + "
             f"{reseal.SMALL_OBJECTS:,} × {reseal.SMALL_BYTES >> 10} KB objects (reseal_tenant; plain: rewritten as they are)")  # fmt: skip
    return SealingResult("reseal", "data_layer.reseal.reseal_tenant(root, keyring, opener)", label, size, reseal_t, rewrite_t,
                         {"objects": reseal.SMALL_OBJECTS + 2, "baseline": "every object read and written back in place, no cryptography"})  # fmt: skip


SAMPLES = 3  # each row takes 3 × the repeats asked: the ratios are of tenths of a second on a noisy 2-core machine


def run(repeats: int = REPEATS) -> list[SealingResult]:
    from workload_runtime import tenant_access as access

    repeats *= SAMPLES
    work = Path(tempfile.mkdtemp(prefix="sinewgrid-bench-sealing-"))
    try:
        roots = _Roots(work)
        return [*measure_checkpoint(roots, repeats), *measure_sharded(roots, repeats), *measure_omics(roots, repeats), measure_reseal(work, repeats)]
    finally:
        access.register(str(work / "sealed"), None)
        shutil.rmtree(work, ignore_errors=True)


def table(results: list[SealingResult], repeats: int) -> Table:
    out = Table(
        title="9. Sealing with the tenant's key: the same write sealed (AWS Encryption SDK messages, AES-256-GCM, one data key) vs plain",
        caption=(
            f"Median of {SAMPLES * repeats} repeats, sealed and plain alternating, one write each into fresh folders "
            "(time.perf_counter); the sealed folder has a local key registered, the plain one none. "
            "MB/s = bytes handled (the safetensors file; X's CSR arrays) ÷ seconds. Ratio = sealed ÷ plain "
            "(issue 17: at most 1.10). Both read back equal before timing."
        ),
        title_justify="left",
        caption_justify="left",
    )
    for column, justify in (("Write", "left"), ("MB", "right"), ("Sealed ms", "right"), ("Sealed MB/s", "right"),
                            ("Plain ms", "right"), ("Plain MB/s", "right"), ("Ratio", "right")):
        out.add_column(column, justify=justify, style="bold" if column == "Ratio" else None)
    for r in results:
        out.add_row(
            r.label, f"{r.bytes / MB:,.0f}", f"{r.sealed.median * 1e3:,.0f}", f"{r.bytes / MB / r.sealed.median:,.0f}",
            f"{r.plain.median * 1e3:,.0f}", f"{r.bytes / MB / r.plain.median:,.0f}", f"{r.ratio:.2f}×",
        )
    return out


def main(repeats: int = REPEATS) -> None:
    from rich.console import Console

    Console(width=160).print(table(run(repeats), repeats))


if __name__ == "__main__":
    main()
