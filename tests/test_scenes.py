"""Scenes are dataset versions beside the episodes: content-hashed, registered, loaded byte for
byte, named by every sweep partition, and in the lineage of every result made in them."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
from typer.testing import CliRunner

import robotics_lane.scenes.catalog as catalog
from control_plane.settings import REPO_ROOT
from data_layer.lineage import LineageStore
from data_layer.provenance import publish_version, record_result
from data_layer.registry.registry import DataRegistry
from robotics_lane.defs.assets.rollouts import scene_for_run
from robotics_lane.defs.partitions import nightly_sweeps, sweep_of, sweep_partition_keys
from robotics_lane.scenes.build import GENERATORS, scene_bytes
from robotics_lane.scenes.catalog import SCENES, SceneError, content_hash, scene_for, split_sweep_key, sweep_key
from robotics_lane.scenes.files import SceneFiles, local_scene
from robotics_lane.scenes.registration import register_scene, registered_scene, resolve_scene, scenes_upstream
from robotics_lane.sim.base import TaskSpec
from robotics_lane.sim.factory import make_vector_simulator
from robotics_lane.sweeps import SWEEPS, SweepConfig
from robotics_lane.workloads.config import RolloutConfig
from sinewgrid.cli import app

ISAACLAB_PYTHON = REPO_ROOT / ".venv-isaaclab" / "bin" / "python"
MUJOCO = SCENES["cartpole-mujoco"]


@pytest.fixture
def editable_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the committed scene sources that a test may edit, as a user edits the checkout."""
    sources = tmp_path / "sources"
    shutil.copytree(catalog.SOURCES, sources)
    monkeypatch.setattr(catalog, "SOURCES", sources)
    return sources


def _heavier_motor(sources: Path) -> None:
    xml = sources / "cartpole-mujoco" / "cartpole.xml"
    text = xml.read_text()
    assert text.count('gear="100"') == 1
    xml.write_text(text.replace('gear="100"', 'gear="80"'))


def test_a_scene_version_is_its_content_hash():
    files = MUJOCO.files()
    assert files == {"cartpole.xml": hashlib.sha256((catalog.SOURCES / "cartpole-mujoco" / "cartpole.xml").read_bytes()).hexdigest()}
    assert MUJOCO.version() == f"cartpole-mujoco-{content_hash(files)[:8]}"
    assert content_hash({"a": "1", "b": "2"}) == content_hash({"b": "2", "a": "1"}) != content_hash({"a": "1", "b": "3"})
    # The generated USD's version comes from its pins: known without the `newton` package.
    assert SCENES["cartpole-isaaclab"].version() == f"cartpole-isaaclab-{content_hash(SCENES['cartpole-isaaclab'].pinned)[:8]}"


def test_every_sweep_partition_names_its_scene_version():
    keys = sweep_partition_keys()
    assert sorted(nightly_sweeps.get_partitions_def_for_dimension("sweep").get_partition_keys()) == keys
    assert len(keys) == len(SWEEPS)
    for key in keys:
        name, version = sweep_of(key)
        sweep = SWEEPS[name]
        assert version == scene_for(sweep.backend, sweep.scene).version() and key == sweep_key(name, version)
    assert sweep_of(sweep_key("cartpole-mujoco-randomized", MUJOCO.version())) == ("cartpole-mujoco-randomized", MUJOCO.version())


def test_bad_scene_names_are_refused_with_what_to_do():
    with pytest.raises(SceneError, match="unknown scene 'nope'.*cartpole-mujoco"):
        scene_for("mujoco", "nope")
    with pytest.raises(SceneError, match="backend 'isaaclab' cannot load it"):
        scene_for("isaaclab", "cartpole-mujoco")
    with pytest.raises(SceneError, match="names no scene version"):
        split_sweep_key("cartpole-mujoco-randomized")
    with pytest.raises(ValueError, match="hash to"):
        SceneFiles(ref=f"robotics/scenes@{MUJOCO.version()}", uri="/x", entry="cartpole.xml", files={"cartpole.xml": "0" * 64})


