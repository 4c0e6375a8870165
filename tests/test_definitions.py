"""The Cell code location loads with the assets, checks, jobs and sensors users expect,
and the package boundaries the architecture sets hold."""

from __future__ import annotations

import ast
from pathlib import Path

import dagster as dg
import pytest

from cell_lane.definitions import defs

REPO = Path(__file__).resolve().parent.parent


def test_cell_location_has_the_whole_loop():
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert keys == {
        "cell/raw_assay",
        "cell/validated_assay",
        "cell/omics_dataset",
        "cell/foundation_model",
        "cell/finetuned_model",
        "cell/next_plate_proposal",
    }


def test_cell_checks_and_which_ones_block():
    graph = defs.resolve_asset_graph()
    checks = {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys}
    assert checks == {
        ("cell/raw_assay", "drop_manifest_and_checksums"),
        ("cell/validated_assay", "plate_schema"),
        ("cell/validated_assay", "plate_layout_and_controls"),
        ("cell/validated_assay", "z_prime_at_least_0_5"),
    }
    specs = {s.name: s for a in defs.assets for s in getattr(a, "check_specs", [])}
    assert specs["plate_schema"].blocking and specs["plate_layout_and_controls"].blocking
    assert specs["drop_manifest_and_checksums"].blocking
    assert not specs["z_prime_at_least_0_5"].blocking  # low Z' is flagged, not rejected


def test_sensors_and_jobs():
    assert {s.name for s in defs.sensors} == {"assay_drop_sensor", "training_round_sensor", "cell_gpu_job_watcher"}
    assert {j.name for j in defs.jobs} == {"assay_ingest", "cell_training_round"}
    assert defs.resolve_job_def("assay_ingest").partitions_def.name == "assay_drops"


def test_every_asset_explains_itself():
    for key in defs.resolve_asset_graph().get_all_asset_keys():
        node = defs.resolve_asset_graph().get(key)
        assert node.description and len(node.description) > 60, f"{key} needs a docstring for its users"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _package_imports(package: str) -> dict[Path, set[str]]:
    return {p: _imports(p) for p in (REPO / package).rglob("*.py")}


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("shared_resources", ("cell_lane", "robotics_lane", "sensors", "sinewgrid", "drills")),
        ("cell_lane", ("robotics_lane", "sinewgrid", "drills")),
        ("robotics_lane", ("cell_lane", "sinewgrid", "drills")),
        ("sensors", ("cell_lane", "robotics_lane", "sinewgrid", "drills")),
    ],
)
def test_package_boundaries(package, forbidden):
    for path, names in _package_imports(package).items():
        for name in names:
            assert not name.split(".")[0] in forbidden, f"{path.relative_to(REPO)} imports {name}"


def test_workloads_talk_back_only_through_pipes():
    """A workload (and what it imports from its lane) uses no Dagster internals and no backend
    code: dagster_pipes only. The rollout workload must also import in the Isaac Lab runtime,
    which has no Dagster at all."""
    workload_files = (
        list((REPO / "cell_lane" / "workloads").rglob("*.py"))
        + list((REPO / "robotics_lane" / "workloads").rglob("*.py"))
        + list((REPO / "robotics_lane" / "sim").rglob("*.py"))
        + list((REPO / "robotics_lane" / "episodes").rglob("*.py"))
        + [REPO / "robotics_lane" / "policies.py", REPO / "shared_resources" / "workload.py", REPO / "shared_resources" / "probe.py"]
    )
    for path in workload_files:
        for name in _imports(path):
            top = name.split(".")[0]
            assert top != "dagster", f"{path.relative_to(REPO)} imports {name}"
            assert not name.startswith(("shared_resources.compute.resource", "shared_resources.compute.backends", "shared_resources.resources")), (
                f"{path.relative_to(REPO)} imports backend code {name}"
            )


def test_pinned_dagster_family():
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        if dep.startswith("dagster"):
            assert "==" in dep, f"{dep} must be pinned exactly"
    assert dg.__version__ == "1.13.27"
