"""Shared fixtures: every test gets its own storage root and Dagster instance."""

from __future__ import annotations

import os

# One thread per numeric library in every process the suite starts (the workers, the demo, the
# workloads, LeRobot's checker inherit it). Dozens of processes share two cores here, and an idle
# OpenMP or OpenBLAS thread spins while it waits for work: measured on LeRobot's check of the
# demo's datasets beside three busy processes, 90 CPU-s with the libraries' defaults, 35 with one.
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import logging
import re
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from shared_resources.resources import platform_resources
from workload_runtime.storage import Storage

warnings.filterwarnings("ignore", category=UserWarning, module="zarr")

# tests/rehearsal/ drives the production shape `make rehearsal` starts (rehearsal/stack.py): it is
# that target's, collected only when it asks (SINEWGRID_REHEARSAL=1), never by `make test`.
collect_ignore = [] if os.environ.get("SINEWGRID_REHEARSAL") == "1" else ["rehearsal"]

# Session-wide engines and the demo instance, one module each.
pytest_plugins = ["tests.fixtures.demo", "tests.fixtures.engines", "tests.fixtures.gang", "tests.fixtures.postgres"]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "sinewgrid-home"
    root.mkdir()
    monkeypatch.setenv("SINEWGRID_HOME", str(root))
    # The data registry's caches (an object-store root's git mirror, DVC's site cache) per test.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("DVC_SITE_CACHE_DIR", str(tmp_path / "cache" / "dvc"))
    # Local pools' slot locks are machine-wide by default: per test, so no other test (or
    # another run of the suite on this machine) holds this test's slots.
    monkeypatch.setenv("SINEWGRID_SLOTS_DIR", str(tmp_path / "slots"))
    monkeypatch.setenv("DAGSTER_HOME", str(root / "dagster"))
    (root / "dagster").mkdir()
    # Tenants' local key files (made on first use) per test, never in ~/.config.
    monkeypatch.setenv("SINEWGRID_KEYS_DIR", str(tmp_path / "keys"))
    return root


S3_BUCKET = "sinewgrid-test"
ROOT_KINDS = ("local", "s3")


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3 API server (moto) on loopback for the whole session; its endpoint URL."""
    from testbed.s3_server import s3_server

    with s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3_root(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh `s3://sinewgrid-test/<test-name>` root on the loopback S3 server.

    The AWS settings are in the environment (so subprocesses inherit them), s3fs's cached
    clients are dropped, and the ledger goes to a local SQLite file named by
    SINEWGRID_LEDGER_URL: an object store cannot hold a database file.
    """
    import s3fs

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("SINEWGRID_LEDGER_URL", f"sqlite:///{tmp_path / 'ledger.db'}")
    # The node cache of this test's "node" (workload_runtime/node_cache.py): no test finds another's files.
    monkeypatch.setenv("SINEWGRID_NODE_CACHE_DIR", str(tmp_path / "node-cache"))
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    if not fs.exists(S3_BUCKET):
        fs.mkdir(S3_BUCKET)
    # Glob characters in a key ("[s3]") would turn every listing under the root into a pattern.
    prefix = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-")
    if fs.exists(f"{S3_BUCKET}/{prefix}"):
        fs.rm(f"{S3_BUCKET}/{prefix}", recursive=True)
    return f"s3://{S3_BUCKET}/{prefix}"


