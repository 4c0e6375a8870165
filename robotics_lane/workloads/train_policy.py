"""Train a policy by behaviour cloning on demonstrations (pool with fast interconnect).

Reads LeRobot v3 datasets (teleop sessions, successful rollouts, relabelled failures), fits an
MLP from state to action, checkpoints on cadence and on SIGTERM, resumes exactly.

Runs as one process or data-parallel as a gang (`torchrun --nproc-per-node N -m
robotics_lane.workloads.train_policy --extras extras.json`, or a step with `nodes` ×
`ranks_per_node`): every rank draws the same global batch from the shared seed and trains on
its share, each rank's loss is its sum over the global count, so DDP's averaged gradient is the
one-process gradient. Checkpoints are sharded (`torch.distributed.checkpoint`) and load onto
any number of ranks; the final one is safetensors for the registry.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from robotics_lane.episodes.lerobot_v3 import read_dataset
from robotics_lane.mlp_policy import MLPPolicy
from robotics_lane.workloads.config import TrainPolicyConfig
from workload_runtime.torch_state import resume_training, seeded_torch, sharded_state, training_files
from workload_runtime.workload import ShardedState, WorkloadRun


def load_demonstrations(uris: list[str], successful_only: bool) -> tuple[np.ndarray, np.ndarray, int]:
    states, actions, episodes = [], [], 0
    for uri in uris:
        _, dataset_episodes = read_dataset(uri)
        for episode in dataset_episodes:
            if successful_only and episode.success is False:
                continue
            states.append(episode.observation_state)
            actions.append(episode.action)
            episodes += 1
    if not states:
        raise SystemExit(f"no usable demonstrations in {uris}; ingest teleop sessions or run a rollout sweep first")
    return np.concatenate(states).astype(np.float32), np.clip(np.concatenate(actions), -1, 1).astype(np.float32), episodes


def main() -> None:
    with WorkloadRun() as run:
        cfg = run.config_as(TrainPolicyConfig)
        generator = seeded_torch(cfg.threads, cfg.seed)
        gang = run.gang  # None when it runs as one process
        checkpoint = run.resume()
        local = [run.cached(uri) for uri in cfg.datasets]  # from the node cache when an attempt here read them before
        states, actions, n_episodes = load_demonstrations(local, cfg.successful_only)
        x, y = torch.from_numpy(states), torch.from_numpy(actions)
        model = MLPPolicy(cfg.hidden)
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate)
        start = resume_training(checkpoint, "policy", model, optimizer, generator)
        losses: list[float] = list(checkpoint.meta.get("losses", [])) if checkpoint else []
        trained = gang.wrap(model) if gang else model
        ranks = gang.world_size if gang else 1

        def state() -> dict | ShardedState:
            # One process keeps its safetensors checkpoints; a gang writes its shards together.
            return ShardedState(sharded_state(model, optimizer, generator)) if gang else training_files("policy", model, optimizer, generator)

        run.info(f"behaviour cloning on {len(x)} frames from {n_episodes} episodes × {ranks} rank(s), steps {start}→{cfg.steps}")
        for step in range(start, cfg.steps):
            rows = torch.randint(0, len(x), (cfg.batch_size,), generator=generator)
            if gang:
                share = rows[gang.shard(torch.arange(cfg.batch_size))]
                # This rank's sum over the global batch's element count: DDP's mean over ranks is the global mean.
                loss = nn.functional.mse_loss(trained(x[share]), y[share], reduction="sum") * ranks / (cfg.batch_size * y.shape[1])
            else:
                loss = nn.functional.mse_loss(model(x[rows]), y[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(round((gang.all_sum(loss.item()) if gang else loss.item()) / ranks, 6))
            run.step_done(step + 1, state, meta=lambda: {"losses": losses, "hidden": cfg.hidden}, loss=losses[-1])

        run.finish(
            cfg.steps,
            training_files("policy", model, optimizer, generator),  # safetensors, for the registry
            meta={"losses": losses, "hidden": cfg.hidden, "config": cfg.model_dump()},
            metadata={
                "final_loss": round(float(np.mean(losses[-50:])), 6),
                "first_loss": round(float(np.mean(losses[:50])), 6),
                "frames": int(len(x)),
                "episodes": n_episodes,
                "datasets": len(cfg.datasets),
            },
        )


if __name__ == "__main__":
    main()
