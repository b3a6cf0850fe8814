"""The builder table and the family tags the generator must cover.

``BUILDERS``: (name, weight, builder, option it needs) in the order the
seeded draw sees them, so reordering it changes every generated graph.
``ALL_FAMILIES``: every family tag some seed must produce
(tests/test_graphgen.py asserts coverage).
"""

from __future__ import annotations

from .builder import Builder
from .compute import (
    _BINARY,
    _UNARY,
    b_binary,
    b_embedding,
    b_layer_norm,
    b_linear,
    b_matmul,
    b_reduce,
    b_scalar,
    b_softmax,
    b_unary,
)
from .effects import b_inplace, b_opaque
from .tangles import (
    b_batch_layer_norms,
    b_batch_linears,
    b_feature_classes,
    b_gated_units,
    b_getitem_run_cat,
    b_nested_cat,
    b_permute_twice,
    b_pointwise_pieces_cat,
    b_reshape_chain,
    b_residual,
    b_scalar_chain,
    b_select_cat,
    b_shared_linears,
    b_split_cat,
    b_split_squeeze_stack,
    b_unbind_stack,
)
from .training import StateRegion, b_batch_norm, b_checkpoint, b_dropout, b_state_regions
from .views import (
    b_cat,
    b_chunk,
    b_expand,
    b_flatten,
    b_narrow,
    b_permute,
    b_reshape,
    b_slice,
    b_split,
    b_squeeze,
    b_stack,
    b_unbind,
)

# (name, weight, builder, needs) -- needs is "" / "opaque" / "inplace" / "train" / "checkpoint" / "state" / "gated"
# (a builder a graph's options leave out is not drawn, so appending one changes no existing graph)
BUILDERS: list[tuple[str, float, Builder, str]] = [
    ("split", 3, b_split, ""),
    ("chunk", 1, b_chunk, ""),
    ("unbind", 1, b_unbind, ""),
    ("narrow", 1, b_narrow, ""),
    ("slice", 2, b_slice, ""),
    ("cat", 2, b_cat, ""),
    ("stack", 1, b_stack, ""),
    ("reshape", 2, b_reshape, ""),
    ("flatten", 1, b_flatten, ""),
    ("permute", 2, b_permute, ""),
    ("squeeze", 1.5, b_squeeze, ""),
    ("expand", 0.7, b_expand, ""),
    ("linear", 2, b_linear, ""),
    ("matmul", 1.5, b_matmul, ""),
    ("embedding", 1, b_embedding, ""),
    ("layer_norm", 1, b_layer_norm, ""),
    ("softmax", 1, b_softmax, ""),
    ("reduce", 1, b_reduce, ""),
    ("unary", 3, b_unary, ""),
    ("binary", 3, b_binary, ""),
    ("scalar", 2, b_scalar, ""),
    ("split_cat", 3, b_split_cat, ""),
    ("unbind_stack", 1.5, b_unbind_stack, ""),
    ("split_squeeze_stack", 1, b_split_squeeze_stack, ""),
    ("getitem_run_cat", 1.5, b_getitem_run_cat, ""),
    ("select_cat", 1, b_select_cat, ""),
    ("nested_cat", 1, b_nested_cat, ""),
    ("pointwise_pieces_cat", 1.5, b_pointwise_pieces_cat, ""),
    ("reshape_chain", 1, b_reshape_chain, ""),
    ("permute_twice", 1, b_permute_twice, ""),
    ("batch_linears", 1.5, b_batch_linears, ""),
    ("shared_linears", 1, b_shared_linears, ""),
    ("batch_layer_norms", 0.7, b_batch_layer_norms, ""),
    ("feature_classes", 0.7, b_feature_classes, ""),
    ("scalar_chain", 1, b_scalar_chain, ""),
    ("residual", 1, b_residual, ""),
    ("opaque", 2, b_opaque, "opaque"),
    ("inplace", 5, b_inplace, "inplace"),
    ("batch_norm", 3, b_batch_norm, "train"),
    ("dropout", 1.5, b_dropout, "train"),
    ("checkpoint", 2, b_checkpoint, "checkpoint"),
    ("state_regions", 8, b_state_regions, "state"),
    ("gated_units", 10, b_gated_units, "gated"),
]

#: every tag the training builders must produce over the fuzzer's training flavours
#: (tests/test_fuzz.py asserts coverage; ALL_FAMILIES is what the default options produce)
TRAIN_FAMILIES: tuple[str, ...] = (
    "train:batch_norm_module",
    "train:batch_norm_noaffine",
    "train:batch_norm_cumulative",
    "train:batch_norm_fn",
    "train:dropout_module",
    "train:dropout_fn",
    "train:dropout_torch",
    "train:checkpoint",
    "train:checkpoint_batch_norm",
    "train:checkpoint_cat",
)

#: every tag the state-region builder must produce (``random_graph(state_regions=True)``)
STATE_FAMILIES: tuple[str, ...] = tuple(f"train:state_{kind}" for kind in StateRegion.KINDS)

#: every family tag some seed must produce (test_graphgen asserts coverage)
ALL_FAMILIES: tuple[str, ...] = tuple(
    ["split:int", "split:list", "split:with_sizes", "getitem:neg", "chunk", "unbind", "narrow"]
    + ["slice:select", "slice:step", "slice:range", "cat", "stack", "view", "reshape", "flatten", "unflatten"]
    + ["permute", "transpose", "movedim", "squeeze", "unsqueeze", "expand"]
    + ["linear", "linear:nobias", "matmul", "mm", "bmm", "addmm", "gram", "embedding", "layer_norm", "softmax"]
    + ["sum", "mean"]
    + [f"unary:{n}" for n in _UNARY]
    + [f"binary:{n}" for n in _BINARY]
    + ["identity:x*1", "identity:x+0", "identity:x-0", "identity:x/1", "identity:negneg"]
    + ["scalar:mul", "scalar:add", "scalar:rsub", "scalar:div", "scalar:pow"]
    + [
        "tangle:split_cat_whole",
        "tangle:split_cat_shuffled",
        "tangle:split_cat_partial",
        "tangle:split_cat_other_dim",
        "tangle:unbind_stack",
        "tangle:unbind_stack_other_dim",
        "tangle:unbind_cat",
        "tangle:split_squeeze_stack",
        "tangle:getitem_run_cat",
        "tangle:select_cat",
        "tangle:nested_cat",
        "tangle:pointwise_pieces_cat",
        "tangle:reshape_chain",
        "tangle:permute_twice",
        "tangle:batch_linears",
        "tangle:shared_linears",
        "tangle:batch_layer_norms",
        "tangle:feature_classes",
        "tangle:scalar_chain",
        "tangle:scalar_chain_split_cat",
        "tangle:residual",
    ]
    + [f"opaque:{k}" for k in ("cumsum", "flip", "roll", "sort", "wrapped", "topk", "max_dim")]
    + [f"inplace:{k}" for k in ("add_", "mul_", "copy_", "relu_")]
    + [f"inplace:view_{k}" for k in ("self", "slice", "narrow", "select", "transpose")]
)
