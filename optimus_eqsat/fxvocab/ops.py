"""Op tables: what each op name is, every list declared once.

Names are those :func:`.names.target_name` gives: aten overloads lose namespace
and overload ("aten::relu.default" -> "relu"), methods and functions keep their
name. Lists read by the translator (``ALIASING_OPS``, ``RANDOM_OPS``,
``RESHAPE_OPS``, ``EXPAND_OPS``) are looked up with :func:`.names.canonical_name`,
which maps other spellings onto the names here ("_unsafe_view" -> "view").
"""

from __future__ import annotations

import torch
from torch import nn

from optimus_eqsat.fxvocab.kinds import KernelKind

K = KernelKind

# ---------------------------------------------------------------- views
# A view's result shares storage with its input: metadata only, no kernel.

# Reshapes: the result shape alone says what they do (the translator's Reshape term).
RESHAPE_OPS = frozenset({"view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "view_as", "reshape_as"})
_ATEN_RESHAPE_OPS = frozenset({"_unsafe_view", "_reshape_alias"})  # aten spellings of a reshape
# Broadcasts: the translator's Expand term.
EXPAND_OPS = frozenset({"expand", "expand_as", "broadcast_to"})
# Views that return their input as it is.
_SAME_VIEW_OPS = frozenset(
    {
        "alias",
        "detach",
        "lift_fresh",
        "identity",
        "contiguous",  # approximation: a copy only when non-contiguous
    }
)

VIEW_OPS = (
    RESHAPE_OPS
    | _ATEN_RESHAPE_OPS
    | EXPAND_OPS
    | _SAME_VIEW_OPS
    | frozenset(
        {
            "permute",
            "transpose",
            "t",
            "swapaxes",
            "swapdims",
            "movedim",
            "moveaxis",
            "numpy_T",
            "T",
            "mT",
            "H",
            "adjoint",
            "slice",
            "select",
            "narrow",
            "getitem",
            "__getitem__",
            "diagonal",
            "as_strided",
            "unfold",
            "split",
            "split_with_sizes",
            "tensor_split",
            "chunk",
            "unbind",
            "real",
            "imag",
            "view_as_real",
            "view_as_complex",
        }
    )
)
# Views that keep a whole buffer (no subset, same element order): a producer
# seen through them can still be computed straight into a cat's slice. The
# capitalized names are the nn.Module classes of call_module nodes.
WHOLE_VIEW_OPS = RESHAPE_OPS | _ATEN_RESHAPE_OPS | _SAME_VIEW_OPS | frozenset({"Flatten", "Unflatten", "Identity"})
# Ops whose result may alias an input, for mutation analysis: views, and
# dropout, which returns its input in eval mode.
ALIASING_OPS = VIEW_OPS | {"dropout"}
# Dtype conversions: pointwise, and fused by Inductor into the kernel that reads them.
CAST_OPS = frozenset(
    {"to", "type", "type_as", "float", "half", "bfloat16", "double", "int", "long", "bool", "_to_copy"}
    | {"convert_element_type"}
)

# Allocations launch nothing by themselves (their writers do).
ALLOCATION_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})

# Random ops keep their order (the RNG stream is a side effect); never constant-folded.
RANDOM_OPS = frozenset(
    {
        "rand",
        "randn",
        "rand_like",
        "randn_like",
        "randint",
        "randint_like",
        "bernoulli",
        "multinomial",
        "normal",
        "uniform",
        "randperm",
        "poisson",
        "native_dropout",
    }
)

# ---------------------------------------------------------------- rebuild's fast meta
# Views whose fake value the rebuild computes with the view's meta kernel
# directly (rebuild._fast_meta): torch functions, and Tensor method names.
FAST_META_VIEW_FUNCTIONS = frozenset(
    {
        torch.narrow,
        torch.reshape,
        torch.permute,
        torch.transpose,
        torch.swapaxes,
        torch.swapdims,
        torch.squeeze,
        torch.unsqueeze,
        torch.flatten,
        torch.select,
        torch.t,
        torch.movedim,
        torch.split,
        torch.chunk,
        torch.unbind,
        torch.Tensor.view,
        torch.Tensor.expand,
        torch.Tensor.reshape,
    }
)
FAST_META_VIEW_METHODS = frozenset(
    {
        "narrow",
        "reshape",
        "view",
        "permute",
        "expand",
        "expand_as",
        "view_as",
        "transpose",
        "swapaxes",
        "swapdims",
        "squeeze",
        "unsqueeze",
        "flatten",
        "unflatten",
        "select",
        "t",
        "movedim",
        "split",
        "split_with_sizes",
        "chunk",
        "unbind",
        "contiguous",
        "size",
        "dim",
    }
)
# In-place ops that change a tensor's metadata (values computed from it would alias them).
METADATA_MUTATORS = frozenset(
    {
        "resize_",
        "resize_as_",
        "t_",
        "transpose_",
        "squeeze_",
        "unsqueeze_",
        "as_strided_",
        "set_",
        "swapdims_",
        "swapaxes_",
        "as_strided_scatter_",
        "_unsafe_set_",
    }
)

