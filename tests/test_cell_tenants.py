"""The Cell lane is multi-tenant: each lab's drops, tables and rounds stay in its own root, sealed
with its own key, and a lab's new plates start a round of that lab only."""

from __future__ import annotations

import hashlib
from pathlib import Path

import dagster as dg

from cell_lane.definitions import defs
from cell_lane.defs.assets.dataset import OMICS_DATASET, omics_dataset
from cell_lane.defs.assets.ingest import RAW_ASSAY, VALIDATED_ASSAY
from cell_lane.defs.partitions import cell_tenants, tenant_drops
from cell_lane.defs.sensors import training_round_sensor
from control_plane.catalog.tenants import load_tenants
from workload_runtime.storage import read_bytes
from data_layer.lineage import LineageStore
from tests.helpers import GENES, SEALED, drop_plate, good_plate, ingest_drop, lab_drop, lab_storage


def _tree(folder: Path) -> dict[str, tuple[int, str]]:
    """Every file under `folder`: its modification time and the hash of its stored bytes."""
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest()) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_partitions_are_the_cell_labs_of_the_catalog():
    labs = sorted(t.name for t in load_tenants().of_lane("cell"))
    assert sorted(cell_tenants.get_partition_keys()) == labs == ["lab-a", "lab-b"]
    graph = defs.resolve_asset_graph()
    assert graph.get(RAW_ASSAY).partitions_def == tenant_drops
    assert graph.get(VALIDATED_ASSAY).partitions_def == tenant_drops
    for key in (OMICS_DATASET, dg.AssetKey(["cell", "foundation_model"]), dg.AssetKey(["cell", "finetuned_model"]), dg.AssetKey(["cell", "next_plate_proposal"])):
        assert graph.get(key).partitions_def == cell_tenants, key
    assert defs.resolve_job_def("assay_ingest").partitions_def == tenant_drops
    assert defs.resolve_job_def("cell_training_round").partitions_def == cell_tenants


def test_a_labs_training_set_depends_on_every_drop_of_that_lab_and_no_other(instance):
    instance.add_dynamic_partitions("assay_drops", ["x", "y"])
    mapping = defs.resolve_asset_graph().get_partition_mapping(OMICS_DATASET, VALIDATED_ASSAY)
    upstream = mapping.get_upstream_mapped_partitions_result_for_partitions(
        cell_tenants.subset_with_partition_keys(["lab-a"]), cell_tenants, tenant_drops, dynamic_partitions_store=instance
    ).partitions_subset
    assert sorted(upstream.get_partition_keys()) == sorted([lab_drop("x"), lab_drop("y")])


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