@pytest.fixture
def root(request: pytest.FixtureRequest, home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The storage root URI: the local `home` folder, or a fresh `s3://` root.

    Local unless a test asks otherwise with
    `@pytest.mark.parametrize("root", ROOT_KINDS, indirect=True)`. DAGSTER_HOME stays the
    local `home/dagster` folder either way (the Dagster instance is SQLite on local disk).
    """
    kind = getattr(request, "param", "local")
    if kind == "local":
        yield str(home)
        return
    if kind != "s3":
        raise ValueError(f"unknown storage root kind {kind!r}; expected one of {ROOT_KINDS}")
    uri = request.getfixturevalue("s3_root")
    monkeypatch.setenv("SINEWGRID_HOME", uri)
    yield uri
    # Everything under the root went to the object store: locally only the Dagster instance.
    strays = sorted(p.name for p in home.iterdir() if p.name != "dagster")
    assert not strays, f"an s3:// root left {strays} in the local folder {home}"
    assert not Path("s3:").exists(), f"an s3:// URI went through Path() and was written under {Path.cwd() / 's3:'}"


@pytest.fixture
def storage(root: str) -> Storage:
    return Storage.at(root)


@pytest.fixture
def resources(root: str) -> dict:
    return platform_resources(root=root, pools_file="")


# A step's stdout and stderr are not captured in the tests' own instances: capturing starts a
# `tail -F` and a watcher process per stream and step (hundreds in a run), and no test reads them.
# The demo's instance and the production instance (tests/test_production_instance.py) do capture.
NO_COMPUTE_LOGS = {"compute_logs": {"module": "dagster._core.storage.noop_compute_log_manager", "class": "NoOpComputeLogManager"}}


@pytest.fixture(scope="session")
def empty_instance(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of an empty Dagster instance (its SQLite databases made), made once per worker."""
    folder = tmp_path_factory.mktemp("empty-dagster-instance")
    with dg.instance_for_test(temp_dir=str(folder), overrides=NO_COMPUTE_LOGS):
        pass
    return folder


@pytest.fixture
def instance(home: Path, empty_instance: Path):
    """A new Dagster instance in `home/dagster`: a copy of an empty one, which Dagster opens as it
    is (making its databases and their schema costs 0.24 CPU-s, copying them 0.05)."""
    shutil.copytree(empty_instance, home / "dagster", dirs_exist_ok=True)
    with dg.instance_for_test(temp_dir=str(home / "dagster"), overrides=NO_COMPUTE_LOGS) as inst:
        yield inst


@pytest.fixture(scope="session")
def reference_expression():
    from cell_lane.omics import load_reference_expression

    return load_reference_expression()


def pytest_configure(config):
    os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "1")


def pytest_collection_finish(session):
    """Freeze what importing the test modules made (Dagster, torch, both lanes' definitions:
    half a million objects) into the collector's permanent generation: see `_collect_garbage`."""
    _collect_garbage(module="", whole_heap=True)


# A collection of the whole heap walks every object a worker holds, two million once a few
# modules have run (up to a second each): done once this many more objects were frozen since the last.
WHOLE_HEAP_AFTER = 500_000
_collected = {"module": "", "frozen_since": 0}


def _collect_garbage(module: str, whole_heap: bool = False) -> None:
    """Collect garbage before a test, then freeze what survives, so the next collection walks only
    what was made since: a worker's heap grows to millions of objects (torch, MuJoCo, the lanes'
    runs), and walking all of them before every test cost about 0.6 s a test.

    What a module's fixtures held and let go of is frozen by then; a collection of the whole heap
    (unfreeze first) frees it, at the start of a module once `WHOLE_HEAP_AFTER` objects were
    frozen since the last one, not at every module's start (docs/testing.md has the figures):
    the garbage it would free waits, at most that many objects (under 100 MB)."""
    import gc

    whole_heap = whole_heap or (module != _collected["module"] and _collected["frozen_since"] > WHOLE_HEAP_AFTER)
    if whole_heap:
        gc.unfreeze()
    gc.collect()
    survivors = 0 if whole_heap else len(gc.get_objects(generation=2))  # what is about to be frozen
    gc.freeze()
    _collected.update(module=module, frozen_since=0 if whole_heap else _collected["frozen_since"] + survivors)


# A test that uses one of these fixtures is in that tier (pyproject.toml registers the markers).
TIER_OF_FIXTURE = {
    "slurm_cluster": "engines",
    "ray_head": "engines",
    "postgres": "engines",
    "s3_endpoint": "engines",
    "demo_run": "e2e",
}


# A wrapper: the marks are added before pytest-xdist's own hook of the same name reads the
# `xdist_group` marks, and what it made of them is checked after.
@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """Mark each test with the tiers of the fixtures it uses, so `-m "not engines"` and
    `make test-fast` select by what a test really starts, not by what its module is called;
    and with the worker group that keeps each expensive session fixture on one worker."""
    for item in items:
        tiers = {TIER_OF_FIXTURE[f] for f in getattr(item, "fixturenames", ()) if f in TIER_OF_FIXTURE}
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("root") == "s3":  # `root` asks for the S3 server itself
            tiers.add("engines")
        for tier in sorted(tiers):
            item.add_marker(tier)
        item.add_marker(pytest.mark.xdist_group(_worker_group(item)))
    _longest_groups_first(items)
    yield
    if getattr(config.option, "loadgroup", False) and items and "@" not in items[0].nodeid:
        # pytest-xdist 3.8 names the group in the test's id, which pytest 9.2 no longer reads
        # (pytest-dev/pytest-xdist#1386): the groups would be ignored without a word, and each
        # worker would start its own Slurm cluster, Ray head and demo.
        raise pytest.UsageError(
            f"pytest-xdist ignores the worker groups with pytest {pytest.__version__} (pytest-dev/pytest-xdist#1386); "
            "install the pytest that pyproject.toml pins (`make venv`), or run without `-n`."
        )


