"""Small models shared by tests that compile end to end."""

from __future__ import annotations

import torch
import torch.nn as nn


class SplitTowers(nn.Module):
    """Per-feature towers on splits of one dense block: split -> layer_norm -> linear -> relu -> cat,
    then a scalar scale (the shape that made Inductor restart Dynamo under dynamic=True)."""

    def __init__(self, towers: int = 6, width: int = 8):
        super().__init__()
        self.width = width
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(towers))
        self.linears = nn.ModuleList(nn.Linear(width, width) for _ in range(towers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.split(x, self.width, dim=1)
        outs = [torch.relu(self.linears[k](self.norms[k](parts[k]))) for k in range(len(self.norms))]
        return torch.cat(outs, dim=1) * 0.5
