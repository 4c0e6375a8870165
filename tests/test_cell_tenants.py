"""The Cell lane is multi-tenant: each lab's drops, tables and rounds stay in its own root, sealed
with its own key, and a lab's new plates start a round of that lab only."""

from __future__ import annotations

import hashlib
from pathlib import Path

import dagster as dg
import pytest

from cell_lane.definitions import defs
from cell_lane.defs.assets.dataset import OMICS_DATASET, omics_dataset
from cell_lane.defs.assets.ingest import RAW_ASSAY, VALIDATED_ASSAY
from cell_lane.defs.partitions import cell_tenants, lab_drops
from cell_lane.defs.sensors import training_round_sensor
from control_plane.catalog.tenants import load_tenants
from control_plane.intake.landing import split_tenant_drop_key
from workload_runtime.storage import read_bytes
from data_layer.lineage import LineageStore
from tests.helpers import GENES, LAB_DROPS, SEALED, add_lab_drops, drop_plate, good_plate, ingest_drop, lab_drop, lab_storage


def _tree(folder: Path) -> dict[str, tuple[int, str]]:
    """Every file under `folder`: its modification time and the hash of its stored bytes."""
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest()) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_partitions_are_the_cell_labs_of_the_catalog():
    labs = sorted(t.name for t in load_tenants().of_lane("cell"))
    assert sorted(cell_tenants.get_partition_keys()) == labs == ["lab-a", "lab-b"]
    graph = defs.resolve_asset_graph()
    assert graph.get(RAW_ASSAY).partitions_def == lab_drops
    assert graph.get(VALIDATED_ASSAY).partitions_def == lab_drops
    assert lab_drops.name == LAB_DROPS
    for key in (OMICS_DATASET, dg.AssetKey(["cell", "foundation_model"]), dg.AssetKey(["cell", "finetuned_model"]), dg.AssetKey(["cell", "next_plate_proposal"])):
        assert graph.get(key).partitions_def == cell_tenants, key
    assert defs.resolve_job_def("assay_ingest").partitions_def == lab_drops
    assert defs.resolve_job_def("cell_training_round").partitions_def == cell_tenants


def test_an_ingest_partition_is_a_drop_a_lab_sent_and_no_other(instance):
    """The UI lists a lab's drops only: no drop of one lab offered under another (the drop x lab
    grid this replaced showed 4 such "Missing" partitions after the demo)."""
    add_lab_drops(instance, ["x", "y"], "lab-a")
    add_lab_drops(instance, ["x"], "lab-b")
    assert sorted(lab_drops.get_partition_keys(dynamic_partitions_store=instance)) == ["lab-a/x", "lab-a/y", "lab-b/x"]
    for bad in ("x", "lab-a", "lab-a/", "/x"):
        with pytest.raises(ValueError, match="<tenant>/<drop_id>"):
            split_tenant_drop_key(bad)


def test_no_labs_training_set_is_linked_to_another_labs_drop(instance):
    add_lab_drops(instance, ["x"], "lab-a")
    add_lab_drops(instance, ["x"], "lab-b")
    mapping = defs.resolve_asset_graph().get_partition_mapping(OMICS_DATASET, VALIDATED_ASSAY)
    for lab in ("lab-a", "lab-b"):
        upstream = mapping.get_upstream_mapped_partitions_result_for_partitions(
            cell_tenants.subset_with_partition_keys([lab]), cell_tenants, lab_drops, dynamic_partitions_store=instance
        )
        assert not list(upstream.partitions_subset.get_partition_keys()) and not upstream.required_but_nonexistent_subset, lab
    downstream = mapping.get_downstream_partitions_for_partitions(
        lab_drops.subset_with_partition_keys([lab_drop("x", "lab-b")]), lab_drops, cell_tenants, dynamic_partitions_store=instance
    )
    assert "lab-a" not in downstream.get_partition_keys()


