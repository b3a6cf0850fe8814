"""The Optimus paper's "extreme graph": a dynamic-schema model where each of N
features takes its own tiny path.

Every feature is sliced out of one dense block, layer-normed, projected by its
own small Linear, activated (relu/sigmoid/tanh in turn), scaled and shifted by
its own parameters, and all results are concatenated into a small head. The
slicing uses three spellings (split, narrow, getitem) so normalization matters;
split->cat round trips, a shuffled split->cat and unbind->stack (plain and
around a pointwise op) are mixed in, so both split/cat and batching rewrites
have work. N = 20 * scale (scale 100 gives the paper's ~2000 features).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import nn

from benchmarks.zoo import inputs as build_inputs
from benchmarks.zoo.blocks import MLP

FEATURES_PER_SCALE = 20
WIDTHS = (4, 8, 16)  # feature widths cycle through these: 3 batchable shape classes
BLOCK = 8  # features per top-level split section
PROJ = 8  # every feature is projected to this width
SEQ_LEN = 8
SEQ_DIM = 8
ACTIVATIONS: tuple[Callable[[torch.Tensor], torch.Tensor], ...] = (
    torch.relu,
    torch.sigmoid,
    torch.tanh,
)


@dataclass(frozen=True)
class Schema:
    """Feature layout for N features: widths, and how they group into blocks."""

    num_features: int

    @cached_property
    def widths(self) -> list[int]:
        return [WIDTHS[i % len(WIDTHS)] for i in range(self.num_features)]

    @cached_property
    def blocks(self) -> list[list[int]]:
        """Feature indices per top-level split section."""
        n = self.num_features
        return [list(range(s, min(s + BLOCK, n))) for s in range(0, n, BLOCK)]

    @property
    def dense_width(self) -> int:
        return sum(self.widths)


def schema_for(scale: int) -> Schema:
    return Schema(FEATURES_PER_SCALE * scale)


class FeaturePath(nn.Module):
    """One feature's path: layer_norm -> Linear(w, PROJ) -> activation -> x*g + b."""

    def __init__(self, width: int, activation: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, PROJ)
        self.activation = activation
        # Per-feature pointwise parameters: targets for batched mul/add.
        self.gain = nn.Parameter(1.0 + 0.1 * torch.randn(PROJ))
        self.shift = nn.Parameter(0.1 * torch.randn(PROJ))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.proj(self.norm(x))) * self.gain + self.shift


def slice_block(block: torch.Tensor, widths: list[int], spelling: int) -> list[torch.Tensor]:
    """Cut a block into per-feature pieces with one of three spellings, so the
    optimizer sees split (of a split), narrow and getitem-slicing."""
    if spelling == 0:
        pieces = torch.split(block, widths, dim=1)
        return [pieces[k] for k in range(len(widths))]  # indexed: fx Proxies don't iterate
    offsets = [sum(widths[:i]) for i in range(len(widths))]
    if spelling == 1:
        return [block.narrow(1, o, w) for o, w in zip(offsets, widths)]
    return [block[:, o : o + w] for o, w in zip(offsets, widths)]


class DynamicSchema(nn.Module):
    """Inputs: dense (B, schema.dense_width) float, seq (B, SEQ_LEN, SEQ_DIM) float.
    Output: (B, 1) probability."""

    def __init__(self, scale: int = 1, num_features: int | None = None) -> None:
        super().__init__()
        schema = Schema(num_features) if num_features else schema_for(scale)
        # Plain lists, not the Schema object, are read in forward: constants for
        # both tracers.
        self.widths = widths = schema.widths
        self.blocks = schema.blocks
        self.features = nn.ModuleList(FeaturePath(w, ACTIVATIONS[i % len(ACTIVATIONS)]) for i, w in enumerate(widths))
        self.block_sizes = [sum(widths[i] for i in blk) for blk in self.blocks]
        passthrough = sum(self.block_sizes[::3])  # spelling-0 blocks are passed through
        head_in = PROJ * len(widths) + passthrough + 2 * SEQ_LEN * SEQ_DIM
        self.head = MLP([head_in, 64, 1])

    def forward(self, dense: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
        sections = torch.split(dense, self.block_sizes, dim=1)
        outs: list[torch.Tensor] = []
        passthrough: list[torch.Tensor] = []
        for b, members in enumerate(self.blocks):
            pieces = slice_block(sections[b], [self.widths[i] for i in members], b % 3)
            outs.append(torch.cat([self.features[i](p) for i, p in zip(members, pieces)], dim=1))
            if b % 3 == 0:
                # split -> cat round trip, with the first two pieces swapped (shuffled)
                order = [1, 0, *range(2, len(pieces))] if len(pieces) > 1 else [0]
                passthrough.append(torch.cat([pieces[k] for k in order], dim=1))
        unbound = torch.unbind(seq, dim=1)
        items = [unbound[t] for t in range(SEQ_LEN)]
        seq_plain = torch.stack(items, dim=1).flatten(1)  # unbind -> stack round trip
        seq_tanh = torch.stack([torch.tanh(t) for t in items], dim=1).flatten(1)
        return torch.sigmoid(self.head(torch.cat([*outs, *passthrough, seq_plain, seq_tanh], 1)))


def make_inputs(batch: int, seed: int, scale: int = 1) -> tuple[torch.Tensor, ...]:
    """(dense, seq) for :class:`DynamicSchema` at the given scale."""
    return (
        build_inputs.dense(batch, schema_for(scale).dense_width, seed),
        build_inputs.dense(batch, SEQ_DIM, seed + 1, SEQ_LEN),
    )
