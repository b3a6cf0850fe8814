"""DLRM: bottom MLP on dense features, many same-width embedding tables,
pairwise dot interaction, top MLP (Naumov et al., 2019)."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.zoo import inputs as build_inputs
from benchmarks.zoo.blocks import MLP, DotInteraction, PooledEmbeddings

DENSE_DIM = 13  # Criteo's 13 dense features
EMB_DIM = 16
ROWS = 1000
BAG = 4


def num_tables(scale: int) -> int:
    """Eight tables per unit of scale (Criteo has 26)."""
    return 8 * scale


class DLRM(nn.Module):
    """Inputs: dense (B, 13) float, sparse (B, T, bag) int64. Output: (B, 1) CTR."""

    def __init__(self, scale: int = 1, rows: int = ROWS) -> None:
        super().__init__()
        tables = num_tables(scale)
        self.bottom = MLP([DENSE_DIM, 64, EMB_DIM], final_act=True)
        self.embeddings = PooledEmbeddings(tables, rows, EMB_DIM)
        self.interaction = DotInteraction(tables + 1)
        pairs = (tables + 1) * tables // 2
        self.top = MLP([EMB_DIM + pairs, 64, 32, 1])

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        bottom = self.bottom(dense)
        features = torch.stack([bottom, *self.embeddings(sparse)], dim=1)
        top_in = torch.cat([bottom, self.interaction(features)], dim=1)
        return torch.sigmoid(self.top(top_in))


def make_inputs(batch: int, seed: int, scale: int = 1, rows: int = ROWS) -> tuple[torch.Tensor, ...]:
    """(dense, sparse) for :class:`DLRM` at the given scale and table size."""
    return (
        build_inputs.dense(batch, DENSE_DIM, seed),
        build_inputs.sparse(batch, num_tables(scale), BAG, rows, seed),
    )
