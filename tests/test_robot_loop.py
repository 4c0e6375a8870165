"""The Robotics loop does what it exists for: failures on the real robot become data that raises
real success, and domain randomisation narrows the sim-to-real gap.

The loop runs without Dagster (`LoopRehearsal`): the real stand-ins (teleop operator, robot cell
with its hidden physics), the real rollout and training workloads in their own processes, the
requests the assets write. The first tests check the pieces it is made of, in-process.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from robotics_lane.defs.policy_versions import PolicyVersion, Rate, success_chart_png, verdict, versions_markdown
from robotics_lane.episodes.lerobot_v3 import read_dataset
from robotics_lane.robot_cell_protocol import HELD_OUT_TASKS, TRIALS_PER_TASK
from robotics_lane.sim.base import TaskSpec
from robotics_lane.sim.controllers import BalancingController
from robotics_lane.sim.factory import make_vector_simulator
from robotics_lane.sim.randomization import randomized_task
from robotics_lane.standins.loop_rehearsal import LoopRehearsal
from robotics_lane.stats import wilson_interval
from robotics_lane.sweeps import SWEEPS
from robotics_lane.workloads.config import RolloutConfig
from workload_runtime.storage import Storage

NIGHT = "2026-11-20"
RANGES = {"actuator_gain": (0.4, 1.2), "start_disturbance_scale": (1.0, 10.0)}


def test_randomised_params_are_drawn_per_seed_within_their_ranges():
    tasks = [randomized_task(TaskSpec(params={"pole_mass_scale": 1.2}), RANGES, seed) for seed in range(50)]
    assert [t.params for t in tasks] == [randomized_task(TaskSpec(params={"pole_mass_scale": 1.2}), RANGES, s).params for s in range(50)]
    for key, (low, high) in RANGES.items():
        values = [t.param(key) for t in tasks]
        assert all(low <= v <= high for v in values) and np.ptp(values) > (high - low) / 2, key
    assert {t.param("pole_mass_scale") for t in tasks} == {1.2}  # fixed params stay fixed
    assert randomized_task(TaskSpec(), {}, 3) == TaskSpec()
    with pytest.raises(ValueError, match=r"randomize\['motor_gain'\]: not a parameter"):
        randomized_task(TaskSpec(), {"motor_gain": (0.5, 1.0)}, 0)
    with pytest.raises(ValueError, match=r"low <= high"):
        randomized_task(TaskSpec(), {"actuator_gain": (1.2, 0.4)}, 0)
    with pytest.raises(ValidationError, match="randomise on the 'mujoco' backend"):
        RolloutConfig(backend="isaaclab", seeds=[1], output_uri="/tmp/x", randomize=RANGES)


def test_the_adapted_expert_pushes_harder_on_a_weaker_actuator():
    task = TaskSpec(params={"actuator_gain": 0.25})
    state = np.array([[0.0, 0.02, 0.0, 0.01]])
    nominal, adapted = BalancingController(), BalancingController().adapted_to(task)
    assert adapted.batch(state)[0, 0] == pytest.approx(4 * nominal.batch(state)[0, 0], rel=1e-5)
    assert BalancingController().adapted_to(TaskSpec()) == nominal
    with pytest.raises(ValueError, match="actuator_gain is 0"):
        nominal.adapted_to(TaskSpec(params={"actuator_gain": 0.0}))


def test_start_disturbance_widens_the_initial_states():
    def spread(scale: float) -> float:
        with make_vector_simulator("mujoco", TaskSpec(params={"start_disturbance_scale": scale}), num_envs=32) as sim:
            return float(np.abs(sim.reset(list(range(32)))).max())

    assert spread(1.0) <= 0.0101 and 0.05 < spread(10.0) <= 0.101  # gymnasium's ±0.01, times the scale


@pytest.fixture(scope="module")
def first_versions(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The data of the demo's first round (teleop sessions, one night of the MuJoCo sweep) and two
    policies trained on it: one with the sweep as it is (domain-randomised), one with the same
    sweep without randomisation; each evaluated in simulation and on the robot-cell stand-in."""
    tmp = tmp_path_factory.mktemp("robot-loop")
    # States only: success rates are what these tests judge; the cameras' frames are the demo's (tests/test_lerobot_reader.py).
    rehearsal = LoopRehearsal(Storage.at(str(tmp / "home")), tmp / "work", cameras=())
    teleop = rehearsal.teleop_sessions()
    sweep = SWEEPS["cartpole-mujoco-randomized"]
    data = {"randomised": teleop + [rehearsal.sweep("randomised", sweep, NIGHT)], "nominal": teleop + [rehearsal.sweep("nominal", replace(sweep, randomize={}), NIGHT)]}
    out: dict = {"rehearsal": rehearsal, "data": data}
    for name, datasets in data.items():
        checkpoint = rehearsal.train(f"{name}-v1", datasets)
        out[name] = {"real": rehearsal.real_evaluation(f"{name}-v1", checkpoint, TRIALS_PER_TASK), "sim": rehearsal.sim_evaluation(f"{name}-v1", checkpoint)}
    return out


