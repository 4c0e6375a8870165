"""Isaac Lab cameras: the ``front`` camera ray-traced by Newton's Warp renderer, kit-less on the CPU.

One real Isaac Lab process (``tests/isaaclab_camera_run.py``, in the Isaac Lab runtime) records
episodes with and without the camera, in three env slots and in one; the tests judge its raw
frames and states. Nothing mocked. The resume tests (tests/test_rollout_resume_isaaclab.py) run
the rollout workload with the camera on and check its LeRobot v3 dataset.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from control_plane.settings import REPO_ROOT, child_env
from robotics_lane.sim.camera import image_shape
from robotics_lane.sim.factory import make_vector_simulator
from robotics_lane.sim.isaaclab_camera import ISAAC_VIEWS
from tests.isaaclab_camera_run import DRIVE_SEEDS, SEEDS, TASK

ISAACLAB_PYTHON = REPO_ROOT / ".venv-isaaclab" / "bin" / "python"
FRONT = image_shape("front")
PIXELS_PER_METRE = (FRONT[1] / 2) / ISAAC_VIEWS["front"].half_width


@pytest.fixture(scope="module")
def isaaclab_runs(tmp_path_factory) -> dict[str, dict[int, dict[str, np.ndarray]]]:
    """run -> seed -> {"observations", "actions", "front" (if filmed), "cameras"}."""
    if not ISAACLAB_PYTHON.exists():
        pytest.fail(
            f"{ISAACLAB_PYTHON} is missing: the Isaac Lab runtime is not built. "
            "Run `make isaaclab-runtime` (Python 3.12, ~3 minutes, ~8 GB) and rerun the tests."
        )
    out = tmp_path_factory.mktemp("isaaclab-cameras") / "runs.npz"
    proc = subprocess.run(
        [str(ISAACLAB_PYTHON), "-m", "tests.isaaclab_camera_run", str(out)],
        cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"Isaac Lab camera run failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}"
    result: dict = {}
    with np.load(out) as data:
        for key in data.files:
            run, seed, field = key.split("/")
            result.setdefault(run, {}).setdefault(int(seed), {})[field] = data[key]
    return result


def cart_columns(frames: np.ndarray) -> np.ndarray:
    """The image column of the cart's centre in each frame: the mean column of the dark pixels in
    the rows the cart fills (the rows with at least 4 dark pixels: the pole is 1-2 pixels wide)."""
    dark = frames.astype(int).sum(axis=-1) < 500  # the scene is grey on a light background
    wide = dark.sum(axis=2) >= 4  # (T, H): rows the cart's 5-pixel width fills
    assert wide.any(axis=1).all(), "the cart is out of view in some frames"
    cart = dark & wide[:, :, None]
    columns = np.arange(frames.shape[2])
    return (cart.sum(axis=1) * columns).sum(axis=1) / cart.sum(axis=(1, 2))


def pole_leans(frames: np.ndarray) -> np.ndarray:
    """How far right of the cart's centre (pixels) the pole's pixels lie, on average, in each frame."""
    dark = frames.astype(int).sum(axis=-1) < 500
    top_of_cart = (dark.sum(axis=2) >= 4).argmax(axis=1)  # (T,): the first row the cart fills
    rows = np.arange(frames.shape[1])[None, :, None]
    pole = dark & (rows < top_of_cart[:, None, None])
    columns = np.arange(frames.shape[2])
    return (pole.sum(axis=1) * columns).sum(axis=1) / np.maximum(pole.sum(axis=(1, 2)), 1) - cart_columns(frames)


def test_every_episode_has_one_front_frame_per_step_of_the_shape_asked(isaaclab_runs):
    assert FRONT == (96, 128, 3)
    for run in ("slots", "single", *DRIVE_SEEDS):
        for seed, episode in isaaclab_runs[run].items():
            assert list(episode["cameras"]) == ["front"]
            frames = episode["front"]
            assert frames.dtype == np.uint8 and frames.shape == (len(episode["observations"]), *FRONT), (run, seed)


def test_the_cart_and_pole_seen_by_the_camera_are_where_the_state_says_in_every_frame(isaaclab_runs):
    # Balancing towards ±2.5 m: the cart crosses the image to both sides, pole up.
    positions = np.concatenate([isaaclab_runs[run][seed]["observations"][:, 0] for run, (seed, _) in DRIVE_SEEDS.items()])
    columns = np.concatenate([cart_columns(isaaclab_runs[run][seed]["front"]) for run, (seed, _) in DRIVE_SEEDS.items()])
    assert positions.min() < -1.4 and positions.max() > 1.8, "the cart should have travelled both ways"
    slope, intercept = np.polyfit(positions, columns, 1)
    assert slope == pytest.approx(PIXELS_PER_METRE, rel=0.05)  # right of the image as cart_position grows
    assert intercept == pytest.approx((FRONT[1] - 1) / 2, abs=1.0)  # cart_position 0 is the image's centre
    # Every frame, the first one after each seeded reset included, shows the state the policy saw.
    for run in ("slots", "single"):
        for seed, episode in isaaclab_runs[run].items():
            seen = cart_columns(episode["front"])
            expected = slope * episode["observations"][:, 0] + intercept
            assert np.abs(seen - expected).max() < 1.0, (run, seed)
            # The pole's tip leans right as pole_angle grows, as in MuJoCo's front camera.
            angles, leans = episode["observations"][:, 1], pole_leans(episode["front"])
            tilted = np.abs(angles) > 0.1
            assert tilted.any() and (np.sign(leans[tilted]) == np.sign(angles[tilted])).all(), (run, seed)


def test_frames_depend_only_on_the_seed_not_on_env_slot_or_count(isaaclab_runs):
    # 3 envs (envs take new seeds after the adapter's reset) and 1 env with the seeds reversed.
    for seed in SEEDS:
        slots, single = isaaclab_runs["slots"][seed], isaaclab_runs["single"][seed]
        assert np.array_equal(slots["actions"], single["actions"])
        assert np.array_equal(slots["front"], single["front"]), f"seed {seed}: frames differ between runs"
        # The frames change as the cart-pole moves (a noisy operator never holds it still).
        assert len({frame.tobytes() for frame in slots["front"]}) > len(slots["front"]) // 2
    firsts = {isaaclab_runs["slots"][seed]["front"][0].tobytes() for seed in SEEDS}
    assert len(firsts) == len(SEEDS), "different seeds start in different states, so look different"


def test_rendering_leaves_the_physics_unchanged(isaaclab_runs):
    for seed in SEEDS:
        with_camera, without = isaaclab_runs["slots"][seed], isaaclab_runs["no_camera"][seed]
        assert list(without["cameras"]) == [] and "front" not in without
        assert np.array_equal(with_camera["observations"], without["observations"])
        assert np.array_equal(with_camera["actions"], without["actions"])
    assert all(len(e["observations"]) <= TASK.max_steps for e in isaaclab_runs["slots"].values())


def test_the_factory_refuses_unknown_backends_and_unknown_cameras():
    with pytest.raises(ValueError, match=r"unknown backend 'bullet'"):
        make_vector_simulator("bullet", TASK, num_envs=1, cameras=("front",))
    with pytest.raises(ValueError, match=r"unknown camera\(s\) \['top'\]"):
        make_vector_simulator("isaaclab", TASK, num_envs=1, cameras=("top",))
