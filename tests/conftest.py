"""Shared fixtures: every test gets its own storage root and Dagster instance."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import dagster as dg
import pytest

from shared_resources.resources import platform_resources
from shared_resources.storage import Storage

warnings.filterwarnings("ignore", category=UserWarning, module="zarr")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "sinewgrid-home"
    root.mkdir()
    monkeypatch.setenv("SINEWGRID_HOME", str(root))
    monkeypatch.setenv("DAGSTER_HOME", str(root / "dagster"))
    (root / "dagster").mkdir()
    return root


@pytest.fixture
def storage(home: Path) -> Storage:
    return Storage.at(str(home))


@pytest.fixture
def resources(home: Path) -> dict:
    return platform_resources(root=str(home), pools_file="")


@pytest.fixture
def instance(home: Path):
    with dg.instance_for_test(temp_dir=str(home / "dagster")) as inst:
        yield inst


@pytest.fixture(scope="session")
def reference_expression():
    from cell_lane.omics import load_reference_expression

    return load_reference_expression()


def pytest_configure(config):
    os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "1")


@pytest.fixture(autouse=True)
def _fresh_dagster_context():
    """Start every test with no Dagster instance in context.

    Dagster points a context variable at the last instance opened; one left open by an
    earlier test (a sensor context used without `with`, say) is collected at a moment
    that depends on the garbage collector, and the next definitions load then fails
    with "undefined DagsterInstance weakref". Collect, and start clean, every time.
    """
    import gc

    from dagster._core.storage.defs_state.base import set_defs_state_storage

    gc.collect()
    with set_defs_state_storage(None):
        yield
    # A command run in-process (CliRunner) silences logging for its own output; undo it, or
    # every later test would lose the Dagster events its runs log.
    logging.disable(logging.NOTSET)
