"""Deterministic input builders shared by the zoo models.

Inputs are drawn from a private seeded generator, so the same (batch, seed)
always gives the same tensors and the global RNG is left alone.
"""

from __future__ import annotations

import torch

from benchmarks.zoo.blocks import seeded


def dense(batch: int, dim: int, seed: int, *extra: int) -> torch.Tensor:
    """Standard-normal float32 features of shape (batch, *extra, dim)."""
    return torch.randn(batch, *extra, dim, generator=seeded(seed))


def sparse(batch: int, num_tables: int, bag: int, rows: int, seed: int) -> torch.Tensor:
    """int64 indices of shape (batch, num_tables, bag), uniform in [0, rows)."""
    # Offset the seed so dense and sparse parts of one example are independent.
    return torch.randint(0, rows, (batch, num_tables, bag), generator=seeded(seed + 7919))
