"""Bad input, from every door a person or a lab uses: each is refused with an error that names
the file, the entry and the fix, and nothing that was handed in is lost or changed.

Doors: a lab's assay drop and a teleop session drop (manifest.json), a pool catalog, a job
file (`load_job` and `sinewgrid plan`), a launchpad config, and a LeRobot v3 dataset.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from cell_lane.defs.assets.ingest import raw_assay, validated_assay
from cell_lane.defs.assets.training import finetuned_model, foundation_model
from control_plane.catalog.pools import PoolCatalogError, load_catalog, load_pools
from control_plane.intake.landing import seal_drop
from control_plane.placement.job_files import JobFileError, load_job
from robotics_lane.defs.assets.policy import policy
from robotics_lane.defs.assets.teleop import teleop_episodes
from robotics_lane.episodes import Episode, validate_dataset, write_dataset
from tests.helpers import add_lab_drops, drop_plate, good_plate, lab_drop, lab_storage, sensor_ingest
from workload_runtime.storage import read_bytes

REPO = Path(__file__).resolve().parent.parent
PLATE = good_plate().to_csv(index=False).encode()


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` with its bytes (a lab's sealed copies opened with its key): what
    'nothing lost, nothing changed' compares."""
    return {str(p.relative_to(folder)): read_bytes(str(p)) for p in sorted(folder.rglob("*")) if p.is_file()}


def quarantine_report(home: Path, kind: str, drop_id: str) -> dict:
    """The quarantine's reasons (under a lab's root sealed with its key, held by this process)."""
    from workload_runtime.storage import read_json

    return read_json(str(home / "quarantine" / kind / drop_id / "QUARANTINE.json"))


def one_line(text: str) -> str:
    """Rich wraps long lines for the terminal; compare the words, not where the lines broke."""
    return " ".join(text.split())


# --- 1. drop manifests ----------------------------------------------------------------------


