"""TeleopOperatorStandIn — a stand-in for a human teleoperator, for demos and tests only.

It "drives" the cart-pole in MuJoCo with the scripted balancing controller plus operator
noise, records the sessions as LeRobot v3 datasets with the rig's front camera
(`observation.images.front`, rendered offscreen by MuJoCo), and drops them in landing exactly
as a teleop rig would. First sessions are on the simulation rig (nominal physics).

It also answers relabelling requests (failed real-robot trials) with corrective
demonstrations: on the real robot (the robot cell's hidden physics), at each failed trial's
task, by an operator who adapts to the robot as a person would (the cart answers a weak motor
late, so they push harder: ``BalancingController.adapted_to``). Each failed trial gets one new
take from a fresh start (``take_seed``), never the trial's own seed: the held-out evaluation
seeds stay out of training, so the next policy version's evaluation stays honest.
"""

from __future__ import annotations

import itertools
import posixpath
import zlib
from dataclasses import dataclass

import numpy as np

from robotics_lane.episodes.lerobot_v3 import Episode, write_dataset
from robotics_lane.standins.robot_cell import real_task
from robotics_lane.sim.base import ACTION_NAMES, STATE_NAMES, TaskSpec, run_episode
from robotics_lane.sim.camera import image_features
from robotics_lane.sim.factory import make_simulator
from robotics_lane.sim.controllers import BalancingController, NoisyOperator
from control_plane.intake.landing import MANIFEST_NAME, seal_drop
from workload_runtime.storage import Storage, exists, glob_uris, read_json, write_json_atomic

KIND = "teleop"
TASK_LABEL = "balance the pole"
CAMERAS = ("front",)  # the rig's camera, recorded in every session
TAKE_SEEDS = (100_000_000, 1_000_000_000)  # corrective takes: apart from sweeps (< 10M) and evaluations (7M, 9M)


def take_seed(request_id: str, failed_seed: int) -> int:
    """The start of the corrective take for one failed trial: new, stable, and unique per request
    (a seed that fails again in a later evaluation gets another take)."""
    low, high = TAKE_SEEDS
    return low + zlib.crc32(f"{request_id}/{failed_seed}".encode()) % (high - low)


@dataclass
class TeleopOperatorStandIn:
    storage: Storage
    noise_std: float = 0.1
    cameras: tuple[str, ...] = CAMERAS  # the rig's camera, recorded in every session; () for state only

    def _record(
        self, session_id: str, conditions: list[tuple[TaskSpec, int]], note: str, corrupt: bool = False, on_real_robot: bool = False, **fields: str
    ) -> str:
        folder = self.storage.landing(KIND, session_id)
        if exists(posixpath.join(folder, MANIFEST_NAME)):
            return folder  # an operator never sends the same session twice
        episodes, fps = [], 25
        # One set-up of the rig per task, as an operator records take after take; each take's
        # start follows its seed alone.
        for task, takes in itertools.groupby(conditions, key=lambda condition: condition[0]):
            controller = BalancingController().adapted_to(task) if on_real_robot else BalancingController()  # a person adapts to the robot
            with make_simulator("mujoco", task, cameras=self.cameras) as sim:
                fps = max(1, round(1.0 / sim.control_dt))
                for _, seed in takes:
                    episode = run_episode(sim, NoisyOperator(controller, self.noise_std, seed), seed)
                    actions = episode.actions.copy()
                    if corrupt:
                        actions[len(actions) // 2 :] = np.nan  # a recorder glitch: the joystick stream dropped out
                    episodes.append(
                        Episode(task=TASK_LABEL, observation_state=episode.observations, action=actions, reward=episode.rewards,
                                success=episode.success, metadata={"seed": seed, "failure_mode": episode.failure_mode or ""},
                                images=image_features(episode.images))
                    )
        write_dataset(folder, episodes, fps=fps, robot_type="cartpole", state_names=STATE_NAMES, action_names=ACTION_NAMES)
        robot = "cartpole-real-01" if on_real_robot else "cartpole-sim-rig"
        return seal_drop(self.storage, KIND, session_id, robot=robot, operator="TeleopOperatorStandIn", project="sinewgrid-demo", note=note, **fields)

    def record_sessions(self, sessions: int = 2, episodes: int = 5, include_bad: bool = True) -> list[str]:
        """First demonstrations: a few sessions of nominal balancing, plus one with a glitch."""
        ids = []
        for s in range(sessions):
            conditions = [(TaskSpec(max_steps=200), 1000 * (s + 1) + e) for e in range(episodes)]
            ids.append(f"teleop-session-{s + 1:03d}")
            self._record(ids[-1], conditions, "nominal balancing demonstrations")
        if include_bad:
            ids.append("teleop-session-glitch")
            self._record(ids[-1], [(TaskSpec(max_steps=200), 4242)], "recorder glitch: NaN actions", corrupt=True)
        return ids

    def answer_relabel_requests(self) -> list[str]:
        """Demonstrate again every failed real-robot trial the platform flagged for relabelling."""
        answered_uri = self.storage.uri("teleop_operator", "answered.json")
        answered = set(read_json(answered_uri)) if exists(answered_uri) else set()
        new = []
        for uri in glob_uris(self.storage.outbox("relabel", "*", "request.json")):
            request = read_json(uri)
            if request["request_id"] in answered:
                continue
            # On the real robot, at each failed trial's task, from a fresh start (see the module's docstring).
            conditions = [(real_task(t["task"]), take_seed(request["request_id"], int(t["seed"]))) for t in request["trials"]]
            session = f"relabel-{request['request_id']}"
            self._record(
                session, conditions, f"corrective demonstrations for {request['request_id']}", on_real_robot=True,
                in_reply_to=f"robotics/real_robot_evaluation/{request['request_id']}",
            )
            answered.add(request["request_id"])
            new.append(session)
        write_json_atomic(answered_uri, sorted(answered))
        return new