# ---------------------------------------------------------------- kernel kinds
# What each op becomes under Inductor (KernelKind, before fusion).

POINTWISE_OPS = frozenset(
    {
        "add",
        "sub",
        "rsub",
        "mul",
        "div",
        "truediv",
        "floordiv",
        "true_divide",
        "floor_divide",
        "mod",
        "remainder",
        "fmod",
        "pow",
        "neg",
        "abs",
        "sign",
        "relu",
        "relu6",
        "gelu",
        "silu",
        "mish",
        "elu",
        "selu",
        "celu",
        "leaky_relu",
        "hardtanh",
        "hardswish",
        "hardsigmoid",
        "softplus",
        "prelu",
        "threshold",
        "sigmoid",
        "tanh",
        "exp",
        "exp2",
        "expm1",
        "log",
        "log2",
        "log10",
        "log1p",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "square",
        "erf",
        "erfc",
        "sin",
        "cos",
        "tan",
        "floor",
        "ceil",
        "round",
        "trunc",
        "frac",
        "clamp",
        "clamp_min",
        "clamp_max",
        "clip",
        "maximum",
        "minimum",
        "fmax",
        "fmin",
        "where",
        "masked_fill",
        "lerp",
        "addcmul",
        "addcdiv",
        "nan_to_num",
        "isnan",
        "isinf",
        "isfinite",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "logical_and",
        "logical_or",
        "logical_not",
        "logical_xor",
        "bitwise_and",
        "bitwise_or",
        "bitwise_not",
        "bitwise_xor",
        "and_",
        "or_",
        "xor",
        "invert",
        "not_",
        "to",
        "type",
        "type_as",
        "float",
        "half",
        "bfloat16",
        "double",
        "int",
        "long",
        "bool",
        "_to_copy",
        "convert_element_type",
        "clone",
        "copy",
        "copy_",
        "fill",
        "zero",
        "zeros",
        "ones",
        "full",
        "zeros_like",
        "ones_like",
        "full_like",
        "scalar_tensor",
        "arange",
        "rand",
        "randn",
        "rand_like",
        "randn_like",
        "bernoulli",
        "native_dropout",
        "dropout",
        "alpha_dropout",
        "repeat",
        "tile",
        "flip",
        "roll",
        "pad",
        "constant_pad_nd",
        "tril",
        "triu",
        "threshold_backward",
        "sigmoid_backward",
        "tanh_backward",
        "gelu_backward",
        "silu_backward",
        "native_dropout_backward",
        "hardswish_backward",
        "leaky_relu_backward",
        "_native_batch_norm_legit_no_training",
        "fma",
        # backward-graph fills and scatters into views: Inductor decomposes them
        # (slice_backward = new_zeros + slice_scatter) into masked pointwise code
        "new_zeros",
        "new_ones",
        "new_full",
        "slice_backward",
        "select_backward",
        "slice_scatter",
        "select_scatter",
        # batched embedding's index shift (rewrites/batching.py, shift_segments)
        "shift_segments",
        "shift_rows",
    }
)

# Normalizations: reductions whose output has the input's shape.
NORM_OPS = frozenset(
    {
        "layer_norm",
        "native_layer_norm",
        "group_norm",
        "native_group_norm",
        "rms_norm",
        "_fused_rms_norm",
        "batch_norm",
        "native_batch_norm",
        "_native_batch_norm_legit",
        "instance_norm",
        "softmax",
        "_softmax",
        "log_softmax",
        "_log_softmax",
        "normalize",
    }
)
LAYER_NORM_OPS = frozenset({"layer_norm", "native_layer_norm"})

REDUCTION_OPS = NORM_OPS | frozenset(
    {
        "sum",
        "mean",
        "prod",
        "amax",
        "amin",
        "max",
        "min",
        "argmax",
        "argmin",
        "any",
        "all",
        "var",
        "std",
        "var_mean",
        "std_mean",
        "norm",
        "linalg_vector_norm",
        "logsumexp",
        "cumsum",
        "cumprod",
        "cross_entropy",
        "nll_loss",
        "mse_loss",
        "_softmax_backward_data",
        "_log_softmax_backward_data",
        "native_layer_norm_backward",
    }
)

# Grouped linear (optimus_eqsat::grouped_linear, or the Python helper of that
# name): N linears in one extern call.
GROUPED_OPS = frozenset({"grouped_linear"})

MATMUL_OPS = GROUPED_OPS | frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "matmul",
        "linear",
        "addmv",
        "mv",
        "addbmm",
        "einsum",
        "bilinear",
        "_addmm_activation",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "convolution",
        "_convolution",
    }
)

CAT_OPS = frozenset({"cat", "concat", "concatenate", "stack", "hstack", "vstack"})

GATHER_OPS = frozenset({"embedding", "index_select", "gather", "index", "take", "take_along_dim"})

