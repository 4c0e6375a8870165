"""Build `eval.jsonl` for `label-failure` from real trials of the robot-cell stand-in.

    .venv/bin/python robotics_lane/tasks/label-failure/make_eval.py [--seed 0] [--per-class 20]

What it does, deterministically for a seed:

1. Draws `--policies` policy versions: the scripted balancing controller with perturbed gains
   (as a behaviour-cloned policy imitates it imperfectly), some with operator noise, some
   centring the cart off the middle of the track (a policy that drifts).
2. Writes one evaluation request per version, as `robotics/real_robot_eval_request` does (the
   asset's held-out tasks and seeds, `--trials` trials per task), to a storage root in memory,
   and lets `RobotCellStandIn` answer them: its own `trials.jsonl` and LeRobot episodes, on the
   real-robot physics the set was built with (`EVAL_ROBOT_PHYSICS`: heavier pole, weaker
   actuator, sensor noise; the cell's own physics has changed since, and a set of labelled
   failures does not need to follow it). The other thing swapped is the policy loader: the
   requests name these scripted versions instead of checkpoints.
3. Reads the results back as `robotics/real_robot_evaluation` does, sums every failed trial up
   with `robotics_lane.episodes.summaries.episode_summary`, labels it with the task's rule
   (`standin_skill.answer`), and keeps `--per-class` trials of each failure mode (in a seeded
   shuffled order), so the classes are balanced. Rows are written sorted by id.

Nothing is left on disk but `eval.jsonl`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

HERE = Path(__file__).resolve().parent
EVAL_PATH = HERE / "eval.jsonl"
ROOT = "memory://sinewgrid-label-failure-eval"
# The robot cell's physics when eval.jsonl was built (its failures cover every class evenly).
EVAL_ROBOT_PHYSICS = {"pole_mass_scale": 1.35, "actuator_gain": 0.5, "observation_noise": 0.09}


def load_skill() -> Any:
    """This folder's `standin_skill.py`, imported by path (as the stand-in server does)."""
    spec = importlib.util.spec_from_file_location("label_failure_standin_skill", HERE / "standin_skill.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def policy_versions(seed: int, count: int) -> list[dict[str, Any]]:
    """`count` policy versions: controller gains, operator noise and cart target, drawn from `seed`."""
    rng = random.Random(seed)
    versions = []
    for i in range(count):
        versions.append(
            {
                "policy_version": f"bc-s{seed}-v{i + 1:02d}",
                "gains": {
                    "k_angle": round(rng.uniform(3.0, 12.0), 2),
                    "k_angular_velocity": round(rng.uniform(0.3, 2.0), 2),
                    "k_position": round(rng.uniform(-0.2, 0.6), 2),
                    "k_velocity": round(rng.uniform(0.2, 1.8), 2),
                    "target_position": rng.choice([0.0, 0.0, 0.0, 0.5, -0.5]),
                },
                "operator_noise": rng.choice([0.0, 0.2, 0.4]),
            }
        )
    return versions


def _scripted_loader(versions: list[dict[str, Any]]):
    """A `load_policy` for the cell that builds the scripted version a request's URI names."""
    from robotics_lane.sim.controllers import BalancingController, NoisyOperator

    by_uri = {f"scripted://{v['policy_version']}": v for v in versions}

    def load(spec: dict[str, Any], seed: int):
        version = by_uri[spec["uri"]]
        controller = BalancingController(**version["gains"])
        noise = float(version["operator_noise"])
        return NoisyOperator(controller, noise, seed) if noise > 0 else controller

    return load


def run_cell(versions: list[dict[str, Any]], trials_per_task: int, root: str = ROOT) -> list[dict[str, Any]]:
    """Every trial the robot-cell stand-in runs for these versions, summed up (failed or not).

    Each item: the summary (`episode_summary`), with the trial's `seed` and the raw record.
    """
    import posixpath

    from robotics_lane.defs.assets.real_robot import HELD_OUT_TASKS
    from robotics_lane.episodes.lerobot_v3 import read_dataset
    from robotics_lane.episodes.summaries import episode_summary
    from robotics_lane.standins import robot_cell
    from workload_runtime.storage import Storage, read_bytes, write_json_atomic

    storage = Storage.at(root)
    try:
        for version in versions:
            eval_id = f"eval-{version['policy_version']}"
            write_json_atomic(
                storage.outbox("robot_eval", eval_id, "request.json"),
                {
                    "eval_id": eval_id,
                    "policy_version": version["policy_version"],
                    "policy_checkpoint_uri": f"scripted://{version['policy_version']}",
                    "trials_per_task": trials_per_task,
                    "tasks": HELD_OUT_TASKS,
                    "respond_to": storage.landing(robot_cell.KIND, eval_id),
                },
            )
        with mock.patch.object(robot_cell, "load_policy", _scripted_loader(versions)), mock.patch.object(robot_cell, "REAL_ROBOT_PHYSICS", EVAL_ROBOT_PHYSICS):
            answered = robot_cell.RobotCellStandIn(storage, cameras=()).answer_requests()  # states only: no frames to render
        tasks = {t["task_id"]: t["task"] for t in HELD_OUT_TASKS}
        trials = []
        for version in versions:
            eval_id = f"eval-{version['policy_version']}"
            assert eval_id in answered, f"the robot cell did not answer {eval_id}"
            folder = storage.landing(robot_cell.KIND, eval_id)
            info, episodes = read_dataset(posixpath.join(folder, "episodes"))
            for line in read_bytes(posixpath.join(folder, "trials.jsonl")).decode().splitlines():
                record = json.loads(line)
                summary = episode_summary(
                    record, episodes[int(record["episode_index"])], eval_id=eval_id, policy_version=version["policy_version"],
                    max_steps=int(tasks[record["task_id"]]["max_steps"]), fps=info.fps,
                )
                trials.append({"summary": summary, "seed": int(record["seed"]), "record": record})
        return trials
    finally:
        if storage.fs.exists(storage.root):
            storage.fs.rm(storage.root, recursive=True)


def build_rows(seed: int = 0, policies: int = 14, trials_per_task: int = 12, per_class: int = 24) -> list[dict[str, Any]]:
    """The evaluation rows: `per_class` failed trials of each failure mode, sorted by id."""
    skill = load_skill()
    failed = [t["summary"] for t in run_cell(policy_versions(seed, policies), trials_per_task) if t["summary"]["ended_by"] != "completed"]
    random.Random(seed).shuffle(failed)
    kept: dict[str, list[dict[str, Any]]] = {mode: [] for mode in skill.FAILURE_MODES}
    for summary in failed:
        mode = skill.answer(summary)["failure_mode"]
        if len(kept[mode]) < per_class:
            kept[mode].append({"id": summary["trial_id"], "input": summary, "expected": {"failure_mode": mode}})
    short = {mode: len(rows) for mode, rows in kept.items() if len(rows) < per_class}
    if short:
        raise SystemExit(f"too few failed trials of {short} (of {len(failed)} failures); run more --policies or --trials")
    return sorted((row for rows in kept.values() for row in rows), key=lambda row: row["id"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", type=int, default=14, help="policy versions to draw")
    parser.add_argument("--trials", type=int, default=12, help="trials per held-out task and version")
    parser.add_argument("--per-class", type=int, default=24, help="rows kept per failure mode")
    parser.add_argument("--out", type=Path, default=EVAL_PATH)
    args = parser.parse_args(argv)
    rows = build_rows(args.seed, args.policies, args.trials, args.per_class)
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    counts = Counter(row["expected"]["failure_mode"] for row in rows)
    print(f"{len(rows)} rows -> {args.out}: {dict(sorted(counts.items()))}", file=sys.stderr)


if __name__ == "__main__":
    main()