def entry(path: str, data: bytes) -> dict:
    return {"path": path, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def write_assay_drop(home: Path, drop_id: str, files: dict[str, bytes], entries: list[dict] | None = None, manifest_text: str | None = None) -> Path:
    """A drop as a lab system would write it, with whatever manifest the case needs."""
    folder = home / "landing" / "assays" / drop_id
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    folder.mkdir(parents=True, exist_ok=True)
    if manifest_text is None:
        entries = [entry(n, d) for n, d in files.items()] if entries is None else entries
        manifest_text = json.dumps({"drop_id": drop_id, "assay": "a", "instrument": "i", "project": "p", "files": entries})
    (folder / "manifest.json").write_text(manifest_text)
    return folder


# Each case: the drop's files, its manifest entries, then the rule, the entry and the fix the error must name.
MANIFEST_CASES = {
    "dotdot": ({"p.csv": PLATE}, [entry("../p.csv", PLATE)], "manifest_path", "files[0] path '../p.csv'", "points outside the drop folder"),
    "absolute": ({"p.csv": PLATE}, [entry("/data/p.csv", PLATE)], "manifest_path", "files[0] path '/data/p.csv' is absolute", "relative to the drop folder"),
    "backslash": ({"p.csv": PLATE}, [entry("plates\\p.csv", PLATE)], "manifest_path", "files[0] path 'plates\\\\p.csv' uses backslashes", "forward slashes"),
    "duplicate": ({"p.csv": PLATE}, [entry("p.csv", PLATE), entry("p.csv", PLATE)], "duplicate_entry", "lists 'p.csv' twice (files[0] and files[1])", "remove files[1]"),
    "itself": ({"p.csv": PLATE}, [entry("p.csv", PLATE), entry("manifest.json", b"{}")], "manifest_path", "files[1] path 'manifest.json' is the manifest itself", "remove this entry"),
    "unlisted": ({"p.csv": PLATE, "plates/extra.csv": PLATE}, [entry("p.csv", PLATE)], "unlisted_file", "holds plates/extra.csv but manifest.json does not list it", "list it in `files`"),
}


def _lab(root: str) -> Path:
    """lab-a's own root (its key held here): a Cell drop is a lab's, and its copies are sealed."""
    return Path(lab_storage(root).root)


@pytest.mark.parametrize("case", sorted(MANIFEST_CASES))
def test_a_bad_manifest_refuses_the_whole_drop_and_keeps_every_byte(instance, resources, root, case):
    home = _lab(root)
    files, entries, rule, names_entry, fix = MANIFEST_CASES[case]
    drop_id = f"bad-{case}"
    folder = write_assay_drop(home, drop_id, files, entries)
    sent = snapshot(folder)
    add_lab_drops(instance, [drop_id])

    result = dg.materialize([raw_assay, validated_assay], instance=instance, resources=resources, partition_key=lab_drop(drop_id), raise_on_error=False)

    assert not result.success
    report = quarantine_report(home, "assays", drop_id)
    assert report["stage"] == "raw"
    issue = next(i for i in report["issues"] if i["rule"] == rule)
    assert f"assays drop `{drop_id}`" in issue["message"] and names_entry in issue["message"] and fix in issue["message"]
    assert "new drop_id" in issue["message"]
    assert issue["message"] in read_bytes(str(home / "quarantine" / "assays" / drop_id / "QUARANTINE.md")).decode()
    assert snapshot(folder) == sent, "landing must stay exactly as sent"
    assert snapshot(home / "quarantine" / "assays" / drop_id / "original") == sent, "quarantine keeps every file, byte for byte"
    assert not (home / "raw" / "assays" / drop_id).exists(), "nothing of a refused drop is ingested"
    assert not (home / "curated" / "assays" / drop_id).exists()


def test_a_manifest_with_a_repeated_key_is_refused_not_read_by_its_last_value(instance, resources, root):
    home = _lab(root)
    good = json.dumps([entry("p.csv", PLATE)])
    text = f'{{"drop_id": "twice", "assay": "a", "instrument": "i", "project": "p", "files": [], "files": {good}}}'
    folder = write_assay_drop(home, "twice", {"p.csv": PLATE}, manifest_text=text)
    sent = snapshot(folder)
    add_lab_drops(instance, ["twice"])

    assert not dg.materialize([raw_assay], instance=instance, resources=resources, partition_key=lab_drop("twice"), raise_on_error=False).success

    issue = quarantine_report(home, "assays", "twice")["issues"][0]
    assert issue["rule"] == "manifest_json" and "key `files` is written twice in one object" in issue["message"] and "write each key once" in issue["message"]
    assert snapshot(folder) == sent == snapshot(home / "quarantine" / "assays" / "twice" / "original")


def test_through_the_sensor_a_drop_with_an_unlisted_file_is_quarantined_and_a_good_one_flows(instance, resources, root):
    home, storage = _lab(root), lab_storage(root)
    from cell_lane.definitions import defs
    from cell_lane.defs.sensors import assay_drop_sensor

    drop_plate(storage, "good-1")
    drop_plate(storage, "sneaky")
    stray = home / "landing" / "assays" / "sneaky" / "notes.txt"
    stray.write_text("added after the manifest was written")
    sent = snapshot(stray.parent)

    requested, outcomes, _ = sensor_ingest(assay_drop_sensor, [raw_assay, validated_assay], defs, instance, resources, root, None)

    assert sorted(requested) == [lab_drop("good-1"), lab_drop("sneaky")]
    assert outcomes == {lab_drop("good-1"): True, lab_drop("sneaky"): False}
    issues = quarantine_report(home, "assays", "sneaky")["issues"]
    assert [(i["rule"], i["file"]) for i in issues] == [("unlisted_file", "notes.txt")]
    assert snapshot(stray.parent) == sent == snapshot(home / "quarantine" / "assays" / "sneaky" / "original")
    assert not (home / "raw" / "assays" / "sneaky").exists()
    assert (home / "curated" / "assays" / "good-1" / "effects.parquet").exists()


def small_dataset(folder: Path, lengths: tuple[int, ...] = (20, 22, 24)) -> Path:
    rng = np.random.default_rng(3)
    episodes = [
        Episode("pick", rng.normal(size=(n, 3)).astype(np.float32), rng.uniform(-0.9, 0.9, size=(n, 2)).astype(np.float32))
        for n in lengths
    ]
    write_dataset(str(folder), episodes, fps=10, robot_type="arm", state_names=["q0", "q1", "q2"], action_names=["dq0", "dq1"])
    return folder


def ingest_session(instance, resources, session: str) -> dg.ExecuteInProcessResult:
    instance.add_dynamic_partitions("teleop_sessions", [session])
    return dg.materialize([teleop_episodes], instance=instance, resources=resources, partition_key=session, raise_on_error=False)


def test_a_teleop_session_with_an_unlisted_file_is_refused_whole(instance, resources, home, storage):
    folder = small_dataset(home / "landing" / "teleop" / "session-stray")
    seal_drop(storage, "teleop", "session-stray", robot="arm-1", operator="alice", project="p")
    (folder / "meta" / "notes.md").write_text("written after sealing")
    sent = snapshot(folder)

    assert not ingest_session(instance, resources, "session-stray").success

    report = quarantine_report(home, "teleop", "session-stray")
    assert report["stage"] == "raw"
    [issue] = report["issues"]
    assert issue["rule"] == "unlisted_file" and issue["file"] == "meta/notes.md"
    assert "teleop drop `session-stray` holds meta/notes.md but manifest.json does not list it" in issue["message"]
    assert snapshot(folder) == sent == snapshot(home / "quarantine" / "teleop" / "session-stray" / "original")
    assert not (home / "raw" / "teleop" / "session-stray").exists()


def test_a_teleop_manifest_entry_with_dotdot_is_refused(instance, resources, home, storage):
    folder = small_dataset(home / "landing" / "teleop" / "session-climb")
    seal_drop(storage, "teleop", "session-climb", robot="arm-1", operator="alice", project="p")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][0]["path"] = "../session-other/" + manifest["files"][0]["path"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    sent = snapshot(folder)

    assert not ingest_session(instance, resources, "session-climb").success

    issue = quarantine_report(home, "teleop", "session-climb")["issues"][0]
    assert issue["rule"] == "manifest_path" and "teleop drop `session-climb`" in issue["message"] and "files[0]" in issue["message"]
    assert snapshot(folder) == sent == snapshot(home / "quarantine" / "teleop" / "session-climb" / "original")


# --- 5. LeRobot v3 datasets with no episodes, or an episode with no frames ------------------


def empty_all_episodes(folder: Path) -> None:
    for rel in ("meta/episodes/chunk-000/file-000.parquet", "data/chunk-000/file-000.parquet"):
        pq.write_table(pq.read_table(folder / rel).slice(0, 0), folder / rel)
    info = json.loads((folder / "meta" / "info.json").read_text())
    info.update(total_episodes=0, total_frames=0, splits={"train": "0:0"})
    (folder / "meta" / "info.json").write_text(json.dumps(info))


def empty_episode_1(folder: Path) -> None:
    """Episode 1 keeps its row (length 0) but loses its 22 frames; the totals are made to agree."""
    table_path, data_path = folder / "meta/episodes/chunk-000/file-000.parquet", folder / "data/chunk-000/file-000.parquet"
    rows = pq.read_table(table_path).to_pylist()
    rows[1].update(length=0, dataset_to_index=rows[1]["dataset_from_index"])
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(table_path)), table_path)
    data = pq.read_table(data_path)
    pq.write_table(data.filter(pc.not_equal(data["episode_index"], 1)), data_path)
    info = json.loads((folder / "meta" / "info.json").read_text())
    info["total_frames"] -= 22
    (folder / "meta" / "info.json").write_text(json.dumps(info))


