"""Fine-tune the foundation model to predict assay effects per gene (burst pool).

K-fold: each fold trains an effect head (plus a light fine-tune of the gene embeddings)
on the other folds' genes. Out-of-fold predictions give the held-out error; the folds'
spread on genes never assayed gives the uncertainty the next-plate proposal uses.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import torch
from torch import nn

from cell_lane.omics import read_dataset
from cell_lane.workloads.config import FinetuneConfig
from cell_lane.workloads.models import EffectHead
from workload_runtime.checkpoints import CheckpointStore
from workload_runtime.storage import write_bytes_atomic
from workload_runtime.torch_state import load_optimizer_tensors, optimizer_tensors
from workload_runtime.workload import WorkloadRun


def _fold_of(n: int, folds: int, seed: int) -> np.ndarray:
    order = np.random.default_rng(seed).permutation(n)
    assignment = np.empty(n, dtype=np.int64)
    assignment[order] = np.arange(n) % folds
    return assignment


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 3:
        return float("nan")
    return float(pd.Series(a).rank().corr(pd.Series(b).rank()))


def main() -> None:
    with WorkloadRun() as run:
        cfg = run.config_as(FinetuneConfig)
        torch.set_num_threads(cfg.threads)
        checkpoint = run.resume()

        foundation = CheckpointStore(cfg.foundation_checkpoint_uri, warn=run.warning).latest_valid()
        if foundation is None or not foundation.final:
            raise SystemExit(f"no finished foundation checkpoint under {cfg.foundation_checkpoint_uri}; materialize cell/foundation_model first")
        embeddings = foundation.tensors["model"]["gene_embedding"].float()

        var = read_dataset(cfg.dataset_uri, lazy_x=True).var  # the genes' labels; the matrix stays unread
        labelled = np.flatnonzero(var["assay_n"].to_numpy() > 0)
        if len(labelled) < 2 * cfg.folds:
            raise SystemExit(
                f"only {len(labelled)} genes carry assay results; fine-tuning with {cfg.folds} folds needs at least "
                f"{2 * cfg.folds}. Ingest more plates first."
            )
        targets = torch.tensor(var["assay_effect"].to_numpy()[labelled], dtype=torch.float32)
        genes = torch.tensor(labelled)
        fold_of = _fold_of(len(labelled), cfg.folds, cfg.seed)
        n_genes = embeddings.shape[0]

        out_of_fold = torch.full((len(labelled),), float("nan"))
        all_predictions = torch.full((cfg.folds, n_genes), float("nan"))
        total = cfg.folds * cfg.steps_per_fold
        step = 0
        head: EffectHead | None = None
        optimizer: torch.optim.Optimizer | None = None
        if checkpoint is not None:
            step = checkpoint.step
            out_of_fold = checkpoint.tensors["predictions"]["out_of_fold"]
            all_predictions = checkpoint.tensors["predictions"]["all_genes"]

        def new_fold(fold: int) -> tuple[EffectHead, torch.optim.Optimizer]:
            torch.manual_seed(cfg.seed * 1000 + fold)
            model = EffectHead(embeddings, cfg.hidden)
            opt = torch.optim.Adam(
                [{"params": model.mlp.parameters(), "lr": cfg.learning_rate}, {"params": [model.embedding], "lr": cfg.embedding_learning_rate}]
            )
            return model, opt

        def state() -> dict:
            files = {"predictions": {"out_of_fold": out_of_fold, "all_genes": all_predictions}}
            if head is not None and step % cfg.steps_per_fold:
                files["head"] = head.state_dict()
                files["optimizer"] = optimizer_tensors(optimizer)
            return files

        run.info(f"fine-tuning on {len(labelled)} assayed genes, {cfg.folds} folds, steps {step}→{total}")
        while step < total:
            fold, within = divmod(step, cfg.steps_per_fold)
            if head is None or within == 0:
                head, optimizer = new_fold(fold)
                if within and checkpoint is not None and "head" in checkpoint.tensors:
                    head.load_state_dict(checkpoint.tensors["head"])
                    load_optimizer_tensors(optimizer, checkpoint.tensors["optimizer"])
            train = torch.from_numpy(fold_of != fold)
            prediction = head(genes[train])
            loss = nn.functional.mse_loss(prediction, targets[train])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step % cfg.steps_per_fold == 0:
                with torch.no_grad():
                    held_out = torch.from_numpy(fold_of == fold)
                    out_of_fold[held_out] = head(genes[held_out])
                    all_predictions[fold] = head(torch.arange(n_genes))
                head = None
            run.step_done(step, state, loss=loss.item())

        y = targets.numpy()
        oof = out_of_fold.numpy()
        baseline = np.empty_like(y)
        for fold in range(cfg.folds):
            baseline[fold_of == fold] = y[fold_of != fold].mean()
        rmse = float(np.sqrt(np.mean((oof - y) ** 2)))
        baseline_rmse = float(np.sqrt(np.mean((baseline - y) ** 2)))
        preds = all_predictions.numpy()
        table = pd.DataFrame(
            {
                "gene": var.index.to_numpy(),
                "predicted_effect": preds.mean(axis=0),
                "uncertainty": preds.std(axis=0, ddof=1),
                "assayed": var["assay_n"].to_numpy() > 0,
                "measured_effect": var["assay_effect"].to_numpy(),
            }
        )
        buffer = io.BytesIO()
        table.to_parquet(buffer, index=False)
        write_bytes_atomic(cfg.predictions_uri, buffer.getvalue())  # the lab's results: sealed with its key
        run.finish(
            total,
            {"predictions": {"out_of_fold": out_of_fold, "all_genes": all_predictions}},
            meta={"config": cfg.model_dump()},
            metadata={
                "held_out_rmse": round(rmse, 5),
                "baseline_rmse": round(baseline_rmse, 5),
                "held_out_spearman": round(_spearman(oof, y), 4),
                "n_assayed_genes": int(len(labelled)),
                "folds": cfg.folds,
                "predictions_uri": {"type": "path", "raw_value": cfg.predictions_uri},
            },
        )


if __name__ == "__main__":
    main()
