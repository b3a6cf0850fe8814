"""The benchmark model zoo: recommendation-style models with seeded random weights.

``MODELS`` maps a name to a :class:`ModelSpec`. Every model runs forward and
backward in eager, traces with Dynamo (and ``torch.fx.symbolic_trace``) and
compiles with ``torch.compile`` on CPU. ``scale`` multiplies the model's
parallel structure (tables, experts, fields, blocks, features); scale 1 is small
enough for CPU tests.

``BIG_MODELS`` holds the models with embedding tables again with
:data:`BIG_ROWS` rows per table (``dlrm_big``, ...), closer to production
tables (millions of rows); they are left out of ``MODELS`` (and so of the
default test paths) for their memory. ``ALL_MODELS`` is both.

    >>> spec = MODELS["dlrm"]
    >>> model = spec.build(scale=1, seed=0)
    >>> out = model(*spec.inputs(batch=4, seed=0))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn

from benchmarks.zoo import ctr, dlrm, dynamic_schema, multitask, transformer

InputBuilder = Callable[..., tuple[torch.Tensor, ...]]


@dataclass(frozen=True)
class ModelSpec:
    """A zoo entry.

    ``build(scale=1, seed=0)`` returns a fresh model whose weights depend only on
    (scale, seed); ``inputs(batch, seed, scale=1)`` returns a deterministic input
    tuple matching ``build(scale)`` (pass the same scale to both).
    ``has_training``: whether the model has trainable parameters and a backward.
    ``rows``: rows per embedding table, passed to the factory and the input
    builder as ``rows=``; None for a model without tables.
    """

    name: str
    factory: Callable[..., nn.Module]
    input_builder: InputBuilder
    description: str
    has_training: bool = True
    rows: int | None = None

    def _table_kwargs(self) -> dict[str, int]:
        return {} if self.rows is None else {"rows": self.rows}

    def build(self, scale: int = 1, seed: int = 0) -> nn.Module:
        """A model with weights drawn from ``seed`` (the global RNG is untouched)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.factory(scale, **self._table_kwargs())

    def inputs(self, batch: int = 8, seed: int = 0, scale: int = 1) -> tuple[torch.Tensor, ...]:
        """Deterministic CPU inputs for ``build(scale)``; indices drawn from the whole table."""
        return self.input_builder(batch, seed, scale, **self._table_kwargs())

    def with_rows(self, rows: int, name: str | None = None) -> ModelSpec:
        """The same model with ``rows`` rows per table (ValueError without tables)."""
        if self.rows is None:
            raise ValueError(f"{self.name} has no embedding tables")
        return replace(
            self, name=name or self.name, rows=rows, description=f"{self.description}; {rows:,} rows per table"
        )


_SPECS = [
    ModelSpec(
        "dlrm",
        dlrm.DLRM,
        dlrm.make_inputs,
        "DLRM: bottom MLP, 8*scale pooled embedding tables, dot interaction, top MLP",
        rows=dlrm.ROWS,
    ),
    ModelSpec(
        "mmoe",
        multitask.MMoE,
        multitask.make_inputs,
        "MMoE: 6*scale shared experts, 3 task gates and towers",
        rows=multitask.ROWS,
    ),
    ModelSpec(
        "ple",
        multitask.PLE,
        multitask.make_inputs,
        "PLE: 2 levels, 2*scale shared + per-task experts, gates, 3 towers",
        rows=multitask.ROWS,
    ),
    ModelSpec(
        "deepfm",
        ctr.DeepFM,
        ctr.deepfm_inputs,
        "DeepFM: 16*scale one-hot fields, first order + FM + deep MLP",
        rows=ctr.ROWS,
    ),
    ModelSpec(
        "dcnv2",
        ctr.DCNv2,
        ctr.dcn_inputs,
        "DCN-v2: dense + 16*scale fields, 3 cross layers parallel to a deep MLP",
        rows=ctr.ROWS,
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

# One million rows per table: production tables have millions. At scale 1 the
# tables hold 256 MB (mmoe_big) to 576 MB (deepfm_big) of float32 per copy.
BIG_ROWS = 1_000_000
BIG_MODELS: dict[str, ModelSpec] = {
    f"{name}_big": MODELS[name].with_rows(BIG_ROWS, name=f"{name}_big") for name in ("dlrm", "dcnv2", "deepfm", "mmoe")
}
ALL_MODELS: dict[str, ModelSpec] = {**MODELS, **BIG_MODELS}

__all__ = ["ALL_MODELS", "BIG_MODELS", "BIG_ROWS", "MODELS", "ModelSpec"]
