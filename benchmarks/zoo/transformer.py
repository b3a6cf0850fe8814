"""A pre-LayerNorm transformer encoder block stack with separate q/k/v linears
(the batch_linear_lhs pattern: three linears sharing one input)."""

from __future__ import annotations

import math

import torch
from torch import nn

from benchmarks.zoo import inputs as build_inputs
from benchmarks.zoo.blocks import MLP

SEQ = 16
DIM = 64
HEADS = 4


class Attention(nn.Module):
    """Multi-head self-attention written out (matmul, softmax, matmul) so every
    op is visible in the graph instead of hidden in one fused SDPA call."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.scale = 1.0 / math.sqrt(dim // heads)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, S, D) -> (B, H, S, D/H)."""
        # unflatten/flatten instead of view(b, s, ...): no shape unpacking, so
        # torch.fx.symbolic_trace works too.
        return x.unflatten(-1, (self.heads, -1)).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (self.split_heads(proj(x)) for proj in (self.q, self.k, self.v))
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.out(ctx.transpose(1, 2).flatten(2))


class Block(nn.Module):
    """x + attn(ln1(x)), then + mlp(ln2(.))."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = MLP([dim, 4 * dim, dim])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """``scale`` blocks. Input: (B, SEQ, DIM) float. Output: (B, SEQ, DIM)."""

    def __init__(self, scale: int = 1) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(DIM, HEADS) for _ in range(scale)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def make_inputs(batch: int, seed: int, scale: int = 1) -> tuple[torch.Tensor, ...]:
    """(x,) of shape (batch, SEQ, DIM)."""
    return (build_inputs.dense(batch, DIM, seed, SEQ),)