def test_validate_dataset_refuses_a_dataset_with_no_episodes_naming_the_folder(tmp_path):
    folder = small_dataset(tmp_path / "session-empty")
    empty_all_episodes(folder)
    before = snapshot(folder)
    info, issues = validate_dataset(str(folder))
    assert info is not None and info.total_episodes == 0
    [issue] = issues
    assert issue.rule == "no_episodes"
    assert str(folder) in issue.message and "record at least one episode" in issue.message
    assert snapshot(folder) == before, "validation only reads"


def test_validate_dataset_refuses_an_episode_of_zero_length_naming_folder_and_episode(tmp_path):
    folder = small_dataset(tmp_path / "session-hollow")
    empty_episode_1(folder)
    before = snapshot(folder)
    _, issues = validate_dataset(str(folder))
    [issue] = issues
    assert issue.rule == "episode_length" and issue.file == "data/chunk-000/file-000.parquet"
    assert f"episode 1 of {folder}" in issue.message and "length 0" in issue.message
    assert "an episode needs at least one frame" in issue.message and "remove its row" in issue.message
    assert snapshot(folder) == before


@pytest.mark.parametrize(("damage", "rule", "says"), [(empty_all_episodes, "no_episodes", "holds no episodes"), (empty_episode_1, "episode_length", "episode 1 of")])
def test_a_teleop_session_with_no_usable_episodes_is_quarantined_intact(instance, resources, home, storage, damage, rule, says):
    session = f"session-{rule.replace('_', '-')}"
    folder = small_dataset(home / "landing" / "teleop" / session)
    damage(folder)
    seal_drop(storage, "teleop", session, robot="arm-1", operator="alice", project="p")
    sent = snapshot(folder)

    assert not ingest_session(instance, resources, session).success

    report = quarantine_report(home, "teleop", session)
    assert report["stage"] == "validation"
    issue = next(i for i in report["issues"] if i["rule"] == rule)
    assert says in issue["message"] and session in issue["message"]
    assert snapshot(folder) == sent == snapshot(home / "quarantine" / "teleop" / session / "original")
    assert not (home / "curated" / "teleop" / session).exists(), "no training set is published from it"


