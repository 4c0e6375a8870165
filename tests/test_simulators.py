"""The simulator layer: one cart-pole interface, MuJoCo here and Isaac Lab in its own runtime."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from robotics_lane.sim import (
    KNOWN_BACKENDS,
    STATE_NAMES,
    BalancingController,
    NoisyOperator,
    TaskSpec,
    make_simulator,
    run_episode,
    zero_policy,
)
from robotics_lane.sim.base import BackendUnavailableError
from robotics_lane.scenes.catalog import SceneError
from robotics_lane.scenes.newton_cartpole import fix_default_prim
from robotics_lane.sim.isaaclab_assets import scale_masses

REPO = Path(__file__).resolve().parents[1]
ISAACLAB_PYTHON = REPO / ".venv-isaaclab" / "bin" / "python"


@pytest.fixture
def mujoco_sim():
    sim = make_simulator("mujoco", TaskSpec())
    yield sim
    sim.close()


def rollout(sim, actions: np.ndarray, seed: int) -> np.ndarray:
    """The observations for a fixed action sequence (stops early if the episode ends)."""
    states = [sim.reset(seed)]
    for action in actions:
        result = sim.step(action)
        states.append(result.observation)
        if result.terminated or result.truncated:
            break
    return np.stack(states)


# --- TaskSpec and the factory -------------------------------------------------------------


def test_task_spec_validates_name_and_params():
    with pytest.raises(ValueError, match=r"unknown task 'acrobot'.*'cartpole'"):
        TaskSpec(name="acrobot")
    with pytest.raises(ValueError, match=r"pole_lenght.*known parameters.*pole_mass_scale"):
        TaskSpec(params={"pole_lenght": 1.0})
    with pytest.raises(ValueError, match="must be > 0"):
        TaskSpec(params={"pole_mass_scale": 0.0})
    with pytest.raises(ValueError, match="max_steps"):
        TaskSpec(max_steps=0)


def test_task_key_is_stable_and_ignores_defaults():
    assert TaskSpec().key() == "cartpole-200-default"
    assert TaskSpec(params={"actuator_gain": 1.0}).key() == TaskSpec().key()
    a = TaskSpec(params={"pole_mass_scale": 1.2, "observation_noise": 0.01})
    b = TaskSpec(params={"observation_noise": 0.01, "pole_mass_scale": 1.2})
    assert a.key() == b.key() != TaskSpec(params={"pole_mass_scale": 1.3}).key()
    assert a.key().startswith("cartpole-200-") and len(a.key()) == len("cartpole-200-") + 8


def test_unknown_backend_is_refused():
    assert set(KNOWN_BACKENDS) == {"mujoco", "isaaclab"}
    with pytest.raises(ValueError, match=r"unknown backend 'bullet'.*mujoco.*isaaclab"):
        make_simulator("bullet", TaskSpec())  # type: ignore[arg-type]


def test_isaaclab_in_the_main_venv_says_how_to_get_its_runtime():
    with pytest.raises(BackendUnavailableError) as err:
        make_simulator("isaaclab", TaskSpec())
    message = str(err.value)
    assert "own Python 3.12 runtime" in message
    assert "make isaaclab-runtime" in message and ".venv-isaaclab/bin/python" in message


def test_sim_package_imports_no_dagster_and_no_backend():
    code = "import sys, robotics_lane.sim; print(sorted(m for m in ('dagster', 'mujoco', 'isaaclab', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_isaaclab_scene_fixes_newtons_default_prim_and_a_task_scales_its_masses():
    usda = (
        '(\n    defaultPrim = "cartPole"\n)\n'
        'def Xform "cartpole" {\n'
        '    def Xform "cart" (\n        apiSchemas = ["PhysicsMassAPI"]\n    )\n    {\n        float physics:mass = 1\n    }\n'
        '    def Xform "pole" (\n        apiSchemas = ["PhysicsMassAPI"]\n    )\n    {\n        float physics:mass = 1\n    }\n}\n'
    )
    scene = fix_default_prim(usda)  # the registered scene: newton's robot, loadable by Isaac Lab
    assert 'defaultPrim = "cartpole"' in scene and scene.replace('"cartpole"', '"cartPole"', 1) == usda
    with pytest.raises(SceneError, match="expected one"):
        fix_default_prim(scene)  # a file that is not newton's as we know it is refused, not passed through
    scaled = scale_masses(scene, {"cart": 1.0, "pole": 2.5})  # what a task's mass scales load
    assert scaled.count("float physics:mass = 1\n") == 1 and "float physics:mass = 2.5" in scaled


# --- MuJoCo ----------------------------------------------------------------------------------


def test_mujoco_state_layout_and_seeded_reset(mujoco_sim):
    first = mujoco_sim.reset(3)
    assert first.shape == (len(STATE_NAMES),) and first.dtype == np.float32
    assert np.array_equal(first, mujoco_sim.reset(3))
    assert not np.array_equal(first, mujoco_sim.reset(4))
    assert mujoco_sim.control_dt == pytest.approx(0.04)


def test_mujoco_same_seed_and_actions_give_the_same_trajectory(mujoco_sim):
    # Record a closed-loop episode, then replay its actions open-loop: the states must match exactly.
    episode = run_episode(mujoco_sim, NoisyOperator(BalancingController(), 0.2, seed=7), seed=11)
    replay = rollout(mujoco_sim, episode.actions, seed=11)
    assert episode.length == 200
    assert np.array_equal(replay[:-1], episode.observations) and np.array_equal(replay[-1], episode.final_observation)
    assert not np.array_equal(replay, rollout(mujoco_sim, episode.actions, seed=12))


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_mujoco_controller_balances_for_max_steps(mujoco_sim, seed):
    episode = run_episode(mujoco_sim, BalancingController(), seed)
    assert episode.success and episode.failure_mode is None
    assert episode.length == 200 and episode.rewards.sum() == 200


def test_mujoco_zero_policy_lets_the_pole_fall(mujoco_sim):
    episode = run_episode(mujoco_sim, zero_policy, seed=0)
    assert not episode.success and episode.failure_mode == "pole_fell"
    assert episode.length < 200 and episode.rewards[-1] == 0.0
    assert abs(episode.final_observation[1]) > 0.2


def test_mujoco_driving_past_the_rail_end_is_cart_out_of_bounds(mujoco_sim):
    episode = run_episode(mujoco_sim, BalancingController(target_position=2.0), seed=0)
    assert episode.failure_mode == "cart_out_of_bounds"
    assert abs(episode.final_observation[0]) >= 0.95


def test_step_is_refused_outside_an_episode(mujoco_sim):
    with pytest.raises(RuntimeError, match="call reset"):
        mujoco_sim.step(np.zeros(1))
    run_episode(mujoco_sim, zero_policy, seed=0)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        mujoco_sim.step(np.zeros(1))
    mujoco_sim.reset(0)
    with pytest.raises(ValueError, match="cart_force"):
        mujoco_sim.step(np.zeros(2))


def test_actions_are_clipped_to_unit_range(mujoco_sim):
    assert np.array_equal(rollout(mujoco_sim, np.full((3, 1), 5.0), 0), rollout(mujoco_sim, np.ones((3, 1)), 0))


def test_mujoco_truncates_at_task_max_steps():
    with make_simulator("mujoco", TaskSpec(max_steps=30)) as sim:
        episode = run_episode(sim, BalancingController(), seed=0)
    assert episode.success and episode.length == 30


def test_actuator_gain_zero_makes_the_controller_fail():
    with make_simulator("mujoco", TaskSpec(params={"actuator_gain": 0.0})) as sim:
        episode = run_episode(sim, BalancingController(), seed=0)
    assert episode.failure_mode == "pole_fell"


def test_observation_noise_is_seeded_and_applied(mujoco_sim):
    actions = np.zeros((5, 1))
    clean = rollout(mujoco_sim, actions, 0)
    with make_simulator("mujoco", TaskSpec(params={"observation_noise": 0.05})) as noisy:
        a, b = rollout(noisy, actions, 0), rollout(noisy, actions, 0)
        c = rollout(noisy, actions, 1)
    assert np.array_equal(a, b) and not np.array_equal(a, clean)
    assert 0.01 < np.std(a - clean) < 0.1
    assert not np.array_equal(a[1:] - clean[1:], c[1:] - rollout(mujoco_sim, actions, 1)[1:])


def test_physics_params_change_the_mujoco_model(mujoco_sim):
    import mujoco

    with make_simulator("mujoco", TaskSpec(params={"pole_mass_scale": 3.0, "gravity_scale": 1.5})) as heavy:
        model, base = heavy.vector.models[0], mujoco_sim.vector.models[0]
        pole = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "pole")
        assert model.body_mass[pole] == pytest.approx(3.0 * base.body_mass[pole])
        assert model.opt.gravity[2] == pytest.approx(1.5 * base.opt.gravity[2])
        actions = np.full((10, 1), 0.05)
        assert not np.allclose(rollout(heavy, actions, 0), rollout(mujoco_sim, actions, 0))
        assert run_episode(heavy, zero_policy, 0).length < run_episode(mujoco_sim, zero_policy, 0).length


def test_noisy_operator_is_seeded_and_still_balances(mujoco_sim):
    obs = mujoco_sim.reset(0)
    a, b = NoisyOperator(BalancingController(), 0.1, seed=5), NoisyOperator(BalancingController(), 0.1, seed=5)
    assert np.array_equal([a(obs) for _ in range(5)], [b(obs) for _ in range(5)])
    assert np.array_equal(NoisyOperator(BalancingController(), 0.0, seed=1)(obs), BalancingController()(obs))
    assert not np.array_equal(a(obs), BalancingController()(obs))
    operator = NoisyOperator(BalancingController(), 0.1, seed=0)
    assert all(run_episode(mujoco_sim, operator, seed).success for seed in range(5))


# --- Isaac Lab (a real rollout on the CPU, in the Python 3.12 runtime) -------------------------


@pytest.fixture(scope="module")
def isaaclab_report() -> dict:
    if not ISAACLAB_PYTHON.exists():
        pytest.fail(
            f"{ISAACLAB_PYTHON} is missing: the Isaac Lab runtime is not built. "
            "Run `make isaaclab-runtime` (Python 3.12, ~3 minutes, ~8 GB) and rerun the tests."
        )
    proc = subprocess.run(
        [str(ISAACLAB_PYTHON), "-m", "robotics_lane.sim.isaaclab_backend", "--selftest", "--seeds", "0,1,2"],
        cwd=REPO, capture_output=True, text=True, timeout=480,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("SELFTEST_JSON ")]
    assert proc.returncode == 0 and lines, f"Isaac Lab self-test failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1].removeprefix("SELFTEST_JSON "))


def test_isaaclab_runs_in_its_runtime_on_the_cpu(isaaclab_report):
    assert isaaclab_report["python"].startswith("3.12.")
    assert isaaclab_report["control_dt"] == pytest.approx(1 / 60)
    # It ran its three episodes' steps; how fast is benchmarks/isaaclab_overhead.py's to measure.
    assert isaaclab_report["steps"] >= 600


def test_isaaclab_controller_balances_for_max_steps(isaaclab_report):
    for episode in isaaclab_report["controller"]:
        assert episode["success"] and episode["length"] == 200, episode
    firsts = [tuple(e["first_observation"]) for e in isaaclab_report["controller"]]
    assert len(set(firsts)) == 3 and all(v != 0 for v in firsts[0])  # seeded, velocities included
    assert isaaclab_report["deterministic"]


def test_isaaclab_failure_modes_report_the_terminal_state(isaaclab_report):
    zero, drive_off = isaaclab_report["zero"], isaaclab_report["drive_off"]
    assert zero["failure_mode"] == "pole_fell" and abs(zero["final_observation"][1]) > math.pi / 2
    # Isaac Lab auto-resets on termination: the adapter must still report where the cart ended.
    assert drive_off["failure_mode"] == "cart_out_of_bounds" and abs(drive_off["final_observation"][0]) > 3.0
    assert isaaclab_report["step_after_end_refused"]


def test_isaaclab_task_params_reach_the_physics(isaaclab_report):
    assert isaaclab_report["body_masses"]["pole"] == pytest.approx(1.0)
    heavy = isaaclab_report["heavy"]
    assert heavy["body_masses"]["pole"] == pytest.approx(2.0)
    assert heavy["zero"]["first_observation"] == isaaclab_report["zero"]["first_observation"]
    assert heavy["zero"]["length"] < isaaclab_report["zero"]["length"]  # 1.5 g: the pole falls sooner


def test_isaaclab_vectorised_episodes_match_the_one_env_ones(isaaclab_report):
    # 4 envs over 6 seeds (envs take new seeds mid-run): each seed's episode is bit-identical to
    # the one-env episode of that seed, whatever its env slot.
    vector = isaaclab_report["vector"]
    assert vector["num_envs"] == 4 and vector["seeds"] == [0, 1, 2, 100, 101, 102]
    assert vector["same_as_single_env"] and vector["max_abs_difference"] == 0.0
    assert all(e["success"] and e["length"] == 200 for e in vector["episodes"])
    firsts = {tuple(e["first_observation"]) for e in vector["episodes"]}
    assert len(firsts) == 6
