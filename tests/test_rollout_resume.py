"""Rollout shards are preemption-safe: SIGTERM or SIGKILL at any moment, then a relaunch,
ends with exactly the episodes of an uninterrupted run — none lost, none twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from robotics_lane.episodes.shards import read_episode_file
from robotics_lane.workloads.rollout_output import committed_seeds
from shared_resources.runtime.workload import PREEMPTED_EXIT_CODE

REPO = Path(__file__).resolve().parent.parent
SEEDS = list(range(500, 530))
TASK = {"name": "cartpole", "max_steps": 200, "params": {"pole_mass_scale": 1.2}}


def _extras(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(
        json.dumps(
            {
                "config": {
                    "backend": "mujoco",
                    "seeds": SEEDS,
                    "output_uri": str(tmp_path / name),
                    "task": TASK,
                    "policy": {"kind": "scripted", "operator_noise": 0.2},
                },
                "checkpoint_uri": str(tmp_path / f"{name}-ck"),
                "checkpoint_every_steps": 1,
            }
        )
    )
    return path


def _launch(extras: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "robotics_lane.workloads.rollouts", "--extras", str(extras)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def _episodes(folder: Path) -> dict[int, tuple]:
    """seed -> (trial record, states, actions) for every committed episode."""
    out = {}
    for trial in sorted((folder / "trials").glob("seed-*.json")):
        record = json.loads(trial.read_text())
        episode = read_episode_file(record["episode_file"], ["balance the pole"])
        out[record["seed"]] = (
            {k: v for k, v in record.items() if k != "episode_file"},
            episode.observation_state.tobytes(),
            episode.action.tobytes(),
        )
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("reference")
    process = _launch(_extras(tmp, "reference"))
    assert process.wait(timeout=600) == 0, process.stderr.read().decode()[-2000:]
    episodes = _episodes(tmp / "reference")
    assert sorted(episodes) == SEEDS
    return episodes


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_interrupted_shard_resumes_to_exactly_the_same_episodes(tmp_path, uninterrupted, sig):
    extras = _extras(tmp_path, "shard")
    victim = _launch(extras)
    deadline = time.monotonic() + 300
    while len(committed_seeds(str(tmp_path / "shard"))) < 3:
        assert victim.poll() is None, victim.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(victim.pid, sig)
    code = victim.wait(timeout=60)
    assert code == (PREEMPTED_EXIT_CODE if sig == signal.SIGTERM else -signal.SIGKILL)
    partial = committed_seeds(str(tmp_path / "shard"))
    assert 3 <= len(partial) < len(SEEDS), "the interruption must land mid-shard"

    resumed = _launch(extras)
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read().decode()[-2000:]
    assert f"{len(partial)} already committed" in resumed.stderr.read().decode()
    assert _episodes(tmp_path / "shard") == uninterrupted
    # one file per episode, nothing twice
    assert len(list((tmp_path / "shard" / "episodes").glob("*.parquet"))) == len(SEEDS)


def test_trials_record_outcomes(uninterrupted):
    records = pd.DataFrame([v[0] for v in uninterrupted.values()])
    assert set(records.columns) >= {"seed", "success", "return", "length", "failure_mode", "task_key"}
    assert (records.loc[records["success"], "length"] == 200).all()
    assert records.loc[~records["success"], "failure_mode"].isin(["pole_fell", "cart_out_of_bounds"]).all()
