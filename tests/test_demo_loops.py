"""Both loops on a local storage root, as the demo ran them: what a local folder holds, and reads back.

The lanes' end-to-end tests (tests/test_cell_graph.py, tests/test_robotics_graph.py) run each loop
on an S3 API root. The same loops on the embedded default — a local folder, the local machine as
the pool — are the session's demo run (tests/fixtures/demo.py: `sinewgrid demo --rounds 2`); this
module checks, on that run, what is particular to a local root: every result lies under the
folder (a lab's under its own), says `region: local`, reads its checkpoints from the folder itself
rather than through the node cache, and comes back through the registry and the run records.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

import anndata as ad
import dagster as dg
import pytest
from typer.testing import CliRunner

from cell_lane.omics import read_dataset as read_omics
from control_plane.settings import code_version
from data_layer.experiments import load_run
from data_layer.lineage import LineageStore
from data_layer.registry.registry import DataRegistry
from robotics_lane.episodes.lerobot_v3 import read_dataset as read_episodes
from robotics_lane.scenes.catalog import SCENES
from shared_resources.resources import StorageResource
from sinewgrid.cli import app
from tests.fixtures.demo import DemoRun
from workload_runtime.storage import glob_uris

pytestmark = pytest.mark.e2e  # reads the demo's run
LAB = "lab-a"


def _rounds(instance: dg.DagsterInstance, key: str, partition: str | None = None) -> list[dict]:
    """Each materialization's metadata of `key` (of one partition), oldest first."""
    records = instance.fetch_materializations(dg.AssetKey(key.split("/")), limit=20, ascending=True).records
    return [
        {k: getattr(v, "value", v) for k, v in r.asset_materialization.metadata.items()}
        for r in records if partition is None or r.partition_key == partition
    ]


