"""Bad input gets a specific reason in quarantine, nothing a lab sent is lost, good drops flow.

Ingest is per lab (tenant): these drops are lab-a's, under `tenants/lab-a/`, and what ingest
copies there is sealed with its key (opened here with `read_bytes`: this process holds the key)."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from cell_lane.defs.assets.ingest import raw_assay, validated_assay
from workload_runtime.storage import read_bytes, read_json
from workload_runtime.envelope import is_sealed
from tests.helpers import LAB, drop_plate, good_plate, ingest_drop, lab_storage

ASSETS = [raw_assay, validated_assay]


@pytest.fixture
def storage(root: str):
    """lab-a's own storage root (its key held in this process)."""
    return lab_storage(root)


@pytest.fixture
def lab(home: Path, storage) -> Path:
    return home / "tenants" / LAB


def _ingest(instance, resources, drop_id: str) -> dg.ExecuteInProcessResult:
    return ingest_drop(instance, resources, drop_id, assets=ASSETS)


def _snapshot(folder: Path) -> dict[str, str]:
    """Each file's sha256, of its bytes as the lab sent them (sealed copies opened)."""
    return {str(p.relative_to(folder)): hashlib.sha256(read_bytes(str(p))).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def _quarantine(home: Path, drop_id: str) -> dict:
    return read_json(str(home / "quarantine" / "assays" / drop_id / "QUARANTINE.json"))  # sealed under a lab's root


def _check(instance, result, name: str) -> bool:
    """Whether check `name` passed in the run (a quarantine records its failed checks, then fails the step)."""
    records = instance.all_logs(result.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
    return next(r.dagster_event.event_specific_data.passed for r in records if r.dagster_event.event_specific_data.check_name == name)


def test_good_drop_is_copied_byte_for_byte_and_validated(instance, resources, lab, storage):
    drop_plate(storage, "good")
    result = _ingest(instance, resources, "good")
    assert result.success
    landing = lab / "landing" / "assays" / "good" / "plates" / "plate.csv"
    raw = lab / "raw" / "assays" / "good" / "plates" / "plate.csv"
    assert is_sealed(raw.read_bytes()) and read_bytes(str(raw)) == landing.read_bytes()
    effects = pd.read_parquet(io.BytesIO(read_bytes(str(lab / "curated" / "assays" / "good" / "effects.parquet"))))
    assert set(effects["perturbation"]) == set(good_plate()["perturbation"][lambda s: s != ""])
    assert _check(instance, result, "plate_schema") and _check(instance, result, "plate_layout_and_controls") and _check(instance, result, "z_prime_at_least_0_5")
    assert not (lab / "quarantine" / "assays" / "good").exists()


def _write(lab: Path, drop_id: str, files: dict[str, bytes], manifest: dict | str | None) -> Path:
    folder = lab / "landing" / "assays" / drop_id
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    if manifest is not None:
        (folder / "manifest.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    return folder


def _manifest(drop_id: str, files: dict[str, bytes], **overrides) -> dict:
    entries = [{"path": n, "sha256": hashlib.sha256(d).hexdigest(), "bytes": len(d)} for n, d in files.items()]
    return {"drop_id": drop_id, "assay": "a", "instrument": "i", "project": "p", "files": entries, **overrides}


GOOD_CSV = good_plate().to_csv(index=False).encode()


def _case_wrong_checksum(home):
    m = _manifest("x", {"p.csv": GOOD_CSV})
    m["files"][0]["sha256"] = "0" * 64
    return {"p.csv": GOOD_CSV}, m


def _case_truncated(home):
    m = _manifest("x", {"p.csv": GOOD_CSV})
    return {"p.csv": GOOD_CSV[:-200]}, m


def _case_missing_file(home):
    m = _manifest("x", {"p.csv": GOOD_CSV, "q.csv": GOOD_CSV})
    return {"p.csv": GOOD_CSV}, m


def _case_empty_drop(home):
    return {}, _manifest("x", {})


def _case_bad_json(home):
    return {"p.csv": GOOD_CSV}, '{"drop_id": "x", "files": [}'


def _case_missing_field(home):
    m = _manifest("x", {"p.csv": GOOD_CSV})
    del m["instrument"]
    return {"p.csv": GOOD_CSV}, m


def _case_wrong_drop_id(home):
    return {"p.csv": GOOD_CSV}, _manifest("someone-else", {"p.csv": GOOD_CSV})


@pytest.mark.parametrize(
    ("case", "rule"),
    [
        (_case_wrong_checksum, "checksum_mismatch"),
        (_case_truncated, "size_mismatch"),
        (_case_missing_file, "missing_file"),
        (_case_empty_drop, "empty_drop"),
        (_case_bad_json, "manifest_json"),
        (_case_missing_field, "manifest_field"),
        (_case_wrong_drop_id, "manifest_drop_id"),
    ],
)
def test_bad_drop_is_quarantined_at_raw_with_its_reason(instance, resources, lab, case, rule):
    files, manifest = case(lab)
    if isinstance(manifest, dict) and manifest["drop_id"] == "x":
        manifest["drop_id"] = "bad"
    folder = _write(lab, "bad", files, manifest)
    before = _snapshot(folder)
    result = _ingest(instance, resources, "bad")
    assert not result.success  # the blocking check stops the drop here
    assert not _check(instance, result, "drop_manifest_and_checksums")
    report = _quarantine(lab, "bad")
    assert report["stage"] == "raw"
    assert rule in {i["rule"] for i in report["issues"]}
    assert _snapshot(folder) == before, "landing must not change"
    assert _snapshot(lab / "quarantine" / "assays" / "bad" / "original") == before, "quarantine keeps the originals"
    assert not (lab / "raw" / "assays" / "bad").exists()
    assert not (lab / "curated" / "assays" / "bad").exists()
    _assert_failed_and_observed(instance, raw_assay.key, "bad", "raw")
    assert read_bytes(str(lab / "quarantine" / "assays" / "bad" / "QUARANTINE.md")).startswith(b"# Drop `bad`")


def _plate_bytes(mutate) -> bytes:
    table = good_plate()
    return mutate(table)


@pytest.mark.parametrize(
    ("make", "rule"),
    [
        (lambda t: t.to_csv(index=False, sep=";").encode(), "delimiter"),
        (lambda t: t.to_csv(index=False).encode("utf-16"), "encoding"),
        (lambda t: t.drop(columns=["readout"]).to_csv(index=False).encode(), "missing_column"),
        (lambda t: t.assign(notes="x").to_csv(index=False).encode(), "extra_column"),
        (lambda t: t.assign(well=t["well"].where(t.index != 3, t["well"][2])).to_csv(index=False).encode(), "duplicate_well"),
        (lambda t: t[t["sample_type"] != "pos_ctrl"].to_csv(index=False).encode(), "missing_controls"),
        (lambda t: t.astype({"readout": object}).assign(readout=lambda f: f["readout"].where(f.index != 10, "n/a!")).to_csv(index=False).encode(), "non_numeric_readout"),
        (lambda t: t.to_csv(index=False).encode() + b"P001,H99,sample\n", "malformed_csv"),
    ],
)
def test_bad_plate_is_quarantined_at_validation_with_its_reason(instance, resources, lab, storage, make, rule):
    data = make(good_plate())
    folder = _write(lab, "badplate", {"plates/p.csv": data}, _manifest("badplate", {"plates/p.csv": data}))
    before = _snapshot(folder)
    result = _ingest(instance, resources, "badplate")
    assert not result.success
    report = _quarantine(lab, "badplate")
    assert report["stage"] == "validation"
    assert rule in {i["rule"] for i in report["issues"]}, report["issues"]
    assert all(i["file"] == "plates/p.csv" for i in report["issues"])
    assert _snapshot(folder) == before
    assert not (lab / "curated" / "assays" / "badplate").exists()
    _assert_failed_and_observed(instance, validated_assay.key, "badplate", "validation")


def _assert_failed_and_observed(instance, key: dg.AssetKey, drop_id: str, stage: str) -> None:
    """A quarantined drop is no materialization of the asset (its partition reads Failed in the
    UI); an observation of the partition says where its files are and why."""
    assert not instance.get_materialized_partitions(key), "a quarantined drop must not read as materialized"
    (record,) = instance.fetch_observations(key, limit=10).records
    facts = {k: v.value for k, v in record.asset_observation.metadata.items()}
    assert (facts["status"], facts["stage"], facts["tenant"]) == ("quarantined", stage, LAB)
    assert facts["quarantine"].endswith(f"quarantine/assays/{drop_id}") and facts["issues"] > 0
    assert "| rule |" in facts["reasons"] or "rule |" in facts["reasons"]


def test_good_drops_still_flow_next_to_a_bad_one(instance, resources, lab, storage):
    drop_plate(storage, "good-1")
    bad = good_plate()
    bad = bad[bad["sample_type"] != "neg_ctrl"]
    drop_plate(storage, "bad-1", bad)
    drop_plate(storage, "good-2", good_plate(seed=3))
    outcomes = {d: _ingest(instance, resources, d).success for d in ("good-1", "bad-1", "good-2")}
    assert outcomes == {"good-1": True, "bad-1": False, "good-2": True}
    assert sorted(p.name for p in (lab / "curated" / "assays").iterdir()) == ["good-1", "good-2"]


def test_low_z_prime_is_flagged_not_rejected(instance, resources, lab, storage):
    table = good_plate()
    noisy = table["sample_type"] == "neg_ctrl"
    table.loc[noisy, "readout"] = [1000, 500, 1400, 700, 1300, 600, 1200, 900]
    drop_plate(storage, "noisy", table)
    result = _ingest(instance, resources, "noisy")
    assert result.success
    assert not _check(instance, result, "z_prime_at_least_0_5")
    assert (lab / "curated" / "assays" / "noisy" / "effects.parquet").exists()


def test_raw_zone_is_immutable(instance, resources, lab, storage):
    drop_plate(storage, "once")
    assert _ingest(instance, resources, "once").success
    raw = lab / "raw" / "assays" / "once" / "plates" / "plate.csv"
    written = raw.stat().st_mtime_ns
    assert _ingest(instance, resources, "once").success  # re-materializing leaves raw alone
    assert raw.stat().st_mtime_ns == written


def test_quarantined_copies_and_their_reasons_are_sealed(instance, resources, lab, storage):
    bad = good_plate()
    drop_plate(storage, "bad", bad[bad["sample_type"] != "pos_ctrl"])
    assert not _ingest(instance, resources, "bad").success
    where = lab / "quarantine" / "assays" / "bad"
    assert is_sealed((where / "original" / "plates" / "plate.csv").read_bytes())
    # Under a lab's root everything outside landing/ and outbox/ is sealed: the drop's manifest and the
    # reasons too (they quote the lab's values); its people read them in the UI or with `data decrypt --to`.
    for name in ("original/manifest.json", "QUARANTINE.json", "QUARANTINE.md"):
        assert is_sealed((where / name).read_bytes()), name
    assert read_bytes(str(where / "QUARANTINE.md")).startswith(b"# Drop `bad`")
