"""LoopRehearsal — the Robotics loop without Dagster, for tests and for trying changes in minutes.

It runs what the loop runs, on one storage root, in the order the assets would: the teleop
stand-in's sessions, a sweep through the rollout workload (`SweepConfig.rollout_config`, as the
nightly sweep builds it), behaviour cloning through the training workload (`TrainPolicyConfig`,
as `robotics/policy` builds it), an evaluation in simulation through the rollout workload, an
evaluation on the robot-cell stand-in through its outbox request, and corrective demonstrations
of the failed trials through the relabelling request the real-robot evaluation writes. Every
workload runs as its own process, started as a person would (`python -m MODULE --extras FILE`).

What it leaves out is the platform: no placement, ledger, registry, validation or lineage.
"""

from __future__ import annotations

import json
import posixpath
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from robotics_lane.episodes.shards import assemble_dataset
from robotics_lane.robot_cell_protocol import HELD_OUT_TASKS, SIM_EVAL_FIRST_SEED, eval_request, relabel_request
from robotics_lane.sim.base import ACTION_NAMES, STATE_NAMES
from robotics_lane.standins.robot_cell import KIND as ROBOT_EVAL, RobotCellStandIn
from robotics_lane.standins.teleop_operator import TeleopOperatorStandIn
from robotics_lane.sweeps import TASK_LABEL, SweepConfig
from robotics_lane.workloads.config import PolicySettings, RolloutConfig, TrainPolicyConfig
from robotics_lane.workloads.rollout_output import trial_uri
from workload_runtime.storage import Storage, read_bytes, read_json, write_json_atomic