# Library fallbacks Inductor calls as one extern kernel.
OPAQUE_OPS = frozenset(
    {
        "embedding_bag",
        "_embedding_bag",
        "_embedding_bag_forward_only",
        "sort",
        "topk",
        "scaled_dot_product_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "index_put",
        "scatter",
        "scatter_add",
        "scatter_reduce",
        "index_add",
        "nonzero",
        "unique",
        "multinomial",
    }
)
# Scatters of backward graphs (embedding gradients: AOTAutograd's embedding_dense_backward,
# which Inductor decomposes into a masked index_put with accumulate). Inductor lowers them to
# a generated kernel of their own that inlines their pointwise producers (the masks, the
# zero fill): priced as a reduction, which fuses the same way.
SCATTER_OPS = frozenset({"index_put", "_unsafe_masked_index_put_accumulate", "embedding_dense_backward"})

# Scalar / shape bookkeeping: no tensor work at all.
NONE_OPS = frozenset(
    {
        "getattr",
        "size",
        "dim",
        "numel",
        "stride",
        "sym_size",
        "sym_numel",
        "sym_stride",
        "sym_storage_offset",
        "_assert",
        "_assert_async",
        "_assert_tensor_metadata",
        "sym_constrain_range_for_size",
        "_check",
        "_check_is_size",
        "sym_not",
        "sym_float",
        "sym_int",
        "sym_max",
        "sym_min",
    }
)

# Later entries win where a name is in two lists.
OP_KINDS: dict[str, KernelKind] = {
    **{n: K.POINTWISE for n in POINTWISE_OPS},
    **{n: K.REDUCTION for n in REDUCTION_OPS | SCATTER_OPS},
    **{n: K.MATMUL for n in MATMUL_OPS},
    **{n: K.CAT for n in CAT_OPS},
    **{n: K.GATHER for n in GATHER_OPS},
    **{n: K.OPAQUE for n in OPAQUE_OPS - SCATTER_OPS},
    # lift_fresh_copy copies a constant Inductor folds
    **{n: K.VIEW for n in VIEW_OPS | ALLOCATION_OPS | {"lift_fresh_copy"}},
    **{n: K.NONE for n in NONE_OPS},
}

# call_module targets: the first class in the module's MRO found here wins.
MODULE_KINDS: dict[type, KernelKind] = {
    nn.Linear: K.MATMUL,
    nn.Bilinear: K.MATMUL,
    nn.LazyLinear: K.MATMUL,
    nn.modules.conv._ConvNd: K.MATMUL,
    nn.ReLU: K.POINTWISE,
    nn.ReLU6: K.POINTWISE,
    nn.GELU: K.POINTWISE,
    nn.SiLU: K.POINTWISE,
    nn.Sigmoid: K.POINTWISE,
    nn.Tanh: K.POINTWISE,
    nn.LeakyReLU: K.POINTWISE,
    nn.ELU: K.POINTWISE,
    nn.SELU: K.POINTWISE,
    nn.Hardswish: K.POINTWISE,
    nn.Hardsigmoid: K.POINTWISE,
    nn.Hardtanh: K.POINTWISE,
    nn.Softplus: K.POINTWISE,
    nn.Mish: K.POINTWISE,
    nn.PReLU: K.POINTWISE,
    nn.Threshold: K.POINTWISE,
    nn.modules.dropout._DropoutNd: K.POINTWISE,
    nn.LayerNorm: K.REDUCTION,
    nn.GroupNorm: K.REDUCTION,
    nn.RMSNorm: K.REDUCTION,
    nn.modules.batchnorm._BatchNorm: K.REDUCTION,
    nn.modules.instancenorm._InstanceNorm: K.REDUCTION,
    nn.Softmax: K.REDUCTION,
    nn.LogSoftmax: K.REDUCTION,
    nn.Embedding: K.GATHER,
    nn.EmbeddingBag: K.OPAQUE,
    nn.Flatten: K.VIEW,
    nn.Unflatten: K.VIEW,
    nn.Identity: K.VIEW,
}
# Normalization modules by lowercased class name (labels of call_module nodes;
# nn.Softmax's, "softmax", is in NORM_OPS).
NORM_MODULE_LABELS = frozenset(
    {
        "layernorm",
        "groupnorm",
        "rmsnorm",
        "batchnorm1d",
        "batchnorm2d",
        "batchnorm3d",
        "instancenorm1d",
        "instancenorm2d",
        "instancenorm3d",
        "logsoftmax",
    }
)


def op_kind(name: str) -> KernelKind | None:
    """The kernel kind of an op name; in-place variants as their plain op (relu_ -> relu)."""
    if name in OP_KINDS:
        return OP_KINDS[name]
    if name.endswith("_") and not name.endswith("__") and name[:-1] in OP_KINDS:
        return OP_KINDS[name[:-1]]
    return None


def module_kind(module: nn.Module) -> KernelKind:
    """The kernel kind of a call_module node's module (OPAQUE when unknown)."""
    for cls in type(module).__mro__:
        if cls in MODULE_KINDS:
            kind = MODULE_KINDS[cls]
            # Dropout in eval is the identity; BatchNorm in eval is pointwise.
            if isinstance(module, nn.modules.dropout._DropoutNd) and not module.training:
                return K.VIEW
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and not module.training:
                return K.POINTWISE
            return kind
    return K.OPAQUE
