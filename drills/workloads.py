"""The real runs a drill faults: the lanes' own workloads, on small inputs made for the drill.

- `pretrain`: the Cell lane's foundation-model pretraining (`cell_lane.workloads.pretrain`)
  on a synthetic expression matrix written as AnnData on zarr;
- `pretrain-gang`: the same pretraining as a gang of 2 nodes × 1 rank (data-parallel, sharded
  checkpoints: `docs/gangs.md`), for the scenarios that fault one node of a gang;
- `rollouts`: a Robotics rollout sweep (`robotics_lane.workloads.rollouts`, MuJoCo cart-pole,
  scripted expert) — each finished episode is committed on its own;
- `policy`: Robotics policy training (`robotics_lane.workloads.train_policy`) on the episodes
  of an uninterrupted rollout sweep, assembled as a LeRobot v3 dataset.

Each workload says how to build its step for a drill, what counts as a unit of work, and
how to digest its end state (final checkpoint tensors, or the episode set) so a faulted run
can be compared with an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workload_runtime.checkpoints import MANIFEST, CheckpointStore
from control_plane.catalog.step_spec import TRAINING_IMPORTS, StepSpec
from workload_runtime.storage import fs_for, glob_uris, read_bytes, read_json

SIZES = ("small", "full")


@dataclass(frozen=True)
class DrillWorkload:
    name: str  # pretrain | rollouts | policy
    unit: str  # steps | episodes
    total: int  # units in a whole run
    checkpoint_every: int  # units between checkpoints (1 for rollouts: each episode commits)
    trigger: int  # the fault's checkpoint: torn while written, or hit half an interval after it (runner.fault_unit)
    nodes: int = 1  # above one: the step runs as a gang of `nodes` × 1 rank

    def spec(self, drill: str, inputs: dict[str, str], output_uri: str, **overrides: Any) -> StepSpec:
        return build_spec(self, drill, inputs, output_uri, **overrides)


def workload(name: str, size: str = "small") -> DrillWorkload:
    if size not in SIZES:
        raise ValueError(f"unknown drill size {size!r}; use one of {', '.join(SIZES)}")
    small = size == "small"
    table = {
        "pretrain": DrillWorkload("pretrain", "steps", 900 if small else 3000, 100 if small else 250, 300 if small else 1000),
        "pretrain-gang": DrillWorkload("pretrain-gang", "steps", 300 if small else 1500, 50 if small else 250, 100 if small else 500, nodes=2),
        "rollouts": DrillWorkload("rollouts", "episodes", 8 if small else 16, 1, 3 if small else 6),
        "policy": DrillWorkload("policy", "steps", 900 if small else 3000, 100 if small else 250, 300 if small else 1000),
    }
    if name not in table:
        raise ValueError(f"unknown drill workload {name!r}; use one of {', '.join(table)}")
    return table[name]


WORKLOADS = ("pretrain", "rollouts", "policy", "pretrain-gang")
_SEEDS_BASE = 4242_00
_TASK = {"name": "cartpole", "max_steps": 200, "params": {}}


def build_spec(w: DrillWorkload, drill: str, inputs: dict[str, str], output_uri: str, **overrides: Any) -> StepSpec:
    """The step a drill runs. `output_uri` is where a rollout sweep writes its episodes."""
    common: dict[str, Any] = {
        "tenant": "drills",
        "gpus": 1,
        "checkpoint_every_steps": w.checkpoint_every,
        "checkpoint_seconds": 0.05,
        "expected_hours": 0.01,
        "max_preemptions": 3,
        "telemetry_seconds": 0.1,
    }
    if w.name in ("pretrain", "pretrain-gang"):
        spec = {
            "name": f"drills.{drill}.{w.name}",
            "entry_point": "cell_lane.workloads.pretrain",
            "imports": [*TRAINING_IMPORTS, "anndata"],  # as the Cell lane's foundation_model asset
            "config": {"dataset_uri": inputs["omics"], "steps": w.total, "batch_size": 128, "seed": 7},
        }
        if w.nodes > 1:  # one rank per node, on the CPU (gloo): the drill clusters have no GPUs
            spec |= {"nodes": w.nodes, "gpus": 0}
    elif w.name == "policy":
        spec = {
            "name": f"drills.{drill}.policy",
            "entry_point": "robotics_lane.workloads.train_policy",
            "imports": [*TRAINING_IMPORTS, "pandas", "pyarrow"],  # as the Robotics lane's policy asset
            "config": {"datasets": [inputs["episodes"]], "steps": w.total, "batch_size": 256, "seed": 7},
        }
    else:
        from robotics_lane.defs.assets.rollouts import sweep_imports

        spec = {
            "name": f"drills.{drill}.rollouts",
            "entry_point": "robotics_lane.workloads.rollouts",
            "imports": sweep_imports("mujoco"),
            "config": {
                "backend": "mujoco",
                "seeds": [_SEEDS_BASE + i for i in range(w.total)],
                "output_uri": output_uri,
                "task": _TASK,
                "policy": {"kind": "scripted", "operator_noise": 0.15},
            },
        }
    return StepSpec(**{**common, **spec, **overrides})


# Inputs ------------------------------------------------------------------------------------


def make_omics(uri: str, cells: int = 400, genes: int = 200, seed: int = 11) -> str:
    """A synthetic expression matrix (log-normal counts, two cell types) as AnnData on zarr."""
    import anndata as ad
    import pandas as pd

    from cell_lane.omics import write_dataset

    fs, path = fs_for(uri)
    if fs.exists(posixpath.join(path, ".zattrs")) or fs.exists(posixpath.join(path, "zarr.json")):
        return uri
    rng = np.random.default_rng(seed)
    kind = rng.integers(0, 2, cells)
    profile = rng.lognormal(0.0, 1.0, (2, genes))
    x = np.log1p(rng.poisson(profile[kind] * 3.0)).astype(np.float32)
    adata = ad.AnnData(
        X=x,
        obs=pd.DataFrame({"cell_type": pd.Categorical(np.where(kind == 0, "A", "B"))}, index=[f"cell-{i}" for i in range(cells)]),
        var=pd.DataFrame(index=[f"gene-{j}" for j in range(genes)]),
    )
    write_dataset(adata, uri)  # as the Cell lane writes its datasets (zarr format 3)
    return uri


def assemble_episodes(output_uri: str, dataset_uri: str) -> str:
    """The episodes of a finished rollout sweep as one LeRobot v3 dataset (for policy training)."""
    from robotics_lane.defs.assets.rollouts import TASK_LABEL
    from robotics_lane.episodes.shards import assemble_dataset
    from robotics_lane.sim.base import ACTION_NAMES, STATE_NAMES

    fs, path = fs_for(posixpath.join(dataset_uri, "meta", "info.json"))
    if fs.exists(path):
        return dataset_uri
    trials = sorted((read_json(u) for u in glob_uris(posixpath.join(output_uri, "trials", "seed-*.json"))), key=lambda t: t["seed"])
    if not trials:
        raise RuntimeError(f"no rollout episodes under {output_uri}: run the rollouts drill baseline first")
    assemble_dataset(
        dataset_uri, [t["episode_file"] for t in trials], tasks=[TASK_LABEL], fps=trials[0]["fps"],
        robot_type="cartpole", state_names=STATE_NAMES, action_names=ACTION_NAMES,
    )
    return dataset_uri


# End states --------------------------------------------------------------------------------


def checkpoint_digest(checkpoint_uri: str) -> str:
    """sha256 over the final checkpoint's tensor files (their own sha256s from the manifest,
    which the store verified on read): model, optimizer and random state."""
    checkpoint = CheckpointStore(checkpoint_uri).latest_valid()
    if checkpoint is None or not checkpoint.final:
        return ""
    manifest = json.loads(read_bytes(posixpath.join(checkpoint.uri, MANIFEST)))
    files = sorted((name, entry["sha256"]) for name, entry in manifest["files"].items())
    return hashlib.sha256(json.dumps([checkpoint.step, files]).encode()).hexdigest()


def episodes_digest(output_uri: str) -> str:
    """sha256 over the episode set: every trial record (less the file path) and every
    episode's frames, in seed order."""
    import pyarrow.parquet as pq

    digest = hashlib.sha256()
    trials = sorted((read_json(u) for u in glob_uris(posixpath.join(output_uri, "trials", "seed-*.json"))), key=lambda t: t["seed"])
    for trial in trials:
        digest.update(json.dumps({k: v for k, v in trial.items() if k != "episode_file"}, sort_keys=True).encode())
        fs, path = fs_for(trial["episode_file"])
        with fs.open(path, "rb") as fh:
            table = pq.read_table(fh)
        for name in sorted(table.column_names):
            digest.update(name.encode())
            digest.update(json.dumps(table.column(name).to_pylist()).encode())
    return digest.hexdigest() if trials else ""


def end_state_digest(w: DrillWorkload, checkpoint_uri: str, output_uri: str) -> str:
    return episodes_digest(output_uri) if w.name == "rollouts" else checkpoint_digest(checkpoint_uri)


def prepare_inputs(drill_root: Path, needs_episodes_from: str | None = None, size: str = "small") -> dict[str, str]:
    """The drill's inputs under `drill_root/inputs/`: the omics matrix, and (for policy
    training) the episodes of an uninterrupted rollout sweep written to `needs_episodes_from`."""
    inputs = {"omics": make_omics(str(drill_root / "inputs" / "omics.zarr"))}
    if needs_episodes_from:
        inputs["episodes"] = assemble_episodes(needs_episodes_from, str(drill_root / "inputs" / f"episodes-{size}"))
    return inputs