@dataclass
class LoopRehearsal:
    """One rehearsal on ``storage``; workload inputs and logs go to ``workdir``.

    ``cameras``: what the teleop rig, the robot cell and the sweeps film (the front camera, as in the demo);
    ``()`` records states only, the same episodes without frames to render and encode, for a
    rehearsal that judges success rates, not videos."""

    storage: Storage
    workdir: Path
    settings: PolicySettings = field(default_factory=PolicySettings)
    cameras: tuple[str, ...] = ("front",)

    def _operator(self) -> TeleopOperatorStandIn:
        return TeleopOperatorStandIn(self.storage, cameras=self.cameras)

    def teleop_sessions(self, sessions: int = 2, episodes: int = 5) -> list[str]:
        """The teleop stand-in's first sessions (as `sinewgrid demo` records them): their dataset URIs."""
        ids = self._operator().record_sessions(sessions=sessions, episodes=episodes, include_bad=False)
        return [self.storage.landing("teleop", i) for i in ids]

    def sweep(self, name: str, sweep: SweepConfig, night: str) -> str:
        """One night of a sweep, in one shard: the assembled LeRobot dataset's URI."""
        output = self.storage.uri("rollouts", night, name, "shard-0")
        seeds = sweep.seeds(night)
        sweep = replace(sweep, cameras=tuple(c for c in sweep.cameras if c in self.cameras))
        self._run("robotics_lane.workloads.rollouts", sweep.rollout_config(seeds, output).model_dump(), f"sweep-{name}-{night}")
        trials = [read_json(trial_uri(output, s)) for s in seeds]
        dataset = self.storage.uri("rollouts", night, name, "dataset")
        assemble_dataset(dataset, [t["episode_file"] for t in trials], tasks=[TASK_LABEL], fps=trials[0]["fps"], robot_type="cartpole",
                         state_names=STATE_NAMES, action_names=ACTION_NAMES)
        return dataset

    def train(self, version: str, datasets: list[str]) -> str:
        """Behaviour cloning on ``datasets`` with the rehearsal's settings: the checkpoint folder."""
        checkpoint = self.storage.uri("checkpoints", "policy", version)
        config = TrainPolicyConfig.of(self.settings, datasets=datasets)
        self._run("robotics_lane.workloads.train_policy", config.model_dump(), f"train-{version}", checkpoint_uri=checkpoint)
        return checkpoint

    def sim_evaluation(self, version: str, checkpoint: str, trials: int = 20) -> pd.DataFrame:
        """The policy in nominal simulation on the held-out seeds `robotics/sim_evaluation` uses."""
        output = self.storage.uri("evaluations", "sim", version)
        seeds = [SIM_EVAL_FIRST_SEED + i for i in range(trials)]
        config = RolloutConfig(backend="mujoco", seeds=seeds, output_uri=output, task={"name": "cartpole", "max_steps": 200},
                               policy={"kind": "checkpoint", "uri": checkpoint})
        self._run("robotics_lane.workloads.rollouts", config.model_dump(), f"sim-eval-{version}")
        return pd.DataFrame([read_json(trial_uri(output, s)) for s in seeds])

    def real_evaluation(self, version: str, checkpoint: str, trials_per_task: int) -> pd.DataFrame:
        """The policy on the robot-cell stand-in: its request in the outbox, the cell's trials back."""
        eval_id = f"eval-{version}"
        folder = self.storage.landing(ROBOT_EVAL, eval_id)
        write_json_atomic(self.storage.outbox("robot_eval", eval_id, "request.json"), eval_request(eval_id, version, checkpoint, trials_per_task, folder))
        RobotCellStandIn(self.storage, cameras=self.cameras).answer_requests()
        lines = read_bytes(posixpath.join(folder, "trials.jsonl")).decode().splitlines()
        return pd.DataFrame([json.loads(line) for line in lines]).assign(eval_id=eval_id)

    def corrective_demonstrations(self, trials: pd.DataFrame) -> list[str]:
        """The relabelling request for an evaluation's failed trials, answered by the teleop
        stand-in: the corrective sessions' dataset URIs (none when every trial succeeded)."""
        eval_id = str(trials["eval_id"].iloc[0])
        relabel = relabel_request(eval_id, trials, {t["task_id"]: t["task"] for t in HELD_OUT_TASKS})
        if relabel is None:
            return []
        write_json_atomic(self.storage.outbox("relabel", eval_id, "request.json"), relabel)
        return [self.storage.landing("teleop", s) for s in self._operator().answer_relabel_requests()]

    def _run(self, module: str, config: dict, label: str, checkpoint_uri: str | None = None) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        extras = self.workdir / f"{label}.json"
        extras.write_text(json.dumps({"config": config, "checkpoint_uri": checkpoint_uri or self.storage.uri("checkpoints", label)}))
        log = self.workdir / f"{label}.log"
        with log.open("wb") as out:
            done = subprocess.run([sys.executable, "-m", module, "--extras", str(extras)], stdout=out, stderr=subprocess.STDOUT, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{module} ({label}) exited with {done.returncode}; its output ({log}):\n{log.read_text(errors='replace')[-3000:]}")


def rehearse(root: Path, night: str, versions: int, randomise: bool = True) -> list[dict]:
    """Teleop sessions and one night of the MuJoCo sweep (randomised or not), then ``versions``
    policy versions, each trained on everything so far and evaluated in simulation and on the
    robot cell, its failed trials relabelled for the next (until one fails no trial): one row per
    version."""
    from robotics_lane.robot_cell_protocol import TRIALS_PER_TASK
    from robotics_lane.stats import wilson_interval
    from robotics_lane.sweeps import SWEEPS

    rehearsal = LoopRehearsal(Storage.at(str(root / "home")), root / "work")
    sweep = SWEEPS["cartpole-mujoco-randomized"]
    data = rehearsal.teleop_sessions() + [rehearsal.sweep("mujoco", sweep if randomise else replace(sweep, randomize={}), night)]
    rows = []
    for number in range(1, versions + 1):
        checkpoint = rehearsal.train(f"v{number}", data)
        real, sim = rehearsal.real_evaluation(f"v{number}", checkpoint, TRIALS_PER_TASK), rehearsal.sim_evaluation(f"v{number}", checkpoint)
        row = {"night": night, "randomised": randomise, "version": number, "trained_on": len(data)}
        for where, trials in (("sim", sim), ("real", real)):
            successes = int(trials["success"].sum())
            low, high = wilson_interval(successes, len(trials))
            row[where] = f"{successes}/{len(trials)} [{low:.0%}–{high:.0%}]"
        rows.append(row)
        corrective = rehearsal.corrective_demonstrations(real)
        if not corrective:
            break  # every trial succeeded: nothing to relabel, the next version would be this one
        data = data + corrective
    return rows


def main(argv: list[str] | None = None) -> None:
    """`python -m robotics_lane.standins.loop_rehearsal --night 2026-11-20 --night 2026-11-21`:
    the loop's real success version by version for each night, with and without randomisation."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--night", action="append", default=None, help="a sweep night (repeat); default 2026-11-20")
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--no-baseline", action="store_true", help="skip the policy trained on the sweep without randomisation")
    args = parser.parse_args(argv)
    rows = []
    for night in args.night or ["2026-11-20"]:
        for randomise in (True,) if args.no_baseline else (True, False):
            with tempfile.TemporaryDirectory(prefix="sinewgrid-rehearsal-") as tmp:
                rows += rehearse(Path(tmp), night, args.versions if randomise else 1, randomise)
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