def _rate(trials: pd.DataFrame) -> tuple[float, float, float]:
    successes, n = int(trials["success"].sum()), len(trials)
    return (successes / n, *wilson_interval(successes, n))


@pytest.mark.e2e
def test_domain_randomisation_narrows_the_sim_to_real_gap(first_versions):
    rates = {name: {where: _rate(first_versions[name][where]) for where in ("sim", "real")} for name in ("randomised", "nominal")}
    gap = {name: r["sim"][0] - r["real"][0] for name, r in rates.items()}
    assert rates["randomised"]["sim"][0] >= 0.9 and rates["nominal"]["sim"][0] >= 0.9, rates  # both balance in simulation
    assert rates["randomised"]["real"][1] > rates["nominal"]["real"][2], rates  # real success: the 95% intervals separate
    assert gap["randomised"] < gap["nominal"], gap
    assert rates["randomised"]["real"][0] < 0.9, rates  # the randomisation's ranges stop short of the real motor: a gap is left


@pytest.mark.e2e
def test_corrective_demonstrations_raise_real_success_version_by_version(first_versions):
    rehearsal: LoopRehearsal = first_versions["rehearsal"]
    data = list(first_versions["data"]["randomised"])
    evaluations = [first_versions["randomised"]["real"]]
    held_out = {t["first_seed"] + i for t in HELD_OUT_TASKS for i in range(TRIALS_PER_TASK)}
    for version in (2, 3):
        corrective = rehearsal.corrective_demonstrations(evaluations[-1])
        if not corrective:
            break  # every trial succeeded: nothing left to relabel
        for session in corrective:  # new takes on the real robot, at the failed trials' tasks, never the evaluation's seeds
            info, episodes = read_dataset(session)
            assert info.robot_type == "cartpole" and len(episodes) == int((~evaluations[-1]["success"].astype(bool)).sum())
            assert not {int(e.metadata["seed"]) for e in episodes} & held_out
        data += corrective
        checkpoint = rehearsal.train(f"randomised-v{version}", data)
        evaluations.append(rehearsal.real_evaluation(f"randomised-v{version}", checkpoint, TRIALS_PER_TASK))
    rates = [_rate(e) for e in evaluations]
    assert len(rates) >= 2, rates
    assert rates[1][1] > rates[0][2], rates  # version 2 beats version 1: the 95% intervals separate
    for earlier, later in zip(rates[1:], rates[2:]):
        assert later[0] >= earlier[1], rates  # and later versions keep it
    assert set(evaluations[0]["task_id"]) == {t["task_id"] for t in HELD_OUT_TASKS}


def test_the_verdict_says_whether_real_success_rose_and_why_not():
    def version(number: int, real: tuple[int, int] | None, corrective: int, failed: int | None = None) -> PolicyVersion:
        rate = None if real is None else Rate(real[0] / real[1], *wilson_interval(*real), real[1])
        return PolicyVersion(number, f"{number:02d}abcdef1234", 4 + number, corrective, Rate(1.0, 0.84, 1.0, 20), rate,
                             None if real is None else (failed if failed is not None else real[1] - real[0]))

    assert verdict([version(1, (14, 40), 0)]).startswith("Only one policy version has been evaluated")
    assert verdict([version(1, (14, 40), 0), version(2, (40, 40), 26)]) == (
        "Real success rose from 35% [22%–50%] of 40 (v1 01abcdef) to 100% [91%–100%] of 40 (v2 02abcdef), "
        "after 26 corrective episodes on the real robot; the 95% intervals do not overlap."
    )
    assert "intervals overlap: more trials per task" in verdict([version(1, (30, 40), 0), version(2, (34, 40), 10)])
    assert "failed no trial, so there was nothing to relabel" in verdict([version(1, (40, 40), 0), version(2, (39, 40), 0)])
    assert "learnt from no corrective demonstrations" in verdict([version(1, (20, 40), 0), version(2, (20, 40), 0)])
    assert "the gap is not one they teach" in verdict([version(1, (20, 40), 0), version(2, (18, 40), 20)])
    chart = success_chart_png([version(1, (14, 40), 0), version(2, None, 26)])
    assert chart.startswith(b"\x89PNG")
    assert "| v2 02abcdef | 26 | 100% [84%–100%] of 20 | pending |" in versions_markdown([version(1, (14, 40), 0), version(2, None, 26)])
