"""The FX vocabulary: what the ops of an FX graph are called, what kind each is,
and what each node holds.

- :mod:`.ops`: op tables (kernel kind per op name, views, random ops, metadata
  mutators, the views rebuild's fast meta runs directly), each declared once;
- :mod:`.names`: op names of FX targets (``target_name``, ``op_label``,
  ``canonical_name``);
- :mod:`.mutation`: which nodes write which inputs (in-place ops, norms in training,
  embeddings with max_norm), and which of a module's attributes a graph writes;
- :mod:`.meta`: tensor meta readers (``TensorInfo``, ``node_tensor_infos``,
  ``SHAPE_META``, ``fetch_attr``) and the one way to read a graph's shapes
  (``node_values``: node meta, and one run of the example inputs where it is missing).

The translator, the cost model, the rebuilder and the Inductor helpers all read
these; none keeps a list of its own.
"""

from __future__ import annotations

from optimus_eqsat.fxvocab.meta import (
    SHAPE_META,
    ExampleInputError,
    TensorInfo,
    check_example_inputs,
    fetch_attr,
    flat_example_inputs,
    memory_order,
    meta_value,
    node_tensor_infos,
    node_values,
    record_shapes,
    tensor_infos,
)
from optimus_eqsat.fxvocab.names import call_name, canonical_name, op_label, target_name
from optimus_eqsat.fxvocab.ops import (
    ALIASING_OPS,
    ALLOCATION_OPS,
    CAST_OPS,
    CAT_OPS,
    EXPAND_OPS,
    FAST_META_VIEW_FUNCTIONS,
    FAST_META_VIEW_METHODS,
    GATHER_OPS,
    GROUPED_OPS,
    LAYER_NORM_OPS,
    MATMUL_OPS,
    METADATA_MUTATORS,
    MODULE_KINDS,
    NONE_OPS,
    NORM_MODULE_LABELS,
    NORM_OPS,
    OP_KINDS,
    OPAQUE_OPS,
    POINTWISE_OPS,
    RANDOM_OPS,
    REDUCTION_OPS,
    RESHAPE_OPS,
    VIEW_OPS,
    WHOLE_VIEW_OPS,
    module_kind,
    op_kind,
)

__all__ = [
    "ALIASING_OPS",
    "ALLOCATION_OPS",
    "CAT_OPS",
    "EXPAND_OPS",
    "FAST_META_VIEW_FUNCTIONS",
    "FAST_META_VIEW_METHODS",
    "GATHER_OPS",
    "GROUPED_OPS",
    "LAYER_NORM_OPS",
    "MATMUL_OPS",
    "METADATA_MUTATORS",
    "MODULE_KINDS",
    "NONE_OPS",
    "NORM_MODULE_LABELS",
    "NORM_OPS",
    "OP_KINDS",
    "OPAQUE_OPS",
    "POINTWISE_OPS",
    "RANDOM_OPS",
    "REDUCTION_OPS",
    "RESHAPE_OPS",
    "CAST_OPS",
    "VIEW_OPS",
    "WHOLE_VIEW_OPS",
    "module_kind",
    "op_kind",
    "call_name",
    "canonical_name",
    "op_label",
    "target_name",
    "SHAPE_META",
    "ExampleInputError",
    "TensorInfo",
    "check_example_inputs",
    "fetch_attr",
    "flat_example_inputs",
    "meta_value",
    "memory_order",
    "node_tensor_infos",
    "node_values",
    "record_shapes",
    "tensor_infos",
]