@pytest.fixture
def demo(demo_run: DemoRun, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> DemoRun:
    """The demo's run, with this process on its storage root and holding its tenants' key files."""
    demo_run.require_success()
    for name, value in demo_run.env().items():
        if name.startswith(("SINEWGRID_", "DAGSTER_HOME")):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return demo_run


def test_a_labs_cell_loop_stays_under_its_local_folder_and_reads_back(demo: DemoRun, tmp_path: Path):
    home = str(demo.home)
    lab = StorageResource(root=home).for_tenant(LAB)  # the lab's own root, its key held here
    assert lab.root == posixpath.join(home, "tenants", LAB)
    with dg.DagsterInstance.from_config(str(demo.dagster_home)) as instance:
        datasets = _rounds(instance, "cell/omics_dataset", LAB)
        foundations = _rounds(instance, "cell/foundation_model", LAB)
        finetunes = _rounds(instance, "cell/finetuned_model", LAB)
        proposals = _rounds(instance, "cell/next_plate_proposal", LAB)
    assert [d["labelled_genes"] for d in datasets] == [76, 114, 152] and [d["drops"] for d in datasets] == [2, 3, 4]
    for dataset in datasets:
        assert dataset["path"].startswith(lab.root + "/") and dataset["region"] == "local"
    first = read_omics(datasets[0]["path"])  # sealed with the lab's key: opened with it
    assert first.n_obs == 700 and first.uns["sinewgrid"]["version"] == datasets[0]["version"]

    # Pretraining ran once, on the steady pool, from the folder; the later rounds reused its final
    # checkpoint, read from the folder itself: a local root needs no node cache.
    assert foundations[0]["pool"] == "cell-steady" and foundations[0]["final_loss"] < foundations[0]["first_loss"]
    assert foundations[0]["bytes_from_store"] > 0 and foundations[0]["bytes_from_node_cache"] == 0
    for later in foundations[1:]:
        assert later["reused_final_checkpoint"] is True and later["bytes_from_store"] > 0 and later["bytes_from_node_cache"] == 0
    assert glob_uris(posixpath.join(lab.uri("checkpoints"), "**", "manifest.json")), "the checkpoints are under the lab's folder"
    assert [f["pool"] for f in finetunes] == ["cell-burst"] * 3 and [f["n_assayed_genes"] for f in finetunes] == [76, 114, 152]
    # Each round charts the lab's rounds so far (its own runs only), with a row per round.
    assert [f["round"] for f in finetunes] == [1, 2, 3]
    latest = finetunes[-1]["rounds"]
    assert latest.startswith("![lab-a rounds](data:image/png;base64,") and "lab-b" not in latest
    rows = [line for line in latest.splitlines() if line.startswith("|") and line.split("|")[1].strip().isdigit()]
    assert [float(r.split("|")[3]) for r in rows] == pytest.approx([f["held_out_rmse"] for f in finetunes], abs=1e-4)
    assert all(p["worklist"].startswith(lab.root + "/outbox/plates/") for p in proposals)

    # Each curated version comes back byte for byte, opened with the lab's key, through the CLI.
    out = CliRunner().invoke(app, ["data", "get", "cell/omics", datasets[0]["version"], str(tmp_path / "omics-v1"), "--root", home, "--tenant", LAB])
    assert out.exit_code == 0, out.output
    back = ad.read_zarr(tmp_path / "omics-v1" / "dataset.zarr")
    assert back.uns["sinewgrid"]["version"] == datasets[0]["version"] and int((back.var["assay_n"] > 0).sum()) == 76
    assert [v.version for v in DataRegistry.for_root(lab.root).versions("cell/omics")] == [d["version"] for d in datasets]

    # The newest proposal traces back to every drop of the lab, the lab's answers included, and
    # the run records of its pretraining hold the loss curve of every step.
    drops = {n.id for n in LineageStore(lab.root).upstream(proposals[-1]["lineage_id"], kind="drop")}
    assert {"drop/assays/seed-plate-001", "drop/assays/seed-plate-002"} < drops and len(drops) == 4
    assert "drop/assays/seed-plate-bad-export" not in drops
    run = load_run(lab.root, foundations[0]["run"])
    assert run.datasets == [datasets[0]["dataset_ref"]] and len(run.curve("loss")) == foundations[0]["steps"]


def test_the_robotics_loop_stays_under_the_local_folder_and_reads_back(demo: DemoRun, tmp_path: Path):
    home = str(demo.home)
    with dg.DagsterInstance.from_config(str(demo.dagster_home)) as instance:
        sweeps = _rounds(instance, "robotics/sim_rollouts")
        policies = _rounds(instance, "robotics/policy")
        real = _rounds(instance, "robotics/real_robot_evaluation")
    mujoco = [s for s in sweeps if "cartpole-mujoco" in s["dataset_ref"]][-1]  # the newest night's
    assert mujoco["dataset"].startswith(home + "/rollouts/") and mujoco["region"] == "local" and mujoco["pools"] == "robot-sim-spot"
    info, episodes = read_episodes(mujoco["dataset"])
    assert info.total_episodes == mujoco["episodes"] == len(episodes)

    # The rollouts come back from the registry as the same LeRobot dataset, the scene as its file.
    registry = DataRegistry.for_root(home)
    registry.get("robotics/rollouts", mujoco["dataset_ref"].split("@", 1)[1], str(tmp_path / "rollouts"))
    back, back_episodes = read_episodes(str(tmp_path / "rollouts"))
    assert back.total_episodes == info.total_episodes and [e.metadata["seed"] for e in back_episodes] == [e.metadata["seed"] for e in episodes]
    scene_ref = f"robotics/scenes@{SCENES['cartpole-mujoco'].version()}"
    assert mujoco["scene_ref"] == scene_ref
    registry.get("robotics/scenes", scene_ref.split("@")[1], str(tmp_path / "scene"))
    assert (tmp_path / "scene" / "cartpole.xml").read_bytes() == (SCENES["cartpole-mujoco"].folder / "cartpole.xml").read_bytes()

    # The newest real-robot evaluation traces back to its policy, the code, the sessions (the
    # corrective ones included) and the robot cell's results; the run records hold both evaluations.
    newest, policy = real[-1], policies[-1]
    upstream = {n.id: n for n in LineageStore(home).upstream(newest["lineage_id"])}
    assert policy["run"] in upstream and upstream[policy["run"]].code_version == code_version()
    first_eval, second_eval = (f"eval-{p['run'].rsplit('/', 1)[1]}" for p in policies)
    sessions = {"teleop-session-001", "teleop-session-002", f"relabel-{first_eval}"}  # the glitched one is in quarantine
    drops = {n.id for n in LineageStore(home).upstream(newest["lineage_id"], kind="drop")}
    assert drops == {f"drop/teleop/{s}" for s in sessions} | {f"drop/robot_eval/{first_eval}", f"drop/robot_eval/{second_eval}"}
    run = load_run(home, policy["run"])
    teleop = {d for d in run.datasets if d.startswith("robotics/teleop@")}
    assert teleop == {f"robotics/teleop@{s}" for s in sessions}
    assert mujoco["dataset_ref"] in run.datasets and set(run.datasets) - teleop <= {s["dataset_ref"] for s in sweeps}
    assert set(run.evaluations) == {"sim-mujoco", "real"} and run.evaluations["real"]["real_success_rate"] == newest["real_success_rate"]