# --- 2. the pool catalog ----------------------------------------------------------------------

POOL = """\
  {name}:
    provider: local
    region: local
    backend: local
    purchasing: on_demand
    accelerator: local
    gpus_per_node: 1
    price_per_gpu_hour: {price}
"""


def test_two_pools_with_one_name_are_an_error_naming_file_pool_and_both_lines(tmp_path):
    path = tmp_path / "pools.yaml"
    path.write_text("pools:\n" + POOL.format(name="steady", price=1.0) + POOL.format(name="burst", price=2.0) + POOL.format(name="steady", price=3.0))
    sent = path.read_bytes()
    for load in (load_pools, load_catalog):
        with pytest.raises(PoolCatalogError) as caught:
            load(path)
        message = str(caught.value)
        assert message.startswith(f"{path}: pool `steady` is defined twice (lines 2 and 18)")
        assert "Give each pool its own name, or delete one of them." in message
    assert path.read_bytes() == sent


def test_a_repeated_field_inside_a_pool_is_an_error_too(tmp_path):
    path = tmp_path / "pools.yaml"
    path.write_text("pools:\n" + POOL.format(name="steady", price=1.0) + "    price_per_gpu_hour: 9.0\n")
    with pytest.raises(PoolCatalogError, match=r"key `price_per_gpu_hour` appears twice under `pools.steady` \(lines 9 and 10\)"):
        load_pools(path)


# --- 3. the job file, through load_job and `sinewgrid plan` ---------------------------------

GOOD_JOB = """\
job: j
tenant: cell
start: 2026-12-07T00:00:00Z
steps:
  train: {gpus: 1, expected_hours: 2}
"""
JOB_FILE_CASES = {
    "empty": (b"", "the job file is empty"),
    "blank": (b"\n# only a comment\n", "the job file is empty"),
    "not-yaml": (b"job: [unclosed\ntenant: cell\n", "not valid YAML at line 2, column"),
    "a-list": (b"- job\n- tenant\n", "the job file holds a list, not a mapping"),
    "plain-text": (b"please plan my job\n", "the job file holds plain text, not a mapping"),
    "not-utf8": (b"\xff\xfejob: j\n", "not UTF-8 text (byte 0)"),
    "repeated-step": (GOOD_JOB.encode() + b"  train: {gpus: 2, expected_hours: 1}\n", "step `train` is defined twice (lines 5 and 6)"),
}
JOB_FILE_MUST_HOLD = "A job file is a YAML mapping with `job` (a name), `tenant`, `start` (a UTC time) and `steps`"


