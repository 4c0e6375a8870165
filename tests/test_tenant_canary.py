"""No plain copy of a sealed lab's data in the platform's stores (issue 31, class 5): a canary test.

Each lab hands in plates carrying values found nowhere else: a free-text note in the drop's
manifest and, in a second drop, a reader's flag where a readout belongs (the validation quotes it
in its reason). The lab's loop runs from ingest to its omics dataset on a Dagster instance that
captures compute logs, as a deployment's does. Then every byte the platform wrote is searched:
Dagster's run and event databases and compute logs, the ledger, the lineage, every file under the
storage root, the node cache and this test's temp folders. A canary may sit only in the lab's own
landing zone (what it handed in); in a sealed object it is ciphertext, so it is not found there.
Dagster's metadata for the labs' partitions names no gene of their plates either (no rows, no
per-gene effects), and with the lab's key disabled nothing of its plates can be read anywhere.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

import dagster as dg
import pytest

from cell_lane.defs.assets.dataset import omics_dataset
from tests.helpers import GENES, drop_plate, good_plate, ingest_drop, lab_storage
from workload_runtime.envelope import is_sealed
from workload_runtime.keys import KeyUnavailable, set_local_key_enabled
from workload_runtime.storage import read_bytes

LABS = ("lab-a", "lab-b")


def _canaries(lab: str) -> dict[str, bytes]:
    token = uuid.uuid4().hex[:12]
    return {"note": f"canary-note-{lab}-{token}".encode(), "flag": f"CANARY-FLAG-{lab}-{token}".encode()}


def _files(*folders: Path) -> list[Path]:
    found = []
    for folder in folders:
        for dirpath, _, names in os.walk(folder):
            for name in names:
                path = Path(dirpath, name)
                try:
                    if path.is_file() and not path.is_symlink() and path.stat().st_size < (64 << 20):
                        found.append(path)
                except OSError:
                    continue  # gone meanwhile (another worker's temporary file)
    return found


def _objects(lab_root: Path) -> list[Path]:
    """The objects the platform wrote under a lab's root, but for its plain areas and the registry's bookkeeping."""
    return [p for p in _files(lab_root) if p.relative_to(lab_root).parts[0] not in ("landing", "outbox", "registry")]


def _plain_copies(canaries: dict[str, dict[str, bytes]], files: list[Path], allowed: list[Path]) -> list[str]:
    found = []
    for path in files:
        if any(path == a or a in path.parents for a in allowed):
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        found += [f"{lab}'s {what} in {path}" for lab, marks in canaries.items() for what, mark in marks.items() if mark in data]
    return found


@pytest.fixture
def capturing_instance(home: Path):
    """An instance that keeps each step's stdout and stderr, as a deployment's does."""
    with dg.instance_for_test(temp_dir=str(home / "dagster")) as instance:
        yield instance


@pytest.fixture
def temp_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp folder of this test's process and of every process it starts (Pipes' message
    files, anndata's and zarr's scratch), so the search covers it and nothing of other tests."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_no_plain_copy_of_a_labs_data_outside_its_sealed_objects_and_landing(temp_folder, capturing_instance, resources, root, home, tmp_path):
    instance = capturing_instance
    canaries = {lab: _canaries(lab) for lab in LABS}
    for seed, lab in enumerate(LABS):
        storage = lab_storage(root, lab)
        drop_plate(storage, "canary", good_plate(f"P{seed}", seed=seed), note=canaries[lab]["note"].decode())
        flagged = good_plate(f"Q{seed}", seed=seed).astype({"readout": object})
        flagged.loc[flagged["sample_type"] == "sample", "readout"] = canaries[lab]["flag"].decode()
        drop_plate(storage, "canary-flagged", flagged)
        assert ingest_drop(instance, resources, "canary", lab).success
        assert not ingest_drop(instance, resources, "canary-flagged", lab).success  # quarantined, quoting the flag
        assert dg.materialize([omics_dataset], instance=instance, resources=resources, partition_key=lab).success

    landing = [home / "tenants" / lab / "landing" for lab in LABS]
    stores = _files(home, tmp_path)  # the storage root, the instance (under it), the temp folder (under tmp_path)
    assert any(p.suffix == ".db" for p in _files(home / "dagster")), "the instance's databases were not where the test looks"
    assert _plain_copies(canaries, stores, allowed=landing) == []

    # Everything under a lab's root is sealed but its landing zone and outbox, and the data registry's
    # own bookkeeping (git history, DVC's listings and locks: names and checksums, searched above).
    for lab in LABS:
        lab_root = home / "tenants" / lab
        plain = [p for p in _objects(lab_root) if not is_sealed(p.read_bytes())]
        assert plain == [], plain
        registered = [p for p in _files(lab_root / "registry" / "dvc-store" / "files") if not p.name.endswith(".dir")]
        assert registered and all(is_sealed(p.read_bytes()) for p in registered)

    # No gene of the labs' plates in the metadata of their partitions: counts and identifiers only.
    for record in instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey(["cell", "validated_assay"])), limit=100).records:
        shown = str(record.asset_materialization.metadata)
        assert not [g for g in GENES if g in shown], shown
    for lab in LABS:
        [dataset] = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(["cell", "omics_dataset"]), asset_partitions=[lab]), limit=1
        ).records
        shown = str(dataset.asset_materialization.metadata)
        assert "strongest per-gene effects of tenant" in shown and not [g for g in GENES if f"| {g} " in shown], shown


def test_with_its_key_disabled_nothing_of_a_labs_plates_is_readable(resources, root, home, instance):
    storage = lab_storage(root, "lab-a")
    drop_plate(storage, "canary", good_plate("P0", seed=0))
    assert ingest_drop(instance, resources, "canary", "lab-a").success
    copies = _objects(home / "tenants" / "lab-a")
    assert copies and all(is_sealed(p.read_bytes()) for p in copies)
    key = Path(os.environ["SINEWGRID_KEYS_DIR"]) / "lab-a.key"
    set_local_key_enabled(key, False)
    try:
        for path in copies:
            with pytest.raises(KeyUnavailable, match="disabled"):
                read_bytes(str(path))
    finally:
        set_local_key_enabled(key, True)
