"""Figure 7: the data registry's cost beside a plain copy (MB/s of the registered folder).

``data_layer.registry.registry.DataRegistry`` on a local storage root in a temporary folder:

* **register** a new version of a folder (hash every file, copy every file into the DVC remote
  ``<root>/registry/dvc-store``, commit and tag the ``.dvc`` file in the registry's git repository),
  against ``shutil.copytree`` of the same folder to a new folder on the same file system: what it
  would cost to keep a second copy without versioning;
* **re-register** the same content under a version that already has it (idempotent: hashing and
  the git look-up, nothing copied), against hashing every file with ``hashlib.md5`` (what DVC
  hashes with) and against the copy;
* **get** a version back into a new folder (download from the DVC remote, check every file
  against its registered md5, rename into place), against the same ``shutil.copytree`` of the
  source folder.

Every repeat registers a **new version** of the folder, and the DVC remote of that registry is
emptied after each repeat, outside the timed region, so each registration really hashes and copies
every file (content-addressed storage would otherwise skip files it already holds); the hook
checks that each registration stored every distinct file. Re-register and get use a second
registry on its own root, where the folder was registered once before timing. Destinations are
fresh temporary folders, made and removed outside the timed region. Everything lands in the OS
page cache (no ``fsync``), for the project and the baselines alike.

The registries are built with ``DataRegistry(root)``, not ``DataRegistry.for_root(root)``, so a
``SINEWGRID_REGISTRY_GIT`` set in the environment can never send benchmark versions to a real
registry; on a local root the two are the same registry.

MB/s = the folder's bytes (10**6) ÷ median seconds, for every column.
"""

from __future__ import annotations

import filecmp
import hashlib
import itertools
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from benchmarks import REPEATS, Timing, time_group
from data_layer.registry.registry import DataRegistry

MB = 1_000_000
BLOB_FILES = 100
BLOB_BYTES = 1_000_000
EPISODES = 200
SEED = 20261130

COLUMNS = ("register", "re_register", "md5_every_file", "get", "copytree")


@dataclass
class RegistryCase:
    name: str
    dataset: str
    folder: Path
    files: int
    bytes: int

    @property
    def mb(self) -> float:
        return self.bytes / MB


@dataclass
class RegistryResult:
    case: RegistryCase
    timings: dict[str, Timing]  # one per COLUMNS entry
    objects_per_registration: int  # distinct files + the folder's manifest, stored by every timed registration
    checks: dict[str, Any]

    def mb_per_s(self, column: str) -> float:
        return self.case.mb / self.timings[column].median

    def ratio(self, column: str, baseline: str = "copytree") -> float:
        """``column``'s median time as a multiple of ``baseline``'s (1.0 = no extra cost)."""
        return self.timings[column].median / self.timings[baseline].median

    def to_dict(self) -> dict[str, Any]:
        functions = {
            "register": f"DataRegistry(root).register({self.case.dataset!r}, <new version>, folder)",
            "re_register": f"DataRegistry(root).register({self.case.dataset!r}, <registered version>, folder)",
            "md5_every_file": "hashlib.md5 of every file of the folder (read in 1 MiB blocks)",
            "get": f"DataRegistry(root).get({self.case.dataset!r}, <registered version>, <new folder>)",
            "copytree": "shutil.copytree(folder, <new folder>)",
        }
        return {
            "case": self.case.name,
            "dataset": self.case.dataset,
            "files": self.case.files,
            "bytes": self.case.bytes,
            "objects_stored_per_registration": self.objects_per_registration,
            "checks": self.checks,
            **{
                column: {"function": functions[column], "mb_per_s": self.mb_per_s(column), **self.timings[column].to_dict()}
                for column in COLUMNS
            },
            "ratio_register_over_copytree": self.ratio("register"),
            "ratio_re_register_over_md5": self.ratio("re_register", "md5_every_file"),
            "ratio_re_register_over_copytree": self.ratio("re_register"),
            "ratio_get_over_copytree": self.ratio("get"),
        }


