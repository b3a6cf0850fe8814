"""CTR models over many sparse features: DeepFM (Guo et al., 2017) and
DCN-v2 (Wang et al., 2021, parallel structure)."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.zoo import inputs as build_inputs
from benchmarks.zoo.blocks import MLP, CrossLayer, PooledEmbeddings

EMB_DIM = 8
ROWS = 1000
BAG = 1  # one-hot fields, as in Criteo
DENSE_DIM = 13
CROSS_LAYERS = 3


def num_fields(scale: int) -> int:
    """Sixteen sparse fields per unit of scale."""
    return 16 * scale


class DeepFM(nn.Module):
    """First-order weights + FM second-order term + deep MLP over shared embeddings.

    Input: sparse (B, F, 1) int64. Output: (B, 1) CTR.
    """

    def __init__(self, scale: int = 1, rows: int = ROWS) -> None:
        super().__init__()
        fields = num_fields(scale)
        self.first_order = PooledEmbeddings(fields, rows, 1)
        self.embeddings = PooledEmbeddings(fields, rows, EMB_DIM)
        self.deep = MLP([fields * EMB_DIM, 64, 32, 1])

    def forward(self, sparse: torch.Tensor) -> torch.Tensor:
        linear = torch.cat(self.first_order(sparse), dim=1).sum(dim=1, keepdim=True)
        embs = self.embeddings(sparse)
        stacked = torch.stack(embs, dim=1)  # (B, F, k)
        # FM identity: sum_{i<j} <e_i, e_j> = 0.5 * ((sum e)^2 - sum e^2)
        square_of_sum = stacked.sum(dim=1).pow(2)
        sum_of_square = stacked.pow(2).sum(dim=1)
        fm = 0.5 * (square_of_sum - sum_of_square).sum(dim=1, keepdim=True)
        deep = self.deep(torch.cat(embs, dim=1))
        return torch.sigmoid(linear + fm + deep)


class DCNv2(nn.Module):
    """Cross network and deep network in parallel over [dense, embeddings].

    Inputs: dense (B, 13) float, sparse (B, F, 1) int64. Output: (B, 1) CTR.
    """

    def __init__(self, scale: int = 1, rows: int = ROWS) -> None:
        super().__init__()
        fields = num_fields(scale)
        width = DENSE_DIM + fields * EMB_DIM
        self.embeddings = PooledEmbeddings(fields, rows, EMB_DIM)
        self.cross = nn.ModuleList(CrossLayer(width) for _ in range(CROSS_LAYERS))
        self.deep = MLP([width, 64, 32], final_act=True)
        self.head = nn.Linear(width + 32, 1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat([dense, *self.embeddings(sparse)], dim=1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        return torch.sigmoid(self.head(torch.cat([x, self.deep(x0)], dim=1)))


def deepfm_inputs(batch: int, seed: int, scale: int = 1, rows: int = ROWS) -> tuple[torch.Tensor, ...]:
    """(sparse,) for :class:`DeepFM`."""
    return (build_inputs.sparse(batch, num_fields(scale), BAG, rows, seed),)


def dcn_inputs(batch: int, seed: int, scale: int = 1, rows: int = ROWS) -> tuple[torch.Tensor, ...]:
    """(dense, sparse) for :class:`DCNv2`."""
    return (
        build_inputs.dense(batch, DENSE_DIM, seed),
        build_inputs.sparse(batch, num_fields(scale), BAG, rows, seed),
    )
