"""Simulated cameras: MuJoCo renders what a fixed front camera sees, offscreen through EGL on the CPU.

Real rendering (Mesa's llvmpipe here), real episodes; nothing mocked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pydantic
import pytest

from control_plane.settings import REPO_ROOT, child_env
from robotics_lane.episodes.lerobot_v3 import read_dataset
from robotics_lane.episodes.shards import assemble_dataset
from robotics_lane.episodes.validation import validate_dataset
from robotics_lane.sim import ACTION_NAMES, STATE_NAMES, BalancingController, NoisyOperator, TaskSpec, make_simulator, run_episode
from robotics_lane.sim.batch_rollout import run_episodes
from robotics_lane.sim.camera import CAMERAS, feature_name, image_shape
from robotics_lane.sim.controllers import ScriptedOperator
from robotics_lane.sim.factory import make_vector_simulator
from robotics_lane.standins.teleop_operator import TeleopOperatorStandIn
from robotics_lane.workloads.config import RolloutConfig
from tests.helpers import WorkloadProcess

FRONT = image_shape("front")
TASK = TaskSpec(max_steps=60, params={"observation_noise": 0.01})


def cart_columns(frames: np.ndarray) -> np.ndarray:
    """The image column of the cart's centre in each frame: the mean column of its yellow pixels."""
    r, g, b = (frames[..., i].astype(int) for i in range(3))
    cart = (r > 80) & (g > 80) & (b < 40)  # the cart is rgba(0.7, 0.7, 0); the rail is blue, the pole cyan
    assert cart.any(axis=(1, 2)).all(), "the cart is out of view in some frames"
    columns = np.arange(frames.shape[2])
    return (cart.sum(axis=1) * columns).sum(axis=1) / cart.sum(axis=(1, 2))


def drive(seed: int, cameras=("front",), task=TASK):
    with make_simulator("mujoco", task, cameras=cameras) as sim:
        return run_episode(sim, NoisyOperator(BalancingController(), 0.3, seed), seed)


def test_an_episode_records_one_front_frame_per_step_of_the_shape_asked():
    episode = drive(5)
    frames = episode.images["front"]
    assert frames.shape == (episode.length, *FRONT) and frames.dtype == np.uint8
    assert FRONT == (CAMERAS["front"].height, CAMERAS["front"].width, 3) == (96, 128, 3)
    assert feature_name("front") == "observation.images.front"


def test_the_cart_seen_by_the_camera_follows_cart_position():
    # Balance towards a target past the rail's end: the cart travels to the end stop, pole up.
    with make_simulator("mujoco", TaskSpec(max_steps=200), cameras=("front",)) as sim:
        episode = run_episode(sim, BalancingController(target_position=2.0), seed=1)
    assert episode.failure_mode == "cart_out_of_bounds"
    positions = episode.observations[:, 0]
    assert np.ptp(positions) > 0.8, "the cart should have travelled most of the rail"
    columns = cart_columns(episode.images["front"])
    slope, intercept = np.polyfit(positions, columns, 1)
    residual = columns - (slope * positions + intercept)
    assert slope > 20  # pixels per metre, cart to the right of the image as cart_position grows
    assert np.abs(residual).max() < 2.0  # the cart's column is where its position says, frame by frame
    assert abs(intercept - (FRONT[1] - 1) / 2) < 2.0  # cart_position 0 is the image's centre


def test_frames_are_deterministic_for_a_seed_and_differ_between_seeds():
    first, again, other = drive(11), drive(11), drive(12)
    assert np.array_equal(first.images["front"], again.images["front"])
    assert not np.array_equal(first.images["front"][:20], other.images["front"][:20])
    # The frames change as the cart-pole moves (a noisy operator never holds it still).
    assert len({frame.tobytes() for frame in first.images["front"]}) > first.length // 2


def test_rendering_leaves_the_physics_unchanged():
    with_camera, without = drive(7), drive(7, cameras=())
    assert without.images == {}
    assert np.array_equal(with_camera.observations, without.observations)
    assert np.array_equal(with_camera.actions, without.actions)


def test_vectorised_frames_depend_only_on_the_seed_not_on_env_slot_or_count():
    seeds = [3, 8, 5, 13, 21]

    def rollout(num_envs: int, order: list[int]) -> dict:
        with make_vector_simulator("mujoco", TASK, num_envs=num_envs, cameras=("front",)) as sim:
            policy = ScriptedOperator(BalancingController(), 0.3, num_envs, TASK.max_steps)
            return {e.seed: e for e in run_episodes(sim, policy, order)}

    one, three = rollout(1, seeds), rollout(3, list(reversed(seeds)))
    for seed in seeds:
        assert one[seed].images["front"].shape == (one[seed].length, *FRONT)
        assert np.array_equal(one[seed].images["front"], three[seed].images["front"])
    # The one-env simulator of the stand-ins sees what a slot of the vectorised one sees.
    single = drive(3)
    assert np.array_equal(single.actions, one[3].actions)
    assert np.array_equal(single.images["front"], one[3].images["front"])


