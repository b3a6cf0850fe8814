"""Multi-task models with experts and gates: MMoE (Ma et al., 2018) and
PLE (Tang et al., 2020), sharing one sparse/dense input arch."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.zoo import inputs as build_inputs
from benchmarks.zoo.blocks import ExpertGroup, Gate, PooledEmbeddings, Towers

DENSE_DIM = 32
EMB_DIM = 8
NUM_TABLES = 8
ROWS = 500
BAG = 2
EXPERT_SIZES = (64, 32)  # hidden, output width of every expert
NUM_TASKS = 3
IN_DIM = DENSE_DIM + NUM_TABLES * EMB_DIM


class InputArch(nn.Module):
    """Concatenates dense features with pooled embeddings: (B, IN_DIM)."""

    def __init__(self, rows: int = ROWS) -> None:
        super().__init__()
        self.embeddings = PooledEmbeddings(NUM_TABLES, rows, EMB_DIM)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        return torch.cat([dense, *self.embeddings(sparse)], dim=1)


def experts(num: int, in_dim: int) -> ExpertGroup:
    """An expert group with the zoo's standard expert widths."""
    return ExpertGroup(num, [in_dim, *EXPERT_SIZES])


def towers() -> Towers:
    """One small tower per task on an expert-width input."""
    return Towers(NUM_TASKS, [EXPERT_SIZES[-1], 16, 1])


class MMoE(nn.Module):
    """Shared experts (6 per unit of scale), one softmax gate and tower per task.

    Output: a tuple of NUM_TASKS (B, 1) probabilities.
    """

    def __init__(self, scale: int = 1, rows: int = ROWS) -> None:
        super().__init__()
        num_experts = 6 * scale  # >= 5: Inductor's min_fuse_set_size for batching
        self.input = InputArch(rows)
        self.experts = experts(num_experts, IN_DIM)
        self.gates = nn.ModuleList(Gate(IN_DIM, num_experts) for _ in range(NUM_TASKS))
        self.towers = towers()

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.input(dense, sparse)
        stacked = self.experts(x)
        return self.towers([gate(x, stacked) for gate in self.gates])


class PLELevel(nn.Module):
    """One extraction level: shared experts, per-task experts, per-task gates over
    (own + shared) experts, and (except at the last level) a shared gate over all.

    Input/output: a list of NUM_TASKS task states followed by one shared state.
    """

    def __init__(self, in_dim: int, per_group: int, last: bool) -> None:
        super().__init__()
        self.shared = experts(per_group, in_dim)
        self.task_experts = nn.ModuleList(experts(per_group, in_dim) for _ in range(NUM_TASKS))
        self.task_gates = nn.ModuleList(Gate(in_dim, 2 * per_group) for _ in range(NUM_TASKS))
        total = (NUM_TASKS + 1) * per_group
        self.shared_gate = None if last else Gate(in_dim, total)

    def forward(self, states: list[torch.Tensor]) -> list[torch.Tensor]:
        *task_states, shared_state = states
        shared = self.shared(shared_state)
        own = [group(x) for group, x in zip(self.task_experts, task_states)]
        outs = [gate(x, torch.cat([mine, shared], dim=1)) for gate, x, mine in zip(self.task_gates, task_states, own)]
        if self.shared_gate is not None:
            outs.append(self.shared_gate(shared_state, torch.cat([*own, shared], dim=1)))
        return outs


class PLE(nn.Module):
    """Progressive Layered Extraction with 2 levels; 2 experts per group per unit
    of scale. Output: a tuple of NUM_TASKS (B, 1) probabilities."""

    def __init__(self, scale: int = 1, levels: int = 2, rows: int = ROWS) -> None:
        super().__init__()
        per_group = 2 * scale
        self.input = InputArch(rows)
        dims = [IN_DIM] + [EXPERT_SIZES[-1]] * (levels - 1)
        self.levels = nn.ModuleList(PLELevel(d, per_group, last=i == levels - 1) for i, d in enumerate(dims))
        self.towers = towers()

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.input(dense, sparse)
        states = [x] * (NUM_TASKS + 1)
        for level in self.levels:
            states = level(states)
        return self.towers(states)


def make_inputs(batch: int, seed: int, scale: int = 1, rows: int = ROWS) -> tuple[torch.Tensor, ...]:
    """(dense, sparse) for :class:`MMoE` and :class:`PLE` (independent of scale)."""
    return (
        build_inputs.dense(batch, DENSE_DIM, seed),
        build_inputs.sparse(batch, NUM_TABLES, BAG, rows, seed),
    )
