"""A pool maps a step's runtime to an interpreter (local, Slurm), resolved the same way for every
backend; a runtime the backend cannot use is a clear error naming the catalog field."""

from __future__ import annotations

import sys

import dagster as dg
import pytest

from control_plane.compute.backends.base import runtime_interpreter
from control_plane.compute.backends.local import LocalBackend
from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.settings import REPO_ROOT


def _pool(backend: str = "local", settings: dict | None = None, **runtimes) -> Pool:
    return Pool(
        name="p", provider="local", region="local", backend=backend, backend_settings=settings or {},
        purchasing="on_demand", accelerator="local", gpus_per_node=1, price_per_gpu_hour=1.0, runtimes=runtimes,
    )


def _spec(runtime: str = "default") -> StepSpec:
    return StepSpec(name="s", entry_point="x", tenant="t", runtime=runtime)


def test_relative_interpreters_resolve_under_the_repository_and_default_is_this_python():
    assert runtime_interpreter(_pool(isaaclab=".venv-isaaclab/bin/python"), _spec("isaaclab")) == REPO_ROOT / ".venv-isaaclab/bin/python"
    assert runtime_interpreter(_pool(isaaclab="/opt/py/bin/python"), _spec("isaaclab")).as_posix() == "/opt/py/bin/python"
    assert runtime_interpreter(_pool(), _spec()) is None
    assert LocalBackend.interpreter(_pool(), _spec()) == sys.executable


def test_a_runtime_environment_on_a_slurm_pool_is_refused_with_the_field_to_fix():
    pool = _pool("slurm", {"partition": "gpu"}, default={"py_executable": "/usr/bin/python3"})
    with pytest.raises(dg.Failure, match=r"runtime `default` must be an interpreter path for a slurm pool.*`runtimes.default`"):
        runtime_interpreter(pool, _spec())


def test_a_missing_local_interpreter_says_how_to_build_it():
    with pytest.raises(dg.Failure, match="does not exist. Build it"):
        LocalBackend.interpreter(_pool(isaaclab="no/such/python"), _spec("isaaclab"))