def test_the_same_drop_id_from_two_labs_is_ingested_into_each_labs_root_sealed(instance, resources, root, home):
    plates = {"lab-a": good_plate("PA01", seed=1), "lab-b": good_plate("PB01", seed=2)}
    for tenant, table in plates.items():
        drop_plate(lab_storage(root, tenant), "x", table)

    assert ingest_drop(instance, resources, "x", "lab-a").success
    lab_a = home / "tenants" / "lab-a"
    before = _tree(lab_a)
    assert ingest_drop(instance, resources, "x", "lab-b").success
    assert _tree(lab_a) == before, "lab-b's ingest changed something under lab-a's root"

    for tenant, table in plates.items():
        lab = home / "tenants" / tenant
        sealed = [lab / "raw" / "assays" / "x" / "plates" / "plate.csv", lab / "curated" / "assays" / "x" / "plates.parquet", lab / "curated" / "assays" / "x" / "effects.parquet"]
        values = [*(g.encode() for g in GENES), table["plate_barcode"].iloc[0].encode(), *(f"{v}".encode() for v in table["readout"].head(20))]
        for path in sealed:
            stored = path.read_bytes()
            assert stored.startswith(SEALED), path
            assert not [v for v in values if v in stored], f"{path} holds plate values in the clear"
        # opened with the lab's key, the raw copy is what the lab sent, byte for byte
        assert read_bytes(str(lab / "raw" / "assays" / "x" / "plates" / "plate.csv")) == table.to_csv(index=False).encode()
        manifest = (lab / "raw" / "assays" / "x" / "manifest.json").read_bytes()  # sealed too: it names the lab's files
        assert manifest.startswith(SEALED) and b"plate.csv" not in manifest
        # the lineage names the key that sealed the drop and its curated version (its id, never the key)
        lineage = LineageStore(str(lab))
        for node in ("drop/assays/x", "cell/assays@x"):
            assert lineage.get(node).facts["sealed_with_key"].startswith(f"local:{tenant}:"), node
    assert not (home / "raw").exists() and not (home / "curated").exists()  # nothing went to the platform's own zones
    materialized = instance.get_materialized_partitions(VALIDATED_ASSAY)
    assert materialized == {lab_drop("x", "lab-a"), lab_drop("x", "lab-b")}


def _evaluate(instance):
    with dg.build_sensor_context(instance_ref=instance.get_ref(), definitions=defs) as context:
        return training_round_sensor.evaluate_tick(context)


def test_the_retraining_sensor_asks_for_a_round_of_the_lab_with_new_plates_only(instance, resources, root):
    for tenant in ("lab-a", "lab-b"):
        drop_plate(lab_storage(root, tenant), "first", good_plate(seed=4))
    assert ingest_drop(instance, resources, "first", "lab-a").success
    assert [r.partition_key for r in _evaluate(instance).run_requests] == ["lab-a"]  # lab-b sent nothing valid yet

    assert ingest_drop(instance, resources, "first", "lab-b").success
    assert [r.partition_key for r in _evaluate(instance).run_requests] == ["lab-a", "lab-b"]
    for tenant in ("lab-a", "lab-b"):
        dg.materialize([omics_dataset], instance=instance, resources=resources, partition_key=tenant)
    assert _evaluate(instance).run_requests == []

    drop_plate(lab_storage(root, "lab-b"), "second", good_plate("P002", seed=5))
    assert ingest_drop(instance, resources, "second", "lab-b").success
    requests = _evaluate(instance).run_requests
    assert [r.partition_key for r in requests] == ["lab-b"]
    assert requests[0].tags["sinewgrid/tenant"] == "lab-b" and requests[0].tags["sinewgrid/trigger"] == f"cell/validated_assay:{lab_drop('second', 'lab-b')}"

    # Each lab's training set is made from its own drops, as its version's lineage records.
    made_from = {}
    for tenant in ("lab-a", "lab-b"):
        result = dg.materialize([omics_dataset], instance=instance, resources=resources, partition_key=tenant)
        version = result.asset_materializations_for_node("cell__omics_dataset")[0].metadata["version"].value
        made_from[tenant] = sorted(LineageStore(lab_storage(root, tenant).root).get(f"cell/omics@{version}").inputs)
    assert made_from == {"lab-a": ["cell/assays@first"], "lab-b": ["cell/assays@first", "cell/assays@second"]}
