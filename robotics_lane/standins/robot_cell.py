"""RobotCellStandIn — a stand-in for the real-robot evaluation cell, for demos and tests only.

It answers an evaluation request from the outbox the way a robot cell would: runs the asked
trials with the given policy and posts the results to `landing/robot_eval/<eval_id>/`
(per-trial JSON lines, the trial episodes as a LeRobot v3 dataset with the cell's front camera,
manifest last). Its "real
robot" is MuJoCo with physics the platform is never told (``REAL_ROBOT_PHYSICS``), so the
sim-to-real gap in the demo is real:

- the motor is current-limited to 14% of the force the simulation's model gives (its datasheet
  peak), so the nominal controller's pushes are far too soft to catch a falling pole;
- the pole is 35% heavier (a clamp and a sensor head the CAD model lacks);
- the encoders are noisy (std 0.03 in every state value);
- the cell resets the pole by hand, so trials start ten times further from upright and rest than
  the simulation's resets do.

A policy cloned from nominal demonstrations fails almost every trial; the nightly sweep's domain
randomisation (actuator gain down to 0.4) gets part of the way; demonstrations taken on this
robot (``TeleopOperatorStandIn.answer_relabel_requests``) teach the rest.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass

from control_plane.intake.landing import MANIFEST_NAME, seal_drop
from robotics_lane.episodes.lerobot_v3 import Episode, write_dataset
from robotics_lane.policies import load_policy
from robotics_lane.sim.base import ACTION_NAMES, STATE_NAMES, TaskSpec, run_episode
from robotics_lane.sim.camera import image_features
from robotics_lane.sim.factory import make_simulator
from workload_runtime.storage import Storage, exists, glob_uris, read_json, write_bytes_atomic

KIND = "robot_eval"
# How the real robot differs from nominal simulation (hidden from the platform; see above).
REAL_ROBOT_PHYSICS = {"pole_mass_scale": 1.35, "actuator_gain": 0.14, "observation_noise": 0.03, "start_disturbance_scale": 10.0}


def real_task(task: dict) -> TaskSpec:
    """The task as the real robot performs it: the requested params on top of its own physics."""
    params = {**REAL_ROBOT_PHYSICS, **task.get("params", {})}
    return TaskSpec(name=task.get("name", "cartpole"), max_steps=int(task.get("max_steps", 200)), params=params)


@dataclass
class RobotCellStandIn:
    storage: Storage
    cameras: tuple[str, ...] = ("front",)  # the cell's camera, recorded in every trial; () for state only

    def answer_requests(self) -> list[str]:
        answered = []
        for uri in glob_uris(self.storage.outbox("robot_eval", "*", "request.json")):
            request = read_json(uri)
            eval_id = request["eval_id"]
            folder = self.storage.landing(KIND, eval_id)
            if exists(posixpath.join(folder, MANIFEST_NAME)):
                continue
            records, episodes, fps = [], [], 25
            for task_entry in request["tasks"]:
                task = real_task(task_entry["task"])
                with make_simulator("mujoco", task, cameras=self.cameras) as sim:  # one set-up of the cell per task
                    fps = max(1, round(1.0 / sim.control_dt))
                    for trial in range(int(request["trials_per_task"])):
                        seed = int(task_entry["first_seed"]) + trial
                        policy = load_policy({"kind": "checkpoint", "uri": request["policy_checkpoint_uri"]}, seed)  # any noise it has, seeded per trial
                        episode = run_episode(sim, policy, seed)  # the trial's start follows its seed alone
                        records.append(
                            {"trial": len(records), "task_id": task_entry["task_id"], "seed": seed, "success": bool(episode.success),
                             "return": float(episode.rewards.sum()), "length": int(episode.length), "failure_mode": episode.failure_mode,
                             "episode_index": len(episodes)}
                        )
                        episodes.append(
                            Episode(task=task_entry["task_id"], observation_state=episode.observations, action=episode.actions,
                                    reward=episode.rewards, success=episode.success, metadata={"seed": seed, "failure_mode": episode.failure_mode or ""},
                                    images=image_features(episode.images))
                        )
            write_dataset(posixpath.join(folder, "episodes"), episodes, fps=fps, robot_type="cartpole-real", state_names=STATE_NAMES, action_names=ACTION_NAMES)
            write_bytes_atomic(posixpath.join(folder, "trials.jsonl"), "".join(json.dumps(r) + "\n" for r in records).encode())
            seal_drop(self.storage, KIND, eval_id, robot="cartpole-real-01", cell="RobotCellStandIn", project="sinewgrid-demo", policy_version=request["policy_version"])
            answered.append(eval_id)
        return answered
