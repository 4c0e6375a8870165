"""A workload's environment is an allow-list on every backend (workload_runtime/allowed_env.py).

As an attacker would look: this process (the control plane) holds two tenants' storage credentials
(`LAB_A_AWS_*`, `LAB_B_AWS_*`), the platform's own (`AWS_ACCESS_KEY_ID`, ...), a secret someone
exported by hand and the platform's settings. The counting workload then runs as lab-b's step on a
local pool, a real Slurm cluster and a real Ray head, and reports the names of the variables it
started with: its environment and what the kernel holds (/proc/self/environ, which a process
forked warm shares with its forkserver). None of those may be there; lab-b's own credentials
come through its inputs, never the environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from control_plane.compute.backends.ray import allow_listed
from control_plane.settings import REPO_ROOT
from testbed.counting_step import counting_spec, materialize_counting, result_metadata
from workload_runtime import tenant_access as access
from workload_runtime.allowed_env import PLATFORM_CREDENTIALS, allowed, workload_environment
from workload_runtime.keys import create_local_key

TENANT_SECRETS = ("LAB_A_AWS_ACCESS_KEY_ID", "LAB_A_AWS_SECRET_ACCESS_KEY", "LAB_B_AWS_ACCESS_KEY_ID", "LAB_B_AWS_SECRET_ACCESS_KEY")
PLATFORM_SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
CANARY = "SINEWGRID_CANARY_SECRET"
# The control plane's own settings and the test runner's: a workload needs none of them.
CONTROL_PLANE = ("DAGSTER_HOME", "SINEWGRID_HOME", "SINEWGRID_TENANTS", "SINEWGRID_KEYS_DIR", "PYTEST_CURRENT_TEST")


def test_only_allowed_variables_pass_and_the_platforms_credentials_only_when_asked():
    source = {
        "PATH": "/bin", "HOME": "/root", "LC_ALL": "C", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "0", "AWS_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000", "SINEWGRID_NODE_CACHE_DIR": "/cache", "SLURM_JOB_ID": "7",
        "LAB_A_AWS_SECRET_ACCESS_KEY": "a", CANARY: "x", "DAGSTER_HOME": "/d", "SINEWGRID_LEDGER_URL": "postgresql://u:p@h/db",
        "AWS_ACCESS_KEY_ID": "platform", "AWS_SECRET_ACCESS_KEY": "platform", "AWS_PROFILE": "admin", "DAGSTER_PIPES_CONTEXT": "stale",
    }  # fmt: skip
    env = workload_environment(source, platform_credentials=False, extra={"DAGSTER_PIPES_CONTEXT": "this attempt's", "MY_POOL_VAR": "1"})
    assert env == {
        "PATH": "/bin", "HOME": "/root", "LC_ALL": "C", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "0", "AWS_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000", "SINEWGRID_NODE_CACHE_DIR": "/cache", "SLURM_JOB_ID": "7",
        "DAGSTER_PIPES_CONTEXT": "this attempt's", "MY_POOL_VAR": "1",
    }  # fmt: skip
    with_platform = workload_environment(source, platform_credentials=True)
    assert {k: with_platform[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE")} == {
        "AWS_ACCESS_KEY_ID": "platform", "AWS_SECRET_ACCESS_KEY": "platform", "AWS_PROFILE": "admin"
    }
    assert not any(allowed(name) for name in PLATFORM_CREDENTIALS)  # never by the list itself
    # A tenant's prefix never makes a variable allowed, whatever follows it.
    assert not any(allowed(name) for name in ("LAB_A_PATH", "LAB_A_OMP_NUM_THREADS", "X_AWS_REGION", "AWS_ACCESS_KEY_ID_2"))


def test_the_node_side_wrapper_runs_a_command_with_the_allowed_environment_and_the_names_it_keeps():
    env = {"PATH": os.environ["PATH"], "HOME": "/root", "PYTEST_XDIST_WORKER": "gw0", "MY_POOL_VAR": "1", CANARY: "x", "AWS_SECRET_ACCESS_KEY": "p"}
    code = "import json, os; print(json.dumps(sorted(os.environ)))"
    seen = subprocess.run(
        [sys.executable, "-m", "workload_runtime.allowed_env", "--keep=MY_POOL_VAR,NOT_SET", "--", sys.executable, "-c", code],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    names = set(json.loads(seen))
    assert {"PATH", "HOME", "MY_POOL_VAR"} <= names
    assert not names & {"PYTEST_XDIST_WORKER", CANARY, "AWS_SECRET_ACCESS_KEY", "NOT_SET"}
    # On Ray the wrapper goes around the workload, and around each rank of a gang, not the gang's launcher.
    gang = ["/py", "-m", "workload_runtime.ray_gang", "--nodes=2", "--", "/py", "-m", "entry"]
    assert allow_listed(gang, keep={"B": "1", "A": "2"}, platform_credentials=False) == [
        "/py", "-m", "workload_runtime.ray_gang", "--nodes=2", "--", "/py", "-m", "workload_runtime.allowed_env", "--keep=A,B", "--", "/py", "-m", "entry",
    ]  # fmt: skip


@pytest.fixture
def attacked(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The control plane's environment as an attacker hopes to find it in a workload: two tenants'
    credentials, the platform's, a hand-exported secret; lab-a and lab-b in the tenants catalog."""
    for name in (*TENANT_SECRETS, *PLATFORM_SECRETS, CANARY):
        monkeypatch.setenv(name, f"secret-of-{name.lower()}")
    catalog = {"tenants": {t: {"lane": "cell", "credentials": {"env": t.upper().replace("-", "_")}} for t in ("lab-a", "lab-b")}}
    (tmp_path / "tenants.yaml").write_text(json.dumps(catalog))
    monkeypatch.setenv("SINEWGRID_TENANTS", str(tmp_path / "tenants.yaml"))
    monkeypatch.setenv("SINEWGRID_KEYS_DIR", str(tmp_path / "keys"))
    for tenant in ("lab-a", "lab-b"):
        create_local_key(tmp_path / "keys" / f"{tenant}.key", tenant)  # as `sinewgrid tenants key create` does
    access.forget_all()
    yield home
    access.forget_all()