def test_cameras_are_refused_clearly_where_they_cannot_be():
    with pytest.raises(ValueError, match=r"unknown camera\(s\) \['top'\]; known cameras: \['front'\]"):
        make_simulator("mujoco", TASK, cameras=("top",))
    with pytest.raises(ValueError, match="unknown backend 'bullet'"):
        make_vector_simulator("bullet", TASK, num_envs=1, cameras=("front",))
    base = {"backend": "mujoco", "seeds": [1], "output_uri": "/tmp/x"}
    assert RolloutConfig(**base).cameras == []
    assert RolloutConfig(**base, cameras=["front"]).cameras == ["front"]
    with pytest.raises(pydantic.ValidationError, match="unknown camera"):
        RolloutConfig(**base, cameras=["side"])
    # Isaac Lab renders them too (tests/test_isaaclab_cameras.py).
    assert RolloutConfig(**{**base, "backend": "isaaclab"}, cameras=["front"]).cameras == ["front"]


def test_a_broken_egl_setup_says_what_to_install():
    # PyOpenGL told to use another platform: EGL cannot start, as on a machine without Mesa's EGL.
    code = (
        "from robotics_lane.sim import make_simulator\n"
        "make_simulator('mujoco', cameras=('front',))\n"
    )
    env = child_env({"PYOPENGL_PLATFORM": "osmesa"})
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=120)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "OffscreenRenderingUnavailable" in last
    assert "apt-get install -y --no-install-recommends libegl1 libegl-mesa0 libgl1-mesa-dri" in last
    assert "PYOPENGL_PLATFORM" in last


def test_the_teleop_stand_in_records_a_front_camera_that_validates(storage):
    session = TeleopOperatorStandIn(storage).record_sessions(sessions=1, episodes=2, include_bad=False)[0]
    folder = storage.landing("teleop", session)
    info, issues = validate_dataset(folder, expected_state_dim=len(STATE_NAMES), expected_action_dim=len(ACTION_NAMES))
    assert issues == []
    feature = json.loads(Path(folder, "meta", "info.json").read_text())["features"][feature_name("front")]
    assert feature["dtype"] == "video" and feature["shape"] == list(FRONT)
    _, episodes = read_dataset(folder, decode_images=True)
    assert [e.metadata["seed"] for e in episodes] == [1000, 1001]
    frames = episodes[0].images[feature_name("front")]
    assert frames.shape == (episodes[0].length, *FRONT)
    # Decoded (AV1 is lossy), the video still shows the cart where the recorded state puts it.
    with make_simulator("mujoco", TaskSpec(max_steps=200), cameras=("front",)) as sim:
        recorded = run_episode(sim, NoisyOperator(BalancingController(), 0.1, 1000), 1000)
    assert np.array_equal(recorded.observations, episodes[0].observation_state)
    assert np.abs(cart_columns(frames) - cart_columns(recorded.images["front"])).max() < 1.5


@pytest.mark.e2e  # the rollout workload, in its own process
def test_a_sweep_shard_with_cameras_assembles_into_a_dataset_with_video(tmp_path):
    seeds = [41, 42, 43]
    config = {"backend": "mujoco", "seeds": seeds, "output_uri": str(tmp_path / "shard"), "num_envs": 2, "cameras": ["front"],
              "task": {"name": "cartpole", "max_steps": 60, "params": {"observation_noise": 0.01}}}
    extras = tmp_path / "extras.json"
    extras.write_text(json.dumps({"config": config, "checkpoint_uri": str(tmp_path / "ck"), "checkpoint_every_steps": 1}))
    shard = WorkloadProcess("robotics_lane.workloads.rollouts", extras, "run", cold=True)
    assert shard.wait() == 0, shard.tail()
    assert "cameras ['front']" in shard.log.read_text()
    trials = [json.loads((tmp_path / "shard" / "trials" / f"seed-{s:06d}.json").read_text()) for s in seeds]
    dataset = str(tmp_path / "dataset")
    assemble_dataset(dataset, [t["episode_file"] for t in trials], tasks=["balance the pole"], fps=trials[0]["fps"],
                     robot_type="cartpole", state_names=STATE_NAMES, action_names=ACTION_NAMES)
    assert validate_dataset(dataset)[1] == []
    videos = sorted(p.relative_to(dataset).as_posix() for p in Path(dataset, "videos").rglob("*.mp4"))
    assert len(videos) >= 1 and all(feature_name("front") in v for v in videos)
    _, episodes = read_dataset(dataset, decode_images=True)
    assert [e.metadata["seed"] for e in episodes] == seeds
    assert all(e.images[feature_name("front")].shape == (e.length, *FRONT) for e in episodes)


def test_the_camera_renders_without_multisampling_and_leaves_the_models_setting_as_it_was():
    # Mesa's software 4x resolve is most of a frame's cost on a CPU node (benchmarks/cameras.py).
    import mujoco

    from robotics_lane.sim.camera import MujocoCameras
    from robotics_lane.sim.mujoco_backend import make_vector_env

    env = make_vector_env(1, TASK.max_steps)
    model = env.envs[0].unwrapped.model
    cameras = MujocoCameras(model, ["front"])
    try:
        assert cameras._context.offSamples == 0
        assert model.vis.quality.offsamples == 4  # MuJoCo's default, untouched for anyone else who renders the model
        data = env.envs[0].unwrapped.data
        mujoco.mj_kinematics(model, data)
        assert cameras.render(model, data)["front"].shape == FRONT
    finally:
        cameras.close()
        env.close()
