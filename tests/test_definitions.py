"""The Cell code location loads with the assets, checks, jobs and sensors users expect.
(The package boundaries are tests/test_boundaries.py.)"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
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
        "cell/plate_rationale",
    }


def test_cell_checks_and_which_ones_block():
    graph = defs.resolve_asset_graph()
    checks = {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys}
    assert checks == {
        ("cell/raw_assay", "drop_manifest_and_checksums"),
        ("cell/validated_assay", "plate_schema"),
        ("cell/validated_assay", "plate_layout_and_controls"),
        ("cell/validated_assay", "z_prime_at_least_0_5"),
        ("cell/foundation_model", "inputs_agree_to_shared_training"),
        ("cell/finetuned_model", "inputs_agree_to_shared_training"),
    }
    specs = {s.name: s for a in defs.assets for s in getattr(a, "check_specs", [])}
    assert specs["inputs_agree_to_shared_training"].blocking  # a model of several tenants' data needs every agreement
    assert specs["plate_schema"].blocking and specs["plate_layout_and_controls"].blocking
    assert specs["drop_manifest_and_checksums"].blocking
    assert not specs["z_prime_at_least_0_5"].blocking  # low Z' is flagged, not rejected


def test_sensors_and_jobs():
    assert {s.name for s in defs.sensors} == {"assay_drop_sensor", "training_round_sensor", "cell_gpu_job_watcher"}
    assert {j.name for j in defs.jobs} == {"assay_ingest", "cell_training_round"}
    assert defs.resolve_job_def("assay_ingest").partitions_def.name == "lab_assay_drops"  # one partition per drop a lab sent: <lab>/<drop_id>
    assert defs.resolve_job_def("cell_training_round").partitions_def.get_partition_keys() == ["lab-a", "lab-b"]


def test_every_asset_explains_itself():
    for key in defs.resolve_asset_graph().get_all_asset_keys():
        node = defs.resolve_asset_graph().get(key)
        assert node.description and len(node.description) > 60, f"{key} needs a docstring for its users"


def test_pinned_dagster_family():
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        if dep.startswith("dagster"):
            assert "==" in dep, f"{dep} must be pinned exactly"
    assert dg.__version__ == "1.13.27"
