"""Extreme-graph generators sized by feature count (benchmarks/extreme_study.py).

Like the zoo's :class:`~benchmarks.zoo.ModelSpec`, but ``features`` is the feature
count itself rather than a multiple of a scale, so a study can sweep any N:

    >>> spec = GENERATORS["uniform"]
    >>> model = spec.build(features=100, seed=0)
    >>> out = model(*spec.inputs(batch=8, seed=0, features=100))

They are kept out of ``MODELS`` (the harness's and the snapshots' model list).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from benchmarks.zoo import inputs as build_inputs
from benchmarks.zoo.dynamic_schema import SEQ_DIM, SEQ_LEN, DynamicSchema, Schema
from benchmarks.zoo.uniform_towers import UniformTowers
from benchmarks.zoo.uniform_towers import make_inputs as uniform_inputs


@dataclass(frozen=True)
class FeatureSpec:
    """A generator: ``build(features, seed)`` a model whose weights depend only on
    (features, seed); ``inputs(batch, seed, features)`` deterministic inputs for it."""

    name: str
    factory: Callable[[int], nn.Module]
    input_builder: Callable[[int, int, int], tuple[torch.Tensor, ...]]
    description: str

    def build(self, features: int, seed: int = 0) -> nn.Module:
        """A model with weights drawn from ``seed`` (the global RNG is untouched)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.factory(features)

    def inputs(self, batch: int = 8, seed: int = 0, features: int = 20) -> tuple[torch.Tensor, ...]:
        """Deterministic CPU inputs for ``build(features)``."""
        return self.input_builder(batch, seed, features)


def ragged_inputs(batch: int, seed: int, features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(dense, seq) for a :class:`DynamicSchema` of ``features`` features."""
    return (
        build_inputs.dense(batch, Schema(features).dense_width, seed),
        build_inputs.dense(batch, SEQ_DIM, seed + 1, SEQ_LEN),
    )


GENERATORS: dict[str, FeatureSpec] = {
    "ragged": FeatureSpec(
        "ragged",
        lambda n: DynamicSchema(num_features=n),
        ragged_inputs,
        "dynamic schema: widths 4/8/16, split/narrow/getitem slicing, split/cat tangles, a head",
    ),
    "uniform": FeatureSpec(
        "uniform",
        UniformTowers,
        uniform_inputs,
        "N towers of width 16: split -> layer norm -> Linear(16, 16) -> relu, one cat, no head",
    ),
}
