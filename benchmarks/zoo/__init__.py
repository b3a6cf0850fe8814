"""The benchmark model zoo: recommendation-style models with seeded random weights.

``MODELS`` maps a name to a :class:`ModelSpec`. Every model runs forward and
backward in eager, traces with Dynamo (and ``torch.fx.symbolic_trace``) and
compiles with ``torch.compile`` on CPU. ``scale`` multiplies the model's
parallel structure (tables, experts, fields, blocks, features); scale 1 is small
enough for CPU tests.

    >>> spec = MODELS["dlrm"]
    >>> model = spec.build(scale=1, seed=0)
    >>> out = model(*spec.inputs(batch=4, seed=0))
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from . import ctr, dlrm, dynamic_schema, multitask, transformer

InputBuilder = Callable[..., tuple[torch.Tensor, ...]]


@dataclass(frozen=True)
class ModelSpec:
    """A zoo entry.

    ``build(scale=1, seed=0)`` returns a fresh model whose weights depend only on
    (scale, seed); ``inputs(batch, seed, scale=1)`` returns a deterministic input
    tuple matching ``build(scale)`` (pass the same scale to both).
    ``has_training``: whether the model has trainable parameters and a backward.
    """

    name: str
    factory: Callable[[int], nn.Module]
    input_builder: InputBuilder
    description: str
    has_training: bool = True

    def build(self, scale: int = 1, seed: int = 0) -> nn.Module:
        """A model with weights drawn from ``seed`` (the global RNG is untouched)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.factory(scale)

    def inputs(self, batch: int = 8, seed: int = 0, scale: int = 1) -> tuple[torch.Tensor, ...]:
        """Deterministic CPU inputs for ``build(scale)``."""
        return self.input_builder(batch, seed, scale)


_SPECS = [
    ModelSpec(
        "dlrm",
        dlrm.DLRM,
        dlrm.make_inputs,
        "DLRM: bottom MLP, 8*scale pooled embedding tables, dot interaction, top MLP",
    ),
    ModelSpec(
        "mmoe",
        multitask.MMoE,
        multitask.make_inputs,
        "MMoE: 6*scale shared experts, 3 task gates and towers",
    ),
    ModelSpec(
        "ple",
        multitask.PLE,
        multitask.make_inputs,
        "PLE: 2 levels, 2*scale shared + per-task experts, gates, 3 towers",
    ),
    ModelSpec(
        "deepfm",
        ctr.DeepFM,
        ctr.deepfm_inputs,
        "DeepFM: 16*scale one-hot fields, first order + FM + deep MLP",
    ),
    ModelSpec(
        "dcnv2",
        ctr.DCNv2,
        ctr.dcn_inputs,
        "DCN-v2: dense + 16*scale fields, 3 cross layers parallel to a deep MLP",
    ),
    ModelSpec(
        "transformer",
        transformer.Transformer,
        transformer.make_inputs,
        "Pre-LN transformer, scale blocks, separate q/k/v linears",
    ),
    ModelSpec(
        "dynamic_schema",
        dynamic_schema.DynamicSchema,
        dynamic_schema.make_inputs,
        "Optimus 'extreme graph': 20*scale features, each slice->LN->Linear->act->affine",
    ),
]

MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in _SPECS}

__all__ = ["MODELS", "ModelSpec"]
