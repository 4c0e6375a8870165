"""Exactly-once on Isaac Lab too: a rollout shard on the Isaac Lab backend, signalled (SIGTERM or
SIGKILL) and relaunched, ends with exactly the episodes of an uninterrupted run — none lost,
none twice, the same states, actions and front-camera videos bit for bit.

The shards run as the platform runs an Isaac Lab shard: `robotics_lane.workloads.rollouts` under
the Isaac Lab runtime's own interpreter (`.venv-isaaclab/bin/python`, the `isaaclab` runtime of
a local pool): the interrupted shards and their relaunches forked warm with the sweep's imports
(`sweep_imports("isaaclab")`), as a local pool starts them, the reference started cold, as a
person runs it by hand. One warm interpreter serves all four forks, where each cold start paid
Isaac Lab's imports again.
Isaac Lab's episodes on the CPU depend on their seed only, not on the env slot or the env count
(each env at the same origin, see `isaaclab_backend.py`): the reference runs one env, the
interrupted shard four, its relaunch three. The task is made hard enough (strong operator noise,
heavier gravity) that episodes end at different steps, by failing or at `max_steps`, so envs
take new seeds at different times. The interruption lands on an event: the shard is armed with
the `hold` failpoint and signalled once it waits there, its third episode committed.

The shards film the sweep's `front` camera (Newton's Warp ray tracer, `isaaclab_camera.py`), as
the demo's `cartpole-isaaclab` sweep does; the reference's episodes assemble into a LeRobot v3
dataset that validates, with the camera's video.

Each Isaac Lab start costs ~12 s warm (~45 s with Warp's kernel cache cold): few seeds, short
episodes, one reference per module."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from control_plane.compute.backends.warm_start import start_process
from control_plane.settings import REPO_ROOT, child_env
from robotics_lane.defs.assets.rollouts import sweep_imports
from robotics_lane.episodes import assemble_dataset, read_dataset, validate_dataset
from robotics_lane.scenes.catalog import SCENES
from robotics_lane.scenes.files import SceneFiles
from robotics_lane.sim.base import ACTION_NAMES, STATE_NAMES
from robotics_lane.sim.camera import feature_name, image_shape
from robotics_lane.workloads.rollout_output import committed_seeds
from tests.helpers import WorkloadProcess, committed_episodes
from workload_runtime.inputs import Failpoint
from workload_runtime.workload import PREEMPTED_EXIT_CODE

pytestmark = pytest.mark.e2e  # runs workloads end to end, in their own processes

ISAACLAB_PYTHON = REPO_ROOT / ".venv-isaaclab" / "bin" / "python"
ROLLOUTS = "robotics_lane.workloads.rollouts"
SEEDS = list(range(500, 508))
MAX_STEPS = 100
# Noise and gravity make 5 of the 8 episodes fail (pole fell, cart out of bounds) at different steps.
TASK = {"name": "cartpole", "max_steps": MAX_STEPS, "params": {"pole_mass_scale": 1.2, "gravity_scale": 1.5}}
POLICY = {"kind": "scripted", "operator_noise": 2.0}
HELD_AT = 3  # episodes committed when the shard is interrupted


class IsaacLabShard(WorkloadProcess):
    """A rollout shard run by the Isaac Lab runtime's interpreter, as a local pool runs a step of
    the `isaaclab` runtime: forked from a warm interpreter of that runtime with `imports` loaded,
    or (`cold=True`) a fresh interpreter, as a person running it by hand does."""

    def __init__(self, extras: Path, label: str, *, cold: bool = False):
        self.log = extras.with_name(f"{extras.stem}-{label}.log")
        command = [str(ISAACLAB_PYTHON), "-m", ROLLOUTS, "--extras", str(extras)]
        with self.log.open("ab") as out:
            if cold:
                self.process = subprocess.Popen(command, cwd=REPO_ROOT, env=child_env(), stdout=out, stderr=out)
            else:
                self.process = start_process(command, env=child_env(), cwd=str(REPO_ROOT), output=out, imports=sweep_imports("isaaclab"))


@pytest.fixture(scope="module", autouse=True)
def isaaclab_runtime() -> None:
    if not ISAACLAB_PYTHON.exists():
        pytest.fail(
            f"{ISAACLAB_PYTHON} is missing: the Isaac Lab runtime is not built. "
            "Run `make isaaclab-runtime` (Python 3.12, ~3 minutes, ~8 GB) and rerun the tests."
        )


@pytest.fixture(scope="module")
def scene(tmp_path_factory, isaaclab_runtime) -> dict:
    """The Isaac Lab scene as a shard gets it: made from newton in its runtime, its files on the store."""
    source = SCENES["cartpole-isaaclab"]
    uri = str(tmp_path_factory.mktemp("scenes") / source.version())
    code = f"from robotics_lane.scenes.build import write_scene; from robotics_lane.scenes.catalog import SCENES; write_scene(SCENES[{source.name!r}], {uri!r})"
    subprocess.run([str(ISAACLAB_PYTHON), "-c", code], cwd=REPO_ROOT, env=child_env(), check=True)
    return SceneFiles(ref=f"robotics/scenes@{source.version()}", uri=uri, entry=source.entry, files=source.pinned).model_dump()


def _extras(tmp_path: Path, name: str, num_envs: int, scene: dict, hold: Path | None = None) -> Path:
    """The shard's inputs; with `hold`, it waits once `HELD_AT` episodes are committed, and
    creates `hold` then, until it is signalled."""
    path = tmp_path / f"{name}.json"
    inputs = {
        "config": {
            "backend": "isaaclab",
            "device": "cpu",  # bit-for-bit across env counts is what was verified, on the CPU
            "seeds": SEEDS,
            "output_uri": str(tmp_path / name),
            "task": TASK,
            "policy": POLICY,
            "num_envs": num_envs,
            "scene": scene,
            "cameras": ["front"],
        },
        "checkpoint_uri": str(tmp_path / f"{name}-ck"),
        "checkpoint_every_steps": 1,
    }
    if hold is not None:
        inputs["failpoint"] = Failpoint(kind="hold", at_step=HELD_AT, marker=str(hold)).model_dump()
    path.write_text(json.dumps(inputs))
    return path


@pytest.fixture(scope="module")
def reference_output(tmp_path_factory, scene) -> Path:
    """The output folder of an uninterrupted shard (one env)."""
    tmp = tmp_path_factory.mktemp("reference")
    reference = IsaacLabShard(_extras(tmp, "reference", num_envs=1, scene=scene), "run", cold=True)  # by hand: a fresh interpreter
    assert reference.wait() == 0, reference.tail()
    assert "1 envs on cpu, cameras ['front']" in reference.log.read_text()
    return tmp / "reference"


@pytest.fixture(scope="module")
def uninterrupted(reference_output) -> dict:
    episodes = committed_episodes(reference_output)
    assert sorted(episodes) == SEEDS
    assert all(list(videos) == ["observation.images.front.mp4"] for *_, videos in episodes.values())
    return episodes


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_interrupted_isaaclab_shard_resumes_to_exactly_the_same_episodes(tmp_path, uninterrupted, scene, sig):
    held = tmp_path / "held.json"
    extras = _extras(tmp_path, "shard", num_envs=4, scene=scene, hold=held)
    victim = IsaacLabShard(extras, "interrupted")  # forked warm, as a local pool starts it (the reference ran cold)
    victim.wait_until_held(held)  # the third episode is committed and the shard waits
    os.kill(victim.process.pid, sig)
    code = victim.wait(timeout=60)
    assert code == (PREEMPTED_EXIT_CODE if sig == signal.SIGTERM else -signal.SIGKILL), victim.tail()
    partial = committed_seeds(str(tmp_path / "shard"))
    # Episodes commit in the order they end (a failing one ends early), so which three is not fixed.
    assert len(partial) == HELD_AT and partial <= set(SEEDS), "interrupted mid-shard, with exactly the episodes committed before it"
    assert "isaaclab cartpole rollouts" in victim.log.read_text() and "4 envs on cpu, cameras ['front']" in victim.log.read_text()

    extras = _extras(tmp_path, "shard", num_envs=3, scene=scene, hold=held)  # the marker exists: no hold this time
    resumed = IsaacLabShard(extras, "resumed")
    assert resumed.wait() == 0, resumed.tail()
    assert f"{HELD_AT} already committed, {len(SEEDS) - HELD_AT} to run, 3 envs on cpu" in resumed.log.read_text()
    assert committed_episodes(tmp_path / "shard") == uninterrupted
    # one file per episode, nothing twice
    assert len(list((tmp_path / "shard" / "episodes").glob("*.parquet"))) == len(SEEDS)


def test_isaaclab_trials_record_outcomes(uninterrupted, scene):
    records = pd.DataFrame([v[0] for v in uninterrupted.values()])
    assert (records["scene_ref"] == scene["ref"]).all()  # every episode names the scene version it ran in
    assert set(records.columns) >= {"seed", "success", "return", "length", "failure_mode", "task_key"}
    assert (records["backend"] == "isaaclab").all() and (records["fps"] == 60).all()
    assert (records.loc[records["success"], "length"] == MAX_STEPS).all()
    assert records.loc[~records["success"], "failure_mode"].isin(["pole_fell", "cart_out_of_bounds"]).all()
    # Both kinds of episode ending, so envs take new seeds at different steps in the shards above.
    assert records["success"].any() and not records["success"].all()


def test_isaaclab_episodes_with_the_camera_assemble_into_a_valid_lerobot_dataset(reference_output, tmp_path):
    records = [json.loads(trial.read_text()) for trial in sorted((reference_output / "trials").glob("seed-*.json"))]
    dataset = str(tmp_path / "dataset")
    assemble_dataset(dataset, [r["episode_file"] for r in records], tasks=["balance the pole"], fps=records[0]["fps"],
                     robot_type="cartpole", state_names=STATE_NAMES, action_names=ACTION_NAMES)
    assert validate_dataset(dataset, expected_state_dim=len(STATE_NAMES), expected_action_dim=len(ACTION_NAMES))[1] == []
    _, episodes = read_dataset(dataset, decode_images=True)
    assert sorted(e.metadata["seed"] for e in episodes) == SEEDS
    for episode in episodes:
        frames = episode.images[feature_name("front")]
        assert frames.shape == (episode.length, *image_shape("front"))
        assert len({frame.tobytes() for frame in frames}) > 1  # the video shows the cart-pole moving