def test_changing_a_scene_makes_a_new_version_and_partition_and_keeps_the_old(editable_sources, storage, tmp_path):
    before_version, before_keys = MUJOCO.version(), sweep_partition_keys()
    first = register_scene(storage, MUJOCO)
    assert first.ref == f"robotics/scenes@{before_version}"
    assert register_scene(storage, MUJOCO) == first  # the same content again: nothing new

    _heavier_motor(editable_sources)
    after_version, after_keys = MUJOCO.version(), sweep_partition_keys()
    assert after_version != before_version
    changed = [k for k in after_keys if k not in before_keys]
    assert [split_sweep_key(k)[0] for k in changed] == ["cartpole-mujoco-randomized"]  # only the sweep in that scene
    assert "cartpole-isaaclab" in {split_sweep_key(k)[0] for k in set(after_keys) & set(before_keys)}
    second = resolve_scene(storage, after_version)  # the new version is registered on first use

    registry = DataRegistry.for_root(storage.root)
    assert sorted(v.version for v in registry.versions("robotics/scenes")) == sorted([before_version, after_version])  # both kept
    registry.get("robotics/scenes", before_version, str(tmp_path / "old"))
    assert b'gear="100"' in (tmp_path / "old" / "cartpole.xml").read_bytes()  # the old scene, byte for byte
    assert resolve_scene(storage, before_version) == first  # still runnable: its bytes are registered
    assert second.files != first.files
    with pytest.raises(SceneError, match="not registered, and the catalog's 'cartpole-mujoco' is now"):
        resolve_scene(storage, "cartpole-mujoco-0badc0de")


def test_a_sweep_that_pins_a_scene_version_keeps_running_it_after_the_scene_changes(editable_sources, storage, monkeypatch):
    pinned = register_scene(storage, MUJOCO).version
    _heavier_motor(editable_sources)
    assert MUJOCO.version() != pinned
    monkeypatch.setitem(SWEEPS, "nominal-motor", SweepConfig(backend="mujoco", scene=pinned, description="the motor as first registered"))
    monkeypatch.setitem(SWEEPS, "current-motor", SweepConfig(backend="mujoco", scene="cartpole-mujoco", description="the scene as it is now"))
    keys = sweep_partition_keys()
    assert sweep_key("nominal-motor", pinned) in keys and sweep_key("current-motor", MUJOCO.version()) in keys
    name, version = sweep_of(sweep_key("nominal-motor", pinned))
    assert (name, version) == ("nominal-motor", pinned)
    scene = resolve_scene(storage, version)
    assert b'gear="100"' in local_scene(scene).read_bytes()  # the pinned bytes, not the edited checkout's
    # A pin the registry has never seen cannot be made any more: refused with what to do.
    with pytest.raises(SceneError, match=r"must pin a registered version \(`sinewgrid data list robotics/scenes`\)"):
        resolve_scene(storage, "cartpole-mujoco-0badc0de")
    monkeypatch.setitem(SWEEPS, "wrong-simulator", SweepConfig(backend="isaaclab", scene=pinned, description="x"))
    with pytest.raises(SceneError, match="backend 'isaaclab' cannot load it"):
        sweep_partition_keys()


def test_the_simulator_loads_exactly_the_registered_bytes(editable_sources, storage):
    nominal = register_scene(storage, MUJOCO)
    _heavier_motor(editable_sources)
    weaker = register_scene(storage, MUJOCO)
    gears = {}
    for scene in (nominal, weaker):
        with make_vector_simulator("mujoco", TaskSpec(), num_envs=1, scene=local_scene(scene)) as sim:
            gears[scene.version] = float(sim.models[0].actuator_gear[0, 0])
    assert gears == {nominal.version: 100.0, weaker.version: 80.0}


def test_a_scene_changed_on_the_store_after_registration_is_refused(storage, tmp_path, monkeypatch):
    scene = register_scene(storage, MUJOCO)
    monkeypatch.setenv("SINEWGRID_SCENE_CACHE", str(tmp_path / "node-cache"))
    local = local_scene(scene)
    assert local.read_bytes() == (catalog.SOURCES / "cartpole-mujoco" / "cartpole.xml").read_bytes()
    stored = Path(scene.uri) / "cartpole.xml"
    stored.write_bytes(stored.read_bytes().replace(b'gear="100"', b'gear="90"'))
    assert local_scene(scene) == local  # the node's verified copy: the store is not read again
    shutil.rmtree(tmp_path / "node-cache")
    with pytest.raises(SceneError, match="changed after registration"):
        local_scene(scene)
    with pytest.raises(SceneError, match="changed after registration"):
        registered_scene(storage, scene.version)