# Tests that share an expensive session fixture run on one worker (`make test` runs the
# suite on three, pytest-xdist's `--dist loadgroup`), so each starts once; every other module
# stays whole on one worker, so its module-scoped fixtures run once too.
SHARED_ON_ONE_WORKER = {"slurm_cluster": "engines", "ray_head": "engines"}
# The demo runs once per session beside the workers (tests/fixtures/demo.py): a test reading it is
# the last of its group, so its worker does the group's other tests while the demo runs.
LAST_IN_GROUP = {"demo_run"}

# Module fixtures that take long before a module's first test: an engine its worker starts for
# itself (PostgreSQL, the S3 server), or a run in another runtime (Isaac Lab: a cold start costs
# 12-45 s; LeRobot's reader). A module using one starts with the end-to-end ones, not at the end.
LONG_SETUP_FIXTURES = {"postgres", "s3_endpoint", "isaaclab_report", "isaaclab_runs", "made_here"}


def _longest_groups_first(items) -> None:
    """Order the groups so the long ones start first: the group sharing the engines, then the
    modules that run workloads end to end or start an engine or another runtime
    (`LONG_SETUP_FIXTURES`), then the modules reading the demo (which runs beside the workers from
    the session's start), then the rest; groups in the order their first test is collected, each
    group's tests kept together. pytest-xdist hands groups to workers in this order (`make test` passes `--no-loadscope-reorder`; by
    default it would order them by their number of tests), so the short ones fill in at the end
    instead of a long one running alone; without xdist (`-n 0`) each group's module fixtures
    then run once too."""
    rank: dict[str, int] = {}
    first: dict[str, int] = {}
    reads_demo = {item.nodeid for item in items if LAST_IN_GROUP & set(getattr(item, "fixturenames", ()))}
    for index, item in enumerate(items):
        group = _worker_group(item)
        long_setup = item.get_closest_marker("e2e") or LONG_SETUP_FIXTURES & set(getattr(item, "fixturenames", ()))
        here = 0 if group in SHARED_ON_ONE_WORKER.values() else 1 if long_setup else 3
        rank[group] = min(rank.get(group, here), here)
        first.setdefault(group, index)
    for item in items:
        if item.nodeid in reads_demo:
            rank[_worker_group(item)] = 2  # reached once the long groups are under way, when the demo is (nearly) done
    # stable: collection order within a group, the tests reading the demo at its end
    items.sort(key=lambda item: (rank[g := _worker_group(item)], first[g], item.nodeid in reads_demo))


def _worker_group(item) -> str:
    for fixture in getattr(item, "fixturenames", ()):
        if fixture in SHARED_ON_ONE_WORKER:
            return SHARED_ON_ONE_WORKER[fixture]
    return item.nodeid.split("::", 1)[0]


@pytest.fixture(autouse=True)
def _no_tenant_keys_held():
    """Start every test holding no tenant's key: the keyrings a process holds are process-wide,
    and one an earlier test registered for its own root (another key file) would be offered for
    a tenant of the same name here."""
    from workload_runtime.tenant_access import forget_all

    forget_all()
    yield
    forget_all()


@pytest.fixture(autouse=True)
def _fresh_dagster_context(request: pytest.FixtureRequest):
    """Start every test with no Dagster instance in context.

    Dagster points a context variable at the last instance opened; one left open by an
    earlier test (a sensor context used without `with`, say) is collected at a moment
    that depends on the garbage collector, and the next definitions load then fails
    with "undefined DagsterInstance weakref". Collect, and start clean, every time.
    """
    from dagster._core.storage.defs_state.base import set_defs_state_storage

    _collect_garbage(module=request.node.nodeid.split("::", 1)[0])
    with set_defs_state_storage(None):
        yield
    # A command run in-process (CliRunner) silences logging for its own output; undo it, or
    # every later test would lose the Dagster events its runs log.
    logging.disable(logging.NOTSET)
