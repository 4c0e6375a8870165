"""Pretrain the Cell foundation model by masked-expression modelling (steady pool).

Run by the platform through Dagster Pipes; by hand: `python -m cell_lane.workloads.pretrain --extras extras.json`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from cell_lane.omics import read_dataset
from cell_lane.workloads.config import PretrainConfig
from cell_lane.workloads.models import MaskedExpressionModel
from shared_resources.runtime.torch_state import pick_device, restore_training, training_files
from shared_resources.runtime.workload import WorkloadRun


def main() -> None:
    with WorkloadRun() as run:
        cfg = run.config_as(PretrainConfig)
        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        device = pick_device(cfg.device)

        checkpoint = run.resume()
        if checkpoint is not None and checkpoint.final:
            run.report_already_complete(checkpoint)
            return

        adata = read_dataset(cfg.dataset_uri)
        expression = torch.from_numpy(np.asarray(adata.X, dtype=np.float32)).to(device)
        n_cells, n_genes = expression.shape
        model = MaskedExpressionModel(n_genes, cfg.embedding_dim, cfg.hidden).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate)
        generator = torch.Generator().manual_seed(cfg.seed)
        losses: list[float] = []
        start = 0
        if checkpoint is not None:
            restore_training(checkpoint.tensors, "model", model, optimizer, generator)
            losses = list(checkpoint.meta.get("losses", []))
            start = checkpoint.step

        def state() -> dict:
            return training_files("model", model, optimizer, generator)

        autocast = torch.autocast(device_type="cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
        run.info(f"pretraining on {n_cells} cells × {n_genes} genes, {device}, steps {start}→{cfg.steps}")
        for step in range(start, cfg.steps):
            rows = torch.randint(0, n_cells, (cfg.batch_size,), generator=generator)
            mask = (torch.rand(cfg.batch_size, n_genes, generator=generator) < cfg.mask_fraction).to(device)
            batch = expression[rows.to(device)]
            with autocast:
                prediction = model(batch.masked_fill(mask, 0.0))
            loss = nn.functional.mse_loss(prediction.float()[mask], batch[mask])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(round(loss.item(), 6))
            run.step_done(step + 1, state, meta=lambda: {"losses": losses}, loss=losses[-1])

        curve = losses[:: max(1, len(losses) // 20)]
        run.finish(
            cfg.steps,
            state(),
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
