"""Shared building blocks of the zoo models.

Every model is assembled from these, so an idiom (an MLP, a pooled embedding
table, a gated mixture of experts) is written once. All blocks are plain
``nn.Module``s whose forward is straight-line tensor code, so they trace with
``torch.fx.symbolic_trace`` as well as with Dynamo.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

Activation = Callable[[torch.Tensor], torch.Tensor]


class MLP(nn.Sequential):
    """Linear layers of the given widths with ReLU between them.

    ``sizes = [in, h1, ..., out]``; ``final_act`` adds a ReLU after the last layer
    (bottom MLPs feed an interaction and want non-negative features).
    """

    def __init__(self, sizes: Sequence[int], final_act: bool = False) -> None:
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2 or final_act:
                layers.append(nn.ReLU())
        super().__init__(*layers)


class PooledEmbeddings(nn.Module):
    """``num_tables`` embedding tables of one width, each sum-pooled over a bag.

    Input: int64 indices of shape (B, num_tables, bag). Output: a list of
    ``num_tables`` tensors of shape (B, dim). The per-table ``select`` +
    ``embedding`` + ``sum`` chain is the shape production models have before
    Optimus batches it, so it is kept per table on purpose.
    """

    def __init__(self, num_tables: int, rows: int, dim: int) -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(num_tables))

    def forward(self, indices: torch.Tensor) -> list[torch.Tensor]:
        per_table = torch.unbind(indices, dim=1)
        # Index the unbind result instead of iterating it: fx Proxies are not iterable.
        return [table(per_table[t]).sum(dim=1) for t, table in enumerate(self.tables)]


class DotInteraction(nn.Module):
    """DLRM's pairwise dot-product interaction of ``n`` feature vectors.

    Input: (B, n, d). Output: (B, n*(n-1)/2), the strictly upper triangle of
    X X^T, gathered with index buffers so the graph has no Python loops.
    """

    def __init__(self, num_vectors: int) -> None:
        super().__init__()
        rows, cols = torch.triu_indices(num_vectors, num_vectors, offset=1)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.bmm(x, x.transpose(1, 2))
        return z[:, self.rows, self.cols]


class ExpertGroup(nn.Module):
    """``num_experts`` independent MLP experts on one input, stacked to (B, E, out).

    Same-shaped parallel linears: the canonical batch_linear candidate.
    """

    def __init__(self, num_experts: int, sizes: Sequence[int]) -> None:
        super().__init__()
        self.experts = nn.ModuleList(MLP(sizes, final_act=True) for _ in range(num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([expert(x) for expert in self.experts], dim=1)


class Gate(nn.Module):
    """Softmax gate mixing stacked expert outputs: sum_e softmax(W x)_e * experts_e."""

    def __init__(self, in_dim: int, num_experts: int) -> None:
        super().__init__()
        self.proj = nn.Linear(in_dim, num_experts)

    def forward(self, x: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.proj(x), dim=-1)
        return (weights.unsqueeze(-1) * experts).sum(dim=1)


class Towers(nn.Module):
    """One MLP tower per task, each ending in one sigmoid logit: a tuple of (B, 1)."""

    def __init__(self, num_tasks: int, sizes: Sequence[int]) -> None:
        super().__init__()
        self.towers = nn.ModuleList(MLP(sizes) for _ in range(num_tasks))

    def forward(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return tuple(torch.sigmoid(tower(x)) for tower, x in zip(self.towers, inputs))


class CrossLayer(nn.Module):
    """DCN-v2 cross layer: x_{l+1} = x0 * (W x_l + b) + x_l (full-rank W)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return x0 * self.proj(x) + x


def seeded(seed: int) -> torch.Generator:
    """A CPU generator with the given seed (inputs are built on CPU, then moved)."""
    return torch.Generator().manual_seed(seed)
