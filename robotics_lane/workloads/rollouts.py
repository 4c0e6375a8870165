"""Roll out a policy in simulation for a list of seeds — one shard of a sweep or an evaluation.

Vectorised: ``num_envs`` environments step together in this process (Isaac Lab: one scene on the
node's GPU when it has one, else the CPU; MuJoCo: gymnasium's vector env), each taking the next
seed as soon as its episode ends. Unset, ``num_envs`` is the backend's default for the device
(``robotics_lane.sim.factory.DEFAULT_NUM_ENVS``), never more than the episodes left to run.

Preemption-safe by construction: each finished episode is committed on its own, the moment it
ends (its frames as one LeRobot-format parquet file, then its trial record, written atomically,
as the commit marker). A relaunch skips every seed already committed and reruns the episodes
that were still running; since an episode depends only on its seed (not on its env slot or the
env count), SIGTERM (with notice) or SIGKILL (without) at any moment ends, after the relaunch,
with exactly the episodes of an uninterrupted run: none lost, none twice.

Cameras (`cfg.cameras`, e.g. a sweep's front camera) are rendered offscreen at every step and
committed with the episode; unasked (policy evaluation), nothing renders.

Output under `output_uri`:
    episodes/episode-000042.parquet  frames of seed 42 (LeRobot v3 data columns)
    trials/seed-000042.json          seed, task, scene, success, return, length, failure mode (commit marker)
"""

from __future__ import annotations

import json
import time
from collections import Counter

import numpy as np

from robotics_lane.episodes.lerobot_v3 import Episode as LeRobotEpisode
from robotics_lane.episodes.shards import write_episode_file
from robotics_lane.scenes.files import local_scene
from robotics_lane.sim.base import Episode, TaskSpec
from robotics_lane.sim.batch_rollout import run_episodes
from robotics_lane.sim.camera import image_features
from robotics_lane.sim.factory import default_num_envs, make_vector_simulator, resolve_device
from robotics_lane.sim.randomization import randomized_task
from robotics_lane.workloads.batch_policy import load_batch_policy
from robotics_lane.workloads.config import RolloutConfig
from robotics_lane.workloads.rollout_output import committed_seeds, episodes_folder, trial_uri
from workload_runtime.storage import read_json, write_bytes_atomic
from workload_runtime.workload import Preempted, WorkloadRun


def commit_episode(cfg: RolloutConfig, task: TaskSpec, episode: Episode, episode_index: int, fps: int) -> None:
    """Write one finished episode's frames, then its trial record (the commit marker)."""
    episode_file = write_episode_file(
        episodes_folder(cfg.output_uri),
        LeRobotEpisode(
            task=cfg.task_label,
            observation_state=episode.observations,
            action=episode.actions,
            reward=episode.rewards,
            success=episode.success,
            metadata={"seed": episode.seed, "failure_mode": episode.failure_mode or ""},
            images=image_features(episode.images),
        ),
        episode_index=episode.seed,  # file name; episodes are renumbered when assembled
        global_index_start=0,
        task_index=0,
        fps=fps,
    )
    record = {
        "seed": episode.seed,
        "episode_index": episode_index,
        "episode_file": episode_file,
        "backend": cfg.backend,
        "task": task.name,
        "task_key": task.key(),
        "task_params": dict(task.params),
        "scene_ref": cfg.scene.ref if cfg.scene else "",
        "success": bool(episode.success),
        "return": float(np.sum(episode.rewards)),
        "length": int(episode.length),
        "failure_mode": episode.failure_mode,
        "fps": fps,
    }
    write_bytes_atomic(trial_uri(cfg.output_uri, episode.seed), json.dumps(record).encode())


def seeds_by_task(task: TaskSpec, randomize: dict, seeds: list[int]) -> list[tuple[TaskSpec, list[int]]]:
    """The seeds to run, grouped by the task each runs on: one group without randomisation, else
    one per draw (``robotics_lane.sim.randomization``), in seed order."""
    groups: dict[str, tuple[TaskSpec, list[int]]] = {}
    for seed in seeds:
        drawn = randomized_task(task, randomize, seed)
        groups.setdefault(drawn.key(), (drawn, []))[1].append(seed)
    return list(groups.values())


def main() -> None:
    with WorkloadRun() as run:
        cfg = run.config_as(RolloutConfig)
        task = TaskSpec(**cfg.task)
        done = committed_seeds(cfg.output_uri)
        todo = [s for s in cfg.seeds if s not in done]
        device = resolve_device(cfg.backend, cfg.device)
        num_envs = min(cfg.num_envs, len(todo)) if cfg.num_envs else default_num_envs(cfg.backend, device, len(todo))
        run.info(
            f"{cfg.backend} {task.name} rollouts: {len(cfg.seeds)} seeds, {len(done)} already committed, "
            f"{len(todo)} to run, {num_envs} envs on {device}" + (f", cameras {cfg.cameras}" if cfg.cameras else "")
        )
        run.start_work(len(done))
        started = time.monotonic()
        steps = 0
        index = {seed: i for i, seed in enumerate(cfg.seeds)}
        scene = local_scene(cfg.scene) if cfg.scene and todo else None  # the registered bytes, verified
        if todo:
            run.info(f"scene {cfg.scene.ref if cfg.scene else 'the catalog scene as it is now (unregistered)'}")
        for episode_task, seeds in seeds_by_task(task, cfg.randomize, todo):
            with make_vector_simulator(
                cfg.backend, episode_task, num_envs=min(num_envs, len(seeds)), device=device, cameras=cfg.cameras, scene=scene
            ) as sim:
                fps = max(1, round(1.0 / sim.control_dt))
                policy = load_batch_policy(cfg.policy, sim.num_envs, episode_task.max_steps, episode_task)
                for episode in run_episodes(sim, policy, seeds):
                    commit_episode(cfg, episode_task, episode, index[episode.seed], fps)
                    steps += episode.length
                    done.add(episode.seed)
                    run.commit(len(done), seed=episode.seed)
                    if run.preempt_requested:
                        raise Preempted()
        trials = [read_json(trial_uri(cfg.output_uri, s)) for s in cfg.seeds]
        successes = sum(t["success"] for t in trials)
        seconds = time.monotonic() - started
        run.finish(
            len(trials),
            {},
            metadata={
                "episodes": len(trials),
                "successes": successes,
                "success_rate": round(successes / len(trials), 4) if trials else 0.0,
                "mean_return": round(float(np.mean([t["return"] for t in trials])), 3) if trials else 0.0,
                "failure_modes": json.dumps(dict(Counter(t["failure_mode"] or "success" for t in trials))),
                "backend": cfg.backend,
                "scene_ref": cfg.scene.ref if cfg.scene else "",
                "num_envs": num_envs if todo else 0,
                "device": device,
                "cameras": ", ".join(cfg.cameras) or "none",
                "env_steps_this_attempt": steps,
                "env_steps_per_second": round(steps / seconds, 1) if seconds > 0 and steps else 0.0,
            },
        )


if __name__ == "__main__":
    main()
