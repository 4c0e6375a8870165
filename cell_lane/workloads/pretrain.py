"""Pretrain the Cell foundation model by masked-expression modelling (steady pool).

Run by the platform through Dagster Pipes; by hand: `python -m cell_lane.workloads.pretrain --extras extras.json`,
or data-parallel on N processes: `torchrun --nproc-per-node N -m cell_lane.workloads.pretrain --extras extras.json`.

Data-parallel runs train the same model as one process: every rank draws the same global batch
and mask from the shared seed, trains on its share, and the loss is the mean over the global
batch's masked values (each rank's sum over the global count), so DDP's averaged gradient is the
one-process gradient. Checkpoints are sharded (`torch.distributed.checkpoint`) and load onto any
number of ranks; the final one is safetensors for the registry.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from cell_lane.omics import dense_rows, read_dataset
from cell_lane.workloads.config import PretrainConfig
from cell_lane.workloads.models import MaskedExpressionModel
from workload_runtime.torch_state import pick_device, resume_training, seeded_torch, sharded_state, training_files
from workload_runtime.workload import ShardedState, WorkloadRun


def main() -> None:
    with WorkloadRun() as run:
        cfg = run.config_as(PretrainConfig)
        generator = seeded_torch(cfg.threads, cfg.seed)
        gang = run.gang  # None when it runs as one process
        device = gang.device if gang else pick_device(cfg.device)
        checkpoint = run.resume()

        adata = read_dataset(run.cached(cfg.dataset_uri))  # from the node cache when an attempt here read it before
        expression = adata.X  # stays sparse in host memory; each batch is densified on its own
        n_cells, n_genes = expression.shape
        model = MaskedExpressionModel(n_genes, cfg.embedding_dim, cfg.hidden).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate)
        start = resume_training(checkpoint, "model", model, optimizer, generator)
        losses: list[float] = list(checkpoint.meta.get("losses", [])) if checkpoint else []
        trained = gang.wrap(model) if gang else model
        ranks = gang.world_size if gang else 1

        def state() -> ShardedState:
            return ShardedState(sharded_state(model, optimizer, generator))

        autocast = torch.autocast(device_type="cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
        run.info(f"pretraining on {n_cells} cells × {n_genes} genes, {device} × {ranks}, steps {start}→{cfg.steps}")
        for step in range(start, cfg.steps):
            rows = torch.randint(0, n_cells, (cfg.batch_size,), generator=generator)
            mask = (torch.rand(cfg.batch_size, n_genes, generator=generator) < cfg.mask_fraction).to(device)
            masked_values = mask.sum()  # over the global batch
            share = gang.shard(torch.arange(cfg.batch_size)) if gang else slice(None)
            batch = torch.from_numpy(dense_rows(expression, rows[share].numpy())).to(device)
            mask = mask[share]
            with autocast:
                prediction = trained(batch.masked_fill(mask, 0.0))
            loss = nn.functional.mse_loss(prediction.float()[mask], batch[mask], reduction="sum") * ranks / masked_values
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(round((gang.all_sum(loss.item()) if gang else loss.item()) / ranks, 6))
            run.step_done(step + 1, state, meta=lambda: {"losses": losses}, loss=losses[-1])

        curve = losses[:: max(1, len(losses) // 20)]
        run.finish(
            cfg.steps,
            training_files("model", model, optimizer, generator),  # safetensors, for the registry
            meta={"losses": losses, "config": cfg.model_dump()},
            metadata={
                "final_loss": round(float(np.mean(losses[-20:])), 5),
                "first_loss": round(float(np.mean(losses[:20])), 5),
                "steps": cfg.steps,
                "n_cells": int(n_cells),
                "n_genes": int(n_genes),
                "embedding_dim": cfg.embedding_dim,
                "device": str(device),
                "loss_curve": {
                    "type": "md",
                    "raw_value": "| step | masked MSE |\n|---|---|\n"
                    + "\n".join(f"| {i * max(1, len(losses) // 20) + 1} | {v:.4f} |" for i, v in enumerate(curve)),
                },
            },
        )


if __name__ == "__main__":
    main()