def _started_with(home: Path, pools: str, tenant: str) -> set[str]:
    (home.parent / "pools.yaml").write_text(pools)
    spec = counting_spec(tenant=tenant, config={"steps": 3, "report_environ": True})
    return set(result_metadata(materialize_counting(home, home.parent / "pools.yaml", spec))["environ"].split(","))


def _assert_nothing_of_the_control_plane(names: set[str]) -> None:
    assert "PATH" in names and "DAGSTER_PIPES_CONTEXT" in names, sorted(names)  # what it needs did arrive
    leaked = names & {*TENANT_SECRETS, *PLATFORM_SECRETS, CANARY, *CONTROL_PLANE}
    assert not leaked, f"the workload's environment holds {sorted(leaked)}"


def _pool(backend: str, backend_settings: dict, **fields) -> str:
    """A catalog of one on-demand pool of `backend`."""
    pool = {"provider": f"test-{backend}", "region": "local", "backend": backend, "backend_settings": backend_settings, "purchasing": "on_demand",
            "capacity": "steady", "accelerator": "local", "gpus_per_node": 1, "price_per_gpu_hour": 1.0, **fields}  # fmt: skip
    return yaml.safe_dump({"pools": {f"{backend}-pool": pool}})


LOCAL_POOL = _pool("local", {})


def test_a_tenants_local_step_gets_nothing_of_the_control_planes_environment(attacked: Path):
    _assert_nothing_of_the_control_plane(_started_with(attacked, LOCAL_POOL, "lab-b"))


def test_the_platforms_own_step_gets_the_platforms_credentials_and_no_tenants(attacked: Path):
    names = _started_with(attacked, LOCAL_POOL, "platform")  # not in the tenants catalog: the platform's own
    assert set(PLATFORM_SECRETS) <= names
    assert not names & {*TENANT_SECRETS, CANARY, *CONTROL_PLANE}


def test_a_tenants_slurm_job_gets_nothing_of_the_control_planes_environment(attacked: Path, slurm):
    pools = _pool("slurm", {"partition": "gpu", "env": slurm.env, "time_limit": "00:10:00"}, gpus_per_node=2)
    names = _started_with(attacked, pools, "lab-b")
    _assert_nothing_of_the_control_plane(names)
    assert "SLURM_JOB_ID" in names  # Slurm's own variables, set on the node, do arrive


def test_a_tenants_ray_job_gets_nothing_of_the_raylets_or_the_control_planes_environment(attacked: Path, ray):
    pools = _pool("ray", {"address": ray.address, "resources": {"pool_steady": 1}, "gpu_resource": None}, accelerator="cpu", pending_deadline_seconds=60)
    names = _started_with(attacked, pools, "lab-b")
    _assert_nothing_of_the_control_plane(names)
    # The Ray head was started by this test runner: its variables reach the raylet, never the workload.
    assert not {name for name in names if name.startswith("PYTEST_")}, sorted(names)