# The data ---------------------------------------------------------------------------------
def _folder_facts(folder: Path) -> tuple[int, int]:
    files = [p for p in folder.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def _case(name: str, dataset: str, folder: Path) -> RegistryCase:
    files, size = _folder_facts(folder)
    return RegistryCase(name, dataset, folder, files, size)


def omics_case(root: Path) -> RegistryCase:
    """The real training set as the pipeline publishes and registers it: ``<version>/`` with
    ``dataset.zarr`` (AnnData, zarr format 3) and ``manifest.json``."""
    from cell_lane.omics import join_labels, load_reference_expression, publish_dataset

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # anndata/zarr notes on consolidated metadata
        dataset = join_labels(load_reference_expression(), pd.DataFrame())
        zarr_uri, _ = publish_dataset(dataset, str(root / "omics"))
    return _case("omics training set (AnnData zarr)", "cell/omics", Path(zarr_uri).parent)


def blobs_case(root: Path) -> RegistryCase:
    """``BLOB_FILES`` files of ``BLOB_BYTES`` random bytes each (fixed seed): incompressible, all distinct."""
    folder = root / "blobs"
    folder.mkdir()
    rng = np.random.default_rng(SEED)
    for i in range(BLOB_FILES):
        (folder / f"part-{i:03d}.bin").write_bytes(rng.bytes(BLOB_BYTES))
    return _case(f"{BLOB_FILES} × {BLOB_BYTES // MB} MB random bytes", "bench/blobs", folder)


def episodes_case(root: Path) -> RegistryCase:
    """A LeRobot v3 session of ``EPISODES`` cart-pole episodes, as figure 4 writes it."""
    from benchmarks.episode_ingest import FPS, synthetic_episodes
    from robotics_lane.episodes.lerobot_v3 import write_dataset
    from robotics_lane.sim.base import ACTION_NAMES, STATE_NAMES

    folder = root / "session"
    episodes = synthetic_episodes(EPISODES, np.random.default_rng(SEED))
    write_dataset(str(folder), episodes, fps=FPS, robot_type="cartpole", state_names=STATE_NAMES, action_names=ACTION_NAMES)
    return _case(f"LeRobot v3 session, {EPISODES} episodes", "robotics/teleop", folder)


# The measured functions -------------------------------------------------------------------
def md5_every_file(folder: Path) -> dict[str, str]:
    """{relative path: md5} of every file, read in 1 MiB blocks: hashing alone, for comparison."""
    digests = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest = hashlib.md5()
        with open(path, "rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
        digests[path.relative_to(folder).as_posix()] = digest.hexdigest()
    return digests


def _objects(store: Path) -> list[Path]:
    files = store / "files"
    return [p for p in files.rglob("*") if p.is_file()] if files.exists() else []


def _same_tree(a: Path, b: Path) -> bool:
    """True when both folders hold exactly the same relative paths with the same bytes."""
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return files_a == files_b and all(filecmp.cmp(a / rel, b / rel, shallow=False) for rel in files_a)


class _Round:
    """The hooks around each timed call: a fresh destination folder; the fresh registry's remote emptied."""

    def __init__(self, root: Path, fresh_store: Path) -> None:
        self.root = root
        self.fresh_store = fresh_store
        self.current: Path | None = None
        self.stored: list[int] = []  # objects found in the fresh remote after a registration

    def before(self) -> None:
        self.current = Path(tempfile.mkdtemp(dir=self.root, prefix="dest-"))

    def after(self) -> None:
        if self.current is not None:
            shutil.rmtree(self.current, ignore_errors=True)
            self.current = None
        objects = _objects(self.fresh_store)
        if objects:
            self.stored.append(len(objects))
            shutil.rmtree(self.fresh_store / "files")

    def dest(self, name: str) -> str:
        assert self.current is not None
        return str(self.current / name)


def measure(case: RegistryCase, work: Path, repeats: int = REPEATS) -> RegistryResult:
    """Time register / re-register / md5 / get / copytree of ``case.folder`` in alternation."""
    fresh = DataRegistry(str(work / "fresh-root"))
    kept = DataRegistry(str(work / "kept-root"))
    fresh_store = work / "fresh-root" / "registry" / "dvc-store"
    source = str(case.folder)

    # Before timing: the version that re-register and get use, and checks that the registry
    # stores every file and gives back exactly the folder (a fast failure is never measured).
    registered = kept.register(case.dataset, "v1", source, meta={"benchmark": "figure 7"})
    if (registered.files, registered.bytes) != (case.files, case.bytes):
        raise RuntimeError(
            f"'{case.name}': registered {registered.files} files / {registered.bytes} bytes, the folder holds "
            f"{case.files} / {case.bytes}"
        )
    distinct_files = len(set(md5_every_file(case.folder).values()))
    expected_objects = distinct_files + 1  # + the folder's .dir manifest
    kept_objects = len(_objects(work / "kept-root" / "registry" / "dvc-store"))
    if kept_objects != expected_objects:
        raise RuntimeError(f"'{case.name}': the DVC remote holds {kept_objects} objects, expected {expected_objects}")
    check_dest = work / "check-get"
    kept.get(case.dataset, "v1", str(check_dest))
    if not _same_tree(case.folder, check_dest):
        raise RuntimeError(f"'{case.name}': get returned a folder that differs from the registered one")
    shutil.rmtree(check_dest)

    hooks = _Round(work, fresh_store)
    versions = itertools.count(1)
    functions: dict[str, Callable[[], Any]] = {
        "register": lambda: fresh.register(case.dataset, f"run-{next(versions)}", source),
        "re_register": lambda: kept.register(case.dataset, "v1", source),
        "md5_every_file": lambda: md5_every_file(case.folder),
        "get": lambda: kept.get(case.dataset, "v1", hooks.dest("got")),
        "copytree": lambda: shutil.copytree(source, hooks.dest("copy")),
    }
    timings = time_group(list(functions.values()), repeats=repeats, before_each=hooks.before, after_each=hooks.after)
    # warm-up + timed registrations, each must have stored every object itself
    if hooks.stored != [expected_objects] * (repeats + 1):
        raise RuntimeError(
            f"'{case.name}': registrations stored {hooks.stored} objects, expected {expected_objects} each: "
            "some repeat did not copy every file"
        )
    checks = {
        "registered_files_and_bytes_match_folder": True,
        "get_returns_identical_folder": True,
        "every_registration_stored_every_distinct_file": True,
    }
    return RegistryResult(case, dict(zip(functions, timings)), expected_objects, checks)


def run(repeats: int = REPEATS) -> tuple[list[RegistryResult], float]:
    """Every case measured; plus the seconds spent making the data (outside the timings)."""
    root = Path(tempfile.mkdtemp(prefix="sinewgrid-bench-registry-"))
    results = []
    try:
        start = time.perf_counter()
        data = root / "data"
        data.mkdir()
        cases = [omics_case(data), blobs_case(data), episodes_case(data)]
        setup_s = time.perf_counter() - start
        for i, case in enumerate(cases):
            work = root / f"case-{i}"
            work.mkdir()
            results.append(measure(case, work, repeats))
            shutil.rmtree(work, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results, setup_s


def main(repeats: int = REPEATS) -> None:
    """Print the figure as plain lines (``python -m benchmarks.run --only 7`` prints the table)."""
    results, setup_s = run(repeats)
    print(f"data made in {setup_s:.1f} s")
    for r in results:
        cells = ", ".join(f"{c} {r.timings[c].median * 1e3:.1f} ms ({r.mb_per_s(c):.0f} MB/s)" for c in COLUMNS)
        print(f"{r.case.name} [{r.case.files} files, {r.case.mb:.1f} MB]: {cells}")


if __name__ == "__main__":
    main()
