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


def _mlp(width: int, dims: list[int], activation: type[nn.Module] | None = None) -> nn.Sequential:
    """Linear, batch norm, activation per layer: how recommendation libraries write an MLP."""
    layers: list[nn.Module] = []
    for dim in dims:
        layers += [nn.Linear(width, dim), nn.BatchNorm1d(dim), activation() if activation else nn.ReLU()]
        width = dim
    return nn.Sequential(*layers)


class _Softmax1(nn.Softmax):
    def __init__(self) -> None:
        super().__init__(dim=1)


class ExtractionLevel(nn.Module):
    """One level of PLE (customized gate control): task-specific and shared experts, a
    softmax gate per task, and on every level but the last a gate over all experts."""

    def __init__(self, width: int, dims: list[int], tasks: int, specific: int, shared: int, last: bool):
        super().__init__()
        self.tasks, self.specific = tasks, specific
        self.specific_experts = nn.ModuleList(_mlp(width, dims) for _ in range(tasks * specific))
        self.shared_experts = nn.ModuleList(_mlp(width, dims) for _ in range(shared))
        self.gates = nn.ModuleList(_mlp(width, [specific + shared], _Softmax1) for _ in range(tasks))
        self.shared_gate = None if last else _mlp(width, [tasks * specific + shared], _Softmax1)

    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        own = [expert(inputs[k // self.specific]).unsqueeze(1) for k, expert in enumerate(self.specific_experts)]
        shared = [expert(inputs[-1]).unsqueeze(1) for expert in self.shared_experts]
        outs = []
        for task, gate in enumerate(self.gates):
            experts = torch.cat(own[task * self.specific : (task + 1) * self.specific] + shared, dim=1)
            outs.append((gate(inputs[task]).unsqueeze(-1) * experts).sum(dim=1))
        if self.shared_gate is not None:
            experts = torch.cat(own + shared, dim=1)
            outs.append((self.shared_gate(inputs[-1]).unsqueeze(-1) * experts).sum(dim=1))
        return outs


class BatchNormPLE(nn.Module):
    """Progressive layered extraction as a recommendation library writes it (batch-normed
    MLP experts, two levels, two tasks, a tower and a sigmoid per task). At batch 32 its
    backward made Inductor overwrite a piece of a concatenation still to be read (in-place
    kernel outputs; see ``optimus_eqsat.inductor_compat``)."""

    def __init__(
        self,
        width: int = 16,
        dims: tuple[int, ...] = (32, 16),
        tasks: int = 2,
        levels: int = 2,
        specific: int = 2,
        shared: int = 1,
    ):
        super().__init__()
        self.tasks = tasks
        self.levels = nn.ModuleList(
            ExtractionLevel(
                width if level == 0 else dims[-1], list(dims), tasks, specific, shared, last=level == levels - 1
            )
            for level in range(levels)
        )
        self.towers = nn.ModuleList(nn.Sequential(_mlp(dims[-1], [8]), nn.Linear(8, 1)) for _ in range(tasks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inputs = [x] * (self.tasks + 1)
        for level in self.levels:
            inputs = level(inputs)
        return torch.cat([torch.sigmoid(tower(out)) for tower, out in zip(self.towers, inputs)], dim=1)
