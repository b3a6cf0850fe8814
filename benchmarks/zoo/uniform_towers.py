"""The Optimus paper's uniform extreme case: N feature towers of one width.

A dense input of N * WIDTH columns is split into N features the way users
write it (``torch.split``); every feature has its own tower, layer norm ->
Linear(WIDTH, OUT) -> ReLU, with its own parameters, and the towers' outputs
are concatenated. No head: the graph is nothing but N identical towers, so a
batching optimizer can turn it into one program of a few kernels whatever N
is (the ragged, tangled counterpart is :mod:`dynamic_schema`).
"""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.zoo import inputs as build_inputs

WIDTH = 16  # columns of every feature
OUT = 16  # every tower's projection width


class Tower(nn.Module):
    """One feature's tower: relu(Linear(layer_norm(x)))."""

    def __init__(self, width: int = WIDTH, out: int = OUT) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.proj(self.norm(x)))


class UniformTowers(nn.Module):
    """Input: dense (B, num_features * width). Output: (B, num_features * out)."""

    def __init__(self, num_features: int, width: int = WIDTH, out: int = OUT) -> None:
        super().__init__()
        if num_features < 1:
            raise ValueError(f"need at least one feature, got {num_features}")
        self.width = width
        self.towers = nn.ModuleList(Tower(width, out) for _ in range(num_features))

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        features = torch.split(dense, self.width, dim=1)
        # Indexed, not zipped: fx Proxies don't iterate.
        return torch.cat([tower(features[i]) for i, tower in enumerate(self.towers)], dim=1)


def make_inputs(batch: int, seed: int, num_features: int, width: int = WIDTH) -> tuple[torch.Tensor]:
    """(dense,) for :class:`UniformTowers` with ``num_features`` features."""
    return (build_inputs.dense(batch, num_features * width, seed),)
