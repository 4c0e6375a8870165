"""Rollout shards are preemption-safe: SIGTERM or SIGKILL at any moment, then a relaunch,
ends with exactly the episodes of an uninterrupted run — none lost, none twice.

The shards are vectorised: the uninterrupted reference runs one env, the interrupted shard
four, its relaunch three, so the episodes must not depend on the env slot or the env count.
The interruption lands on an event, not a guess at the machine's speed: the shard is armed
with the `hold` failpoint, waits once its third episode is committed, and is signalled there
(with other episodes still running in the other envs). The shards render the front camera, as
the MuJoCo sweep does: the relaunch must also write the very same video files."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pandas as pd
import pytest

from robotics_lane.defs.assets.rollouts import sweep_imports
from robotics_lane.scenes.build import write_scene
from robotics_lane.scenes.catalog import SCENES
from robotics_lane.scenes.files import SceneFiles
from robotics_lane.workloads.rollout_output import committed_seeds
from tests.helpers import WorkloadProcess, committed_episodes
from workload_runtime.inputs import Failpoint
from workload_runtime.workload import PREEMPTED_EXIT_CODE

pytestmark = pytest.mark.e2e  # runs workloads end to end, in their own processes

ROLLOUTS = "robotics_lane.workloads.rollouts"
SEEDS = list(range(500, 512))  # 12: four envs to interrupt with three episodes committed, nine left for the relaunch
TASK = {"name": "cartpole", "max_steps": 200, "params": {"pole_mass_scale": 1.2}}
HELD_AT = 3  # episodes committed when the shard is interrupted


@pytest.fixture(scope="module")
def scene(tmp_path_factory) -> dict:
    """The MuJoCo scene as a shard gets it: its files on the store, named by their version."""
    source, uri = SCENES["cartpole-mujoco"], str(tmp_path_factory.mktemp("scenes") / SCENES["cartpole-mujoco"].version())
    files = write_scene(source, uri)
    return SceneFiles(ref=f"robotics/scenes@{source.version()}", uri=uri, entry=source.entry, files=files).model_dump()


def _extras(tmp_path: Path, name: str, num_envs: int, scene: dict, hold: Path | None = None) -> Path:
    """The shard's inputs; with `hold`, it waits once `HELD_AT` episodes are committed, and
    creates `hold` then, until it is signalled."""
    path = tmp_path / f"{name}.json"
    inputs = {
        "config": {
            "backend": "mujoco",
            "seeds": SEEDS,
            "output_uri": str(tmp_path / name),
            "task": TASK,
            "policy": {"kind": "scripted", "operator_noise": 0.2},
            "num_envs": num_envs,
            "cameras": ["front"],
            "scene": scene,
        },
        "checkpoint_uri": str(tmp_path / f"{name}-ck"),
        "checkpoint_every_steps": 1,
    }
    if hold is not None:
        inputs["failpoint"] = Failpoint(kind="hold", at_step=HELD_AT, marker=str(hold)).model_dump()
    path.write_text(json.dumps(inputs))
    return path


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, scene) -> dict:
    tmp = tmp_path_factory.mktemp("reference")
    reference = WorkloadProcess(ROLLOUTS, _extras(tmp, "reference", num_envs=1, scene=scene), "run", cold=True)  # by hand: a fresh interpreter
    assert reference.wait() == 0, reference.tail()
    episodes = committed_episodes(tmp / "reference")
    assert sorted(episodes) == SEEDS
    assert all(list(videos) == ["observation.images.front.mp4"] for *_, videos in episodes.values())
    return episodes


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_interrupted_shard_resumes_to_exactly_the_same_episodes(tmp_path, uninterrupted, scene, sig):
    held = tmp_path / "held.json"
    extras = _extras(tmp_path, "shard", num_envs=4, scene=scene, hold=held)
    victim = WorkloadProcess(ROLLOUTS, extras, "interrupted", cold=True)
    victim.wait_until_held(held)  # the third episode is committed and the shard waits
    os.kill(victim.process.pid, sig)
    code = victim.wait(timeout=60)
    assert code == (PREEMPTED_EXIT_CODE if sig == signal.SIGTERM else -signal.SIGKILL), victim.tail()
    partial = committed_seeds(str(tmp_path / "shard"))
    # Episodes commit in the order they end (a failing one ends early), so which three is not fixed.
    assert len(partial) == HELD_AT and partial <= set(SEEDS), "interrupted mid-shard, with exactly the episodes committed before it"
    assert "4 envs on cpu" in victim.log.read_text()

    extras = _extras(tmp_path, "shard", num_envs=3, scene=scene, hold=held)  # the marker exists: no hold this time
    resumed = WorkloadProcess(ROLLOUTS, extras, "resumed", imports=sweep_imports("mujoco"))
    assert resumed.wait() == 0, resumed.tail()
    assert f"{HELD_AT} already committed, {len(SEEDS) - HELD_AT} to run, 3 envs on cpu" in resumed.log.read_text()
    assert committed_episodes(tmp_path / "shard") == uninterrupted
    # one file per episode, nothing twice
    assert len(list((tmp_path / "shard" / "episodes").glob("*.parquet"))) == len(SEEDS)


def test_trials_record_outcomes(uninterrupted, scene):
    records = pd.DataFrame([v[0] for v in uninterrupted.values()])
    assert (records["scene_ref"] == scene["ref"]).all()  # every episode names the scene version it ran in
    assert set(records.columns) >= {"seed", "success", "return", "length", "failure_mode", "task_key"}
    assert (records.loc[records["success"], "length"] == 200).all()
    assert records.loc[~records["success"], "failure_mode"].isin(["pole_fell", "cart_out_of_bounds"]).all()