def test_a_generator_that_makes_other_bytes_is_refused_by_name(monkeypatch):
    monkeypatch.setitem(GENERATORS, "cartpole-isaaclab", (lambda: {"cartpole.usda": b"#usda 1.0\n"}, "json"))
    with pytest.raises(SceneError, match=r"now makes other files than the catalog pins.*set `pinned`"):
        scene_bytes(SCENES["cartpole-isaaclab"])


def test_the_rollout_config_carries_the_scene(storage):
    scene = register_scene(storage, MUJOCO)
    config = RolloutConfig(backend="mujoco", seeds=[1], output_uri="/tmp/x", scene=scene)
    assert RolloutConfig.model_validate(json.loads(config.model_dump_json())).scene == scene


def test_lineage_of_a_real_robot_evaluation_names_the_scene(storage, tmp_path):
    """The chain as the assets write it, with the real registry and lineage store, read by the CLI."""
    scene = register_scene(storage, MUJOCO)
    episodes = tmp_path / "rollouts"
    episodes.mkdir()
    (episodes / "data.parquet").write_bytes(b"stand-in for episodes")
    rollouts, _ = publish_version(storage, "robotics/rollouts", "2026-11-20_cartpole-mujoco-randomized." + scene.version[-8:], str(episodes),
                                  title="simulated demonstrations", inputs=[scene.ref], facts={"scene_ref": scene.ref})
    record_result(storage, "robotics/policy/abc123", "model", "policy", inputs=[rollouts.ref])
    record_result(storage, "robotics/real_robot_evaluation/eval-abc123", "evaluation", "real trials", inputs=["robotics/policy/abc123"])
    assert scenes_upstream(storage, "robotics/policy/abc123") == [scene.ref]
    assert scenes_upstream(storage, "robotics/real_robot_evaluation/eval-abc123") == [scene.ref]

    out = CliRunner().invoke(app, ["lineage", "robotics/real_robot_evaluation/eval-abc123", "--root", storage.root])
    assert out.exit_code == 0, out.output
    assert scene.ref in out.output and "content_sha256" in out.output
    listed = CliRunner().invoke(app, ["data", "list", "robotics/scenes", "--root", storage.root])
    assert listed.exit_code == 0 and scene.version in listed.output
    assert LineageStore(storage.root).get(scene.ref).facts["origin"].startswith("robotics_lane/scenes/sources/cartpole-mujoco")


@pytest.mark.e2e
def test_newton_makes_exactly_the_pinned_isaaclab_scene():
    if not ISAACLAB_PYTHON.exists():
        pytest.fail(f"{ISAACLAB_PYTHON} is missing: build the Isaac Lab runtime with `make isaaclab-runtime`")
    code = ("import hashlib, json; from robotics_lane.scenes.build import scene_bytes; from robotics_lane.scenes.catalog import SCENES; "
            "print(json.dumps({k: hashlib.sha256(v).hexdigest() for k, v in scene_bytes(SCENES['cartpole-isaaclab']).items()}))")
    made = subprocess.run([str(ISAACLAB_PYTHON), "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert json.loads(made.stdout.splitlines()[-1]) == SCENES["cartpole-isaaclab"].pinned


@pytest.mark.e2e
def test_a_generated_scene_is_built_in_its_runtime_and_registered(instance, resources, storage):
    """The Isaac Lab USD is made by a step in the Isaac Lab runtime (newton is not in this venv)."""
    source = SCENES["cartpole-isaaclab"]

    @dg.asset(required_resource_keys={"compute"})
    def needs_isaaclab_scene(context):
        scene = scene_for_run(context, context.resources.compute, storage, source.version(), "isaaclab")
        return dg.MaterializeResult(metadata={"scene": json.dumps(scene.model_dump())})

    result = dg.materialize([needs_isaaclab_scene], instance=instance, resources=resources)
    scene = SceneFiles.model_validate(json.loads(result.asset_materializations_for_node("needs_isaaclab_scene")[0].metadata["scene"].value))
    assert scene.ref == f"robotics/scenes@{source.version()}" and scene.files == source.pinned
    text = local_scene(scene).read_text()
    assert 'defaultPrim = "cartpole"' in text and np.isclose(float(text.split("physics:mass = ")[1].split()[0]), 1.0)
    assert DataRegistry.for_root(storage.root).find("robotics/scenes", source.version()).meta["content_sha256"] == content_hash(source.pinned)