def job_file(tmp_path: Path, case: str) -> Path:
    if case == "missing":
        return tmp_path / "nowhere" / "job.yaml"
    if case == "a-folder":
        (tmp_path / "job.yaml").mkdir()
        return tmp_path / "job.yaml"
    path = tmp_path / "job.yaml"
    path.write_bytes(JOB_FILE_CASES[case][0])
    return path


EXPECTED_JOB_ERROR = {**{k: v[1] for k, v in JOB_FILE_CASES.items()}, "missing": "no such job file", "a-folder": "is a folder, not a job file"}


@pytest.mark.parametrize("case", sorted(EXPECTED_JOB_ERROR))
def test_an_unusable_job_file_names_the_path_and_what_a_job_file_holds(tmp_path, case):
    path = job_file(tmp_path, case)
    sent = path.read_bytes() if path.is_file() else None
    with pytest.raises(JobFileError) as caught:
        load_job(path)
    assert str(caught.value).startswith(f"{path}: {EXPECTED_JOB_ERROR[case]}")
    if case != "repeated-step":  # that one is a job file; the error says which entry to fix
        assert JOB_FILE_MUST_HOLD in str(caught.value)
    assert (path.read_bytes() if path.is_file() else None) == sent


@pytest.mark.parametrize("case", ["empty", "not-yaml", "missing", "not-utf8", "a-folder"])
def test_sinewgrid_plan_prints_the_job_file_error_without_a_traceback(tmp_path, case):
    from sinewgrid.cli import app

    path = job_file(tmp_path, case)
    result = CliRunner().invoke(app, ["plan", str(path), "--pools", str(REPO / "deploy" / "pools")])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    output = one_line(result.output)
    assert f"{path}: {EXPECTED_JOB_ERROR[case]}" in output and JOB_FILE_MUST_HOLD in output
    assert "Traceback" not in result.output


def test_sinewgrid_plan_prints_a_repeated_pool_cleanly(tmp_path):
    from sinewgrid.cli import app

    job = tmp_path / "job.yaml"
    job.write_text(GOOD_JOB)
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n" + POOL.format(name="steady", price=1.0) + POOL.format(name="steady", price=3.0))
    result = CliRunner().invoke(app, ["plan", str(job), "--pools", str(pools)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert f"{pools}: pool `steady` is defined twice (lines 2 and 10)" in one_line(result.output)
    assert "Traceback" not in result.output


# --- 4. launchpad configs out of range ------------------------------------------------------


@pytest.mark.parametrize(
    ("asset", "field", "value", "allowed"),
    [
        (foundation_model, "steps", 0, "it must be at least 1 (Optimiser steps)"),
        (foundation_model, "batch_size", 0, "it must be at least 1 (Cells per step)"),
        (foundation_model, "mask_fraction", 1.5, "it must be more than 0 and less than 1"),
        (finetuned_model, "folds", 1, "it must be at least 2"),
        (policy, "steps", 0, "it must be at least 1"),
    ],
)
def test_an_out_of_range_launchpad_setting_stops_the_run_naming_field_value_and_range(instance, resources, home, asset, field, value, allowed):
    op_name = "__".join(asset.key.path)
    result = dg.materialize([asset], instance=instance, resources=resources, run_config={"ops": {op_name: {"config": {field: value}}}}, raise_on_error=False)

    assert not result.success
    [failure] = result.get_step_failure_events()
    error = failure.step_failure_data.error
    text = error.cause.message if error.cause else error.message  # what the UI shows under the step
    assert f"{field} = {value} is out of range: {allowed}" in text
    assert "Set a value in that range." in text
    assert not [p for p in home.iterdir() if p.name != "dagster"], "a refused launch writes nothing under the storage root"
