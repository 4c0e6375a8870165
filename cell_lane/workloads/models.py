"""The Cell models: a masked-expression foundation model and a small effect head."""

from __future__ import annotations

import torch
from torch import nn


class MaskedExpressionModel(nn.Module):
    """Reconstructs masked genes of a cell from the rest; its decoder rows are gene embeddings.

    A cell's visible expression is encoded to a vector h; the value of gene g is read out
    as h · e_g + b_g. Genes that co-vary across cells end up with nearby embeddings e_g.
    """

    def __init__(self, n_genes: int, dim: int = 32, hidden: int = 128):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(n_genes, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.gene_embedding = nn.Parameter(torch.randn(n_genes, dim) * 0.1)
        self.gene_bias = nn.Parameter(torch.zeros(n_genes))

    def forward(self, visible: torch.Tensor) -> torch.Tensor:
        return self.encoder(visible) @ self.gene_embedding.T + self.gene_bias


class EffectHead(nn.Module):
    """Predicts a gene's assay effect from its (fine-tuned) foundation embedding."""

    def __init__(self, embeddings: torch.Tensor, hidden: int = 32):
        super().__init__()
        self.embedding = nn.Parameter(embeddings.clone())
        self.mlp = nn.Sequential(
            nn.LayerNorm(embeddings.shape[1]), nn.Linear(embeddings.shape[1], hidden), nn.GELU(), nn.Linear(hidden, 1)
        )

    def forward(self, genes: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embedding[genes]).squeeze(-1)
