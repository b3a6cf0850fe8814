"""Predict the kernels Inductor launches for an FX graph, and their time.

Works on any ``torch.fx.GraphModule``: ``symbolic_trace`` output
(``call_module`` nodes resolved with ``gm.get_submodule``), Dynamo graphs
(torch functions and Tensor methods, shapes in ``meta["example_value"]``) and
torch.export / aten graphs (``torch.ops.aten.*``, shapes in ``meta["val"]``).
Shapes come from node meta; if meta is missing and ``example_inputs`` are
given, :class:`torch.fx.passes.shape_prop.ShapeProp` runs on a copy.

Fusion rules modelled (a simplification of Inductor's scheduler)
----------------------------------------------------------------
1. Views (slice, view/reshape, permute, getitem, ...) launch nothing; a
   consumer of a view of X is treated as a consumer of X.
2. Vertical fusion: a POINTWISE / REDUCTION / CAT / GATHER node joins the
   group of each fusible producer (union-find), if the iteration ranges are
   compatible and the merge keeps the group graph acyclic (no path that leaves
   the group and comes back).
3. Horizontal fusion: fusible groups reading the same data are merged under
   the same two conditions (Inductor only fuses nodes that share data). "Same
   data" is Inductor's shared MemoryDep (buffer and index): a whole buffer or
   one and the same subset view; two different slices of one buffer do not
   share data. Approximation ("cpp" only): subsets of a graph input
   (placeholder) still count as shared; this stands in for Inductor's
   locality reordering, which lines up e.g. layer norms on slices of one
   input ahead of the extern calls. On "triton" slices of an input do not
   share (GPU dumps: dcnv2's 16 lookups on columns of one index input are 16
   kernels, dynamic_schema's 20 layer norms on slices of one input are 20).
4. MATMUL (mm/addmm/bmm/linear/conv) and OPAQUE ops are extern calls: one
   launch each, never fused. A linear with bias is one ``addmm`` (bias fused).
5. CAT ("triton"): see rules 9 and 10 (``lowering.cat`` chooses per cat).
   CAT ("cpp"): Inductor's CPU lowering always builds a ConcatKernel
   (``lowering.cat``: pointwise cat is off on CPU), so a cat never fuses
   with its producers or consumers. It is free when every input is a whole
   view (view/reshape/unsqueeze/...) of a generated, non-cat buffer not
   already written into an earlier cat; otherwise it is one copy node, which
   joins readers of the same data horizontally (rule 3).
6. Small matmuls that Inductor decomposes into generated code (see
   ``_DECOMPOSED_MM``): bmm with M == 1 or N == 1 on CPU (``tuned_bmm``
   "decompose to small ops when memory bound"); dot-shaped bmm (M == N == 1,
   K <= 32, float dtypes assumed) on GPU; addmm/mm per
   ``torch/_inductor/decomposition.py``.
7. Placement ("cpp"): lowering keeps a pointwise result unrealized (inlined
   into its readers) until a reader needs a buffer, so a generated group is
   scheduled at its first reader outside the group (views looked through; an
   extern call, a cat, the graph output), not where its first node is.

"triton" rules calibrated on Inductor's CUDA output code (torch 2.11, H200;
benchmarks/results/gpu/code/, dcnv2 and dynamic_schema under Inductor,
Inductor+Optimus and optimus_eqsat graphs):

8. A layer norm over fewer than 8 elements (``unroll_reductions_threshold``)
   is two kernels: a statistics kernel over the rows and an output kernel
   over all elements, which cannot fuse with the norm's input producer (the
   statistics sit between). Evidence: dynamic_schema's width-4 norms are
   ``triton_poi_..._layer_norm`` (32) + ``triton_poi_..._layer_norm`` (128);
   widths 8 and 16 are one ``triton_per_`` kernel.
9. A cat with more than 8 inputs (``max_pointwise_cat_inputs``), or one that
   rule 10 does not make pointwise, is a ConcatKernel: it never fuses; a whole
   view of a generated buffer is computed straight into its slice (free);
   copies of graph inputs (placeholders, parameters) are one foreach kernel
   (``triton_for_fused``, ``register_operation_list``); every other input (a
   slice of a generated buffer, an extern output) is one copy kernel of its
   own. Evidence: dcnv2's 17-input cat (one dense copy, lookups write their
   slices); our dynamic_schema graph's 20-input parameter cats (one
   ``triton_for_fused`` each) and its 20-input cat of narrows (20 kernels).
10. A cat with at most 8 inputs is one pointwise kernel when (some input
   needs a copy and every reader is pointwise or a cat) or (every input needs
   a copy and none reads a reduction); "needs a copy": an unrealized
   pointwise value, or a graph input / extern output. The pointwise cat
   inlines its unrealized inputs and, recursively, their unrealized
   producers read only by them, whatever their numel. "Unrealized": a
   pointwise value (incl. gathers, one-element sums, pointwise cats) with at
   most 8 accumulated reads and a small inner function (30 ops, a cat input
   counted as 5), and if read more than once at most 4 reads
   (``realize_acc_reads_threshold``, ``realize_opcount_threshold``,
   ``realize_reads_threshold``). Evidence: dcnv2's last cat
   (``triton_poi_fused_add_addmm_cat_mul_relu``), dynamic_schema's per-block
   cats (one kernel for 8 linear epilogues), unbind->stack with tanh.
11. A pointwise group whose outputs are all read by generated code that
   inlines them (no extern call, not the graph output, not realized into a
   ConcatKernel slice) launches nothing. Evidence: our dynamic_schema graph's
   batched add+relu / add+sigmoid / tanh read through 20 narrows are
   recomputed in the 20 copy kernels.
Also on "triton", a consumer reading a producer through a view is a direct
read in the fusion cycle check ("cpp" keeps the stricter check it was
calibrated with, which treats the view as a path leaving the group).
Not modelled: the GPU post-grad pass that turns addmm into mm + a bias add
fused into pointwise readers (count-neutral in these dumps), the Optimus
post-grad batching passes (one extra ``unbind`` copy kernel in
dynamic_schema's Inductor+Optimus dump), combo kernels (off by default).

Range compatibility depends on ``profile.codegen``:

- "triton" (GPU): pointwise ranges must have equal numel; a reduction
  ``(outer, r)`` fuses with pointwise of numel ``outer`` or ``outer * r``;
  two reductions only if their ranges are equal. Each group is one kernel.
- "cpp" (CPU): C++ kernels can hold several loop nests, so ranges always fit;
  moreover the C++ backend appends every generated group to one kernel until
  an extern call flushes it, so consecutive groups in schedule order (extern
  calls at their node, generated groups where they are realized (rule 7),
  then a depth-first topological sort, as Inductor's
  ``topological_sort_schedule``) form one kernel.

Approximations: Inductor's memory-driven reordering
(``reorder_for_peak_memory``, which for example moves an expert's last relu
up next to its addmm so that it splits the run of extern calls: the model
then predicts a few kernels too few on MMoE/PLE-style expert stacks) and
post-grad ``reorder_for_locality``, ``max_fusion_size``,
pointwise-cat input limits, realization heuristics, epilogue/template fusion
(max-autotune) and the C++ backend's argument-count flush are not modelled;
shapes that are unknown are treated as compatible (optimistic fusion).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.fx as fx
from torch import nn

from optimus_eqsat.extract.cost_model import (
    FUSIBLE_KINDS,
    DeviceProfile,
    KernelKind,
    get_profile,
    kernel_time,
)

__all__ = [
    "PredictedKernel",
    "TensorInfo",
    "classify_node",
    "node_tensor_infos",
    "predict_kernels",
    "predicted_launches",
    "predicted_time",
]

log = logging.getLogger(__name__)
K = KernelKind

# --------------------------------------------------------------------------
# Classification tables (op name -> kind). Names are normalized: aten
# overloads lose namespace and overload ("aten::relu.default" -> "relu"),
# in-place methods lose the trailing "_" when the plain name is known.
# --------------------------------------------------------------------------

VIEW_OPS = frozenset({
    "view", "reshape", "_unsafe_view", "_reshape_alias", "view_as", "reshape_as",
    "permute", "transpose", "t", "swapaxes", "swapdims", "movedim", "moveaxis",
    "numpy_T", "mT", "adjoint",
    "squeeze", "unsqueeze", "flatten", "unflatten", "expand", "expand_as",
    "slice", "select", "narrow", "split", "split_with_sizes", "tensor_split",
    "chunk", "unbind", "getitem", "__getitem__", "as_strided", "unfold",
    "alias", "detach", "lift_fresh", "lift_fresh_copy",
    "contiguous",  # approximation: a copy only when non-contiguous
    "identity", "real", "view_as_real", "view_as_complex",
    # allocations launch nothing by themselves
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
})

POINTWISE_OPS = frozenset({
    "add", "sub", "rsub", "mul", "div", "truediv", "floordiv", "true_divide",
    "floor_divide", "mod", "remainder", "fmod", "pow", "neg", "abs", "sign",
    "relu", "relu6", "gelu", "silu", "mish", "elu", "selu", "celu", "leaky_relu",
    "hardtanh", "hardswish", "hardsigmoid", "softplus", "prelu", "threshold",
    "sigmoid", "tanh", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p",
    "sqrt", "rsqrt", "reciprocal", "square", "erf", "erfc", "sin", "cos", "tan",
    "floor", "ceil", "round", "trunc", "frac", "clamp", "clamp_min", "clamp_max",
    "clip", "maximum", "minimum", "fmax", "fmin", "where", "masked_fill", "lerp",
    "addcmul", "addcdiv", "nan_to_num", "isnan", "isinf", "isfinite",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not",
    "logical_xor", "bitwise_and", "bitwise_or", "bitwise_not", "bitwise_xor",
    "and_", "or_", "xor", "invert", "not_",
    "to", "type", "type_as", "float", "half", "bfloat16", "double", "int", "long",
    "bool", "_to_copy", "convert_element_type", "clone", "copy", "copy_",
    "fill", "zero", "zeros", "ones", "full", "zeros_like", "ones_like",
    "full_like", "scalar_tensor", "arange", "rand", "randn", "rand_like",
    "randn_like", "bernoulli", "native_dropout", "dropout", "alpha_dropout",
    "repeat", "tile", "flip", "roll", "pad", "constant_pad_nd", "tril", "triu",
    "threshold_backward", "sigmoid_backward", "tanh_backward", "gelu_backward",
    "silu_backward", "native_dropout_backward", "hardswish_backward",
    "leaky_relu_backward", "_native_batch_norm_legit_no_training",
    # backward-graph fills and scatters into views: Inductor decomposes them
    # (slice_backward = new_zeros + slice_scatter) into masked pointwise code
    "new_zeros", "new_ones", "new_full", "new_empty", "empty", "empty_like",
    "slice_backward", "select_backward", "slice_scatter", "select_scatter",
})

REDUCTION_OPS = frozenset({
    "sum", "mean", "prod", "amax", "amin", "max", "min", "argmax", "argmin",
    "any", "all", "var", "std", "var_mean", "std_mean", "norm", "linalg_vector_norm",
    "logsumexp", "softmax", "_softmax", "log_softmax", "_log_softmax",
    "layer_norm", "native_layer_norm", "group_norm", "native_group_norm",
    "rms_norm", "_fused_rms_norm", "batch_norm", "native_batch_norm",
    "_native_batch_norm_legit", "instance_norm", "cumsum", "cumprod",
    "normalize", "cross_entropy", "nll_loss", "mse_loss", "_softmax_backward_data",
    "_log_softmax_backward_data", "native_layer_norm_backward",
})

MATMUL_OPS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv",
    "addbmm", "einsum", "bilinear", "_addmm_activation",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "convolution", "_convolution",
})

CAT_OPS = frozenset({"cat", "concat", "concatenate", "stack", "hstack", "vstack"})

GATHER_OPS = frozenset({
    "embedding", "index_select", "gather", "index", "take", "take_along_dim",
})

# Library fallbacks Inductor calls as one extern kernel.
OPAQUE_OPS = frozenset({
    "embedding_bag", "_embedding_bag", "_embedding_bag_forward_only",
    "sort", "topk", "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "index_put", "scatter", "scatter_add", "scatter_reduce", "index_add",
    "nonzero", "unique", "multinomial",
})

# Scalar / shape bookkeeping: no tensor work at all.
NONE_OPS = frozenset({
    "getattr", "size", "dim", "numel", "stride", "sym_size", "sym_numel",
    "sym_stride", "sym_storage_offset", "_assert", "_assert_async",
    "_assert_tensor_metadata", "sym_constrain_range_for_size", "_check",
    "_check_is_size", "sym_not", "sym_float", "sym_int", "sym_max", "sym_min",
})

OP_KINDS: dict[str, KernelKind] = {
    **{n: K.POINTWISE for n in POINTWISE_OPS},
    **{n: K.REDUCTION for n in REDUCTION_OPS},
    **{n: K.MATMUL for n in MATMUL_OPS},
    **{n: K.CAT for n in CAT_OPS},
    **{n: K.GATHER for n in GATHER_OPS},
    **{n: K.OPAQUE for n in OPAQUE_OPS},
    **{n: K.VIEW for n in VIEW_OPS},
    **{n: K.NONE for n in NONE_OPS},
}

# Grouped linear (optimus_eqsat::grouped_linear, or the Python helper of that
# name): N linears in one extern call. On "triton" profiles one launch (the
# Triton grouped GEMM); on "cpp" the op runs one F.linear per member, so it is
# predicted as N matmul kernels. See _grouped_linear_kernels.
GROUPED_OPS = frozenset({"grouped_linear"})
OP_KINDS.update({n: K.MATMUL for n in GROUPED_OPS})
# Batched embedding's index shift (rewrites/batching.py, shift_segments): elementwise.
OP_KINDS["shift_segments"] = K.POINTWISE

# call_module targets: the first class in the module's MRO found here wins.
MODULE_KINDS: dict[type, KernelKind] = {
    nn.Linear: K.MATMUL, nn.Bilinear: K.MATMUL, nn.LazyLinear: K.MATMUL,
    nn.modules.conv._ConvNd: K.MATMUL,
    nn.ReLU: K.POINTWISE, nn.ReLU6: K.POINTWISE, nn.GELU: K.POINTWISE,
    nn.SiLU: K.POINTWISE, nn.Sigmoid: K.POINTWISE, nn.Tanh: K.POINTWISE,
    nn.LeakyReLU: K.POINTWISE, nn.ELU: K.POINTWISE, nn.SELU: K.POINTWISE,
    nn.Hardswish: K.POINTWISE, nn.Hardsigmoid: K.POINTWISE, nn.Hardtanh: K.POINTWISE,
    nn.Softplus: K.POINTWISE, nn.Mish: K.POINTWISE, nn.PReLU: K.POINTWISE,
    nn.Threshold: K.POINTWISE, nn.modules.dropout._DropoutNd: K.POINTWISE,
    nn.LayerNorm: K.REDUCTION, nn.GroupNorm: K.REDUCTION, nn.RMSNorm: K.REDUCTION,
    nn.modules.batchnorm._BatchNorm: K.REDUCTION,
    nn.modules.instancenorm._InstanceNorm: K.REDUCTION,
    nn.Softmax: K.REDUCTION, nn.LogSoftmax: K.REDUCTION,
    nn.Embedding: K.GATHER, nn.EmbeddingBag: K.OPAQUE,
    nn.Flatten: K.VIEW, nn.Unflatten: K.VIEW, nn.Identity: K.VIEW,
}

# Rough FLOPs per output element (per input element for reductions); default 1.
FLOPS_PER_ELEMENT: dict[str, float] = {
    "gelu": 8, "silu": 4, "sigmoid": 4, "tanh": 4, "exp": 2, "erf": 6, "mish": 8,
    "softmax": 5, "_softmax": 5, "log_softmax": 6, "_log_softmax": 6,
    "layer_norm": 8, "native_layer_norm": 8, "group_norm": 8, "rms_norm": 5,
    "batch_norm": 4, "var": 3, "var_mean": 3, "std": 3,
}


# --------------------------------------------------------------------------
# Op names and classification
# --------------------------------------------------------------------------

def target_name(target: Any) -> str:
    """Normalized op name of a call_function / call_method target."""
    if isinstance(target, str):
        return target
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1]
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name.split("::")[-1]
    return getattr(target, "__name__", type(target).__name__)


def fetch_attr(gm: fx.GraphModule, target: str) -> Any:
    """The value a ``get_attr`` node reads: ``target`` is a dotted path ("projs.3.bias")."""
    obj: Any = gm
    for atom in target.split("."):
        obj = getattr(obj, atom)
    return obj


def _lookup(name: str) -> KernelKind | None:
    if name in OP_KINDS:
        return OP_KINDS[name]
    if name.endswith("_") and not name.endswith("__") and name[:-1] in OP_KINDS:
        return OP_KINDS[name[:-1]]  # in-place variant: relu_ -> relu
    return None


def _module_kind(module: nn.Module) -> KernelKind:
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


def _arg_nodes(node: fx.Node) -> list[fx.Node]:
    return list(node.all_input_nodes)


def _is_tensor_node(node: Any) -> bool:
    """True when ``node`` is an FX node whose meta says it holds a tensor."""
    if not isinstance(node, fx.Node):
        return False
    infos = node_tensor_infos(node)
    return bool(infos)


def _refine(name: str, node: fx.Node, kind: KernelKind) -> KernelKind:
    """Named side conditions that change a table kind for one node."""
    if name in ("getitem", "__getitem__") and len(node.args) > 1:
        index = node.args[1]
        parts = index if isinstance(index, (tuple, list)) else (index,)
        if any(_is_tensor_node(p) for p in parts):
            return K.GATHER  # advanced indexing: x[idx_tensor]
    if name in ("max", "min") and sum(isinstance(a, fx.Node) for a in node.args) >= 2:
        if len(node.args) >= 2 and _is_tensor_node(node.args[1]):
            return K.POINTWISE  # torch.max(a, b) is elementwise
    if name in ("dropout", "alpha_dropout") and node.kwargs.get("training", True) is False:
        return K.VIEW  # eval dropout is the identity
    if name == "batch_norm":
        training = node.kwargs.get("training", node.args[5] if len(node.args) > 5 else True)
        return K.REDUCTION if training else K.POINTWISE
    return kind


def _classify(gm: fx.GraphModule, node: fx.Node, infos: list[TensorInfo] | None) -> KernelKind:
    if node.op in ("placeholder", "output", "get_attr"):
        return K.NONE
    if node.op == "call_module":
        try:
            return _module_kind(gm.get_submodule(node.target))
        except AttributeError:
            return K.OPAQUE
    name = target_name(node.target)
    kind = _lookup(name)
    if kind is None:
        kind = K.OPAQUE
    kind = _refine(name, node, kind)
    # Scalar arithmetic (SymInt math in Dynamo graphs) launches nothing.
    if kind not in (K.VIEW, K.NONE) and infos is not None and not infos:
        return K.NONE
    return kind


def classify_node(gm: fx.GraphModule, node: fx.Node) -> KernelKind:
    """The :class:`KernelKind` ``node`` becomes under Inductor (before fusion)."""
    return _classify(gm, node, node_tensor_infos(node))


# --------------------------------------------------------------------------
# Shapes
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorInfo:
    """Shape (None where symbolic and unhinted) and element size of a tensor."""

    shape: tuple[int | None, ...]
    itemsize: int

    @property
    def numel(self) -> int | None:
        total = 1
        for dim in self.shape:
            if dim is None:
                return None
            total *= dim
        return total

    @property
    def nbytes(self) -> int:
        return (self.numel or 0) * self.itemsize


def _dim(size: Any) -> int | None:
    try:
        return int(size)
    except Exception:  # unhinted SymInt
        return None


def _infos_of(value: Any) -> list[TensorInfo] | None:
    """Tensors in a meta value (flattened); None when it says nothing."""
    from torch.fx.passes.shape_prop import TensorMetadata

    if isinstance(value, torch.Tensor):
        return [TensorInfo(tuple(_dim(s) for s in value.shape), value.dtype.itemsize)]
    if isinstance(value, TensorMetadata):
        return [TensorInfo(tuple(_dim(s) for s in value.shape), value.dtype.itemsize)]
    if isinstance(value, (tuple, list)):
        out: list[TensorInfo] = []
        for item in value:
            out.extend(_infos_of(item) or [])
        return out
    if isinstance(value, dict):
        return _infos_of(list(value.values()))
    if value is None:
        return None
    return []  # int, float, SymInt, bool: known and not a tensor


# meta key under which optimus_eqsat's rebuild leaves a TensorInfo known from the
# e-graph's shape analysis: cheap shapes for candidate programs, no fake tensors.
SHAPE_META = "optimus_eqsat_shape"


def node_tensor_infos(node: fx.Node) -> list[TensorInfo] | None:
    """Tensors a node produces, from ``meta["val"]`` / ``["example_value"]`` /
    ``["tensor_meta"]`` / ``[SHAPE_META]``; None when no meta is present."""
    for key in ("val", "example_value", "tensor_meta"):
        if key in node.meta and node.meta[key] is not None:
            return _infos_of(node.meta[key])
    known = node.meta.get(SHAPE_META)  # set by the optimizer's rebuild from e-graph shapes
    return [known] if known is not None else None


def _shape_prop_infos(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> dict[str, list[TensorInfo] | None]:
    """Run ShapeProp on a copy of the graph (sharing parameters); by node name."""
    from torch.fx.passes.shape_prop import ShapeProp

    graph_copy = copy.deepcopy(gm.graph)
    twin = fx.GraphModule(gm, graph_copy)
    try:
        with torch.no_grad():
            ShapeProp(twin).propagate(*example_inputs)
    except Exception as exc:  # shapes are a refinement; never fail the prediction
        log.warning("ShapeProp failed (%s); predicting without shapes", exc)
        return {}
    return {n.name: _infos_of(n.meta.get("tensor_meta")) for n in twin.graph.nodes}


def _all_infos(gm: fx.GraphModule, example_inputs: Sequence[Any] | None) -> dict[fx.Node, list[TensorInfo] | None]:
    infos = {n: node_tensor_infos(n) for n in gm.graph.nodes}
    missing = any(v is None and n.op not in ("output",) for n, v in infos.items())
    if missing and example_inputs is not None:
        by_name = _shape_prop_infos(gm, tuple(example_inputs))
        for node, value in infos.items():
            if value is None:
                infos[node] = by_name.get(node.name)
    return infos


# --------------------------------------------------------------------------
# Small matmuls Inductor decomposes into generated code
# (torch/_inductor/decomposition.py: mm, addmm, bmm)
# --------------------------------------------------------------------------

def _mm_form(gm: fx.GraphModule, node: fx.Node, infos) -> tuple[str, int, int, int] | None:
    """("mm" | "addmm" | "bmm", M, K, N) of a matmul node; None if unknown."""
    name = _op_label(gm, node).lower()
    out = infos.get(node)
    tensors = [i for i in _arg_nodes(node) if infos.get(i)]
    if not out or not tensors or out[0].numel is None:
        return None
    if name in ("addmm", "baddbmm"):
        tensors = tensors[1:]
    if not tensors:
        return None
    lhs = infos[tensors[0]][0].shape
    rhs = infos[tensors[1]][0].shape if len(tensors) > 1 else None
    if not lhs or any(d is None for d in lhs) or not out[0].shape:
        return None
    k, n = lhs[-1], out[0].shape[-1]
    if name in ("bmm", "baddbmm") or (name in ("matmul", "__matmul__") and rhs and len(rhs) > 2):
        return "bmm", lhs[-2] if len(lhs) > 1 else 1, k, n
    if name not in ("linear", "mm", "addmm", "matmul", "__matmul__"):
        return None
    m = (out[0].numel // n) if n else 0
    biased = _has_bias(gm, node, name) and name != "matmul"
    return ("addmm" if biased else "mm"), m, k, n


# (form, codegen) -> predicate on (M, K, N): True when Inductor decomposes
# the matmul into a pointwise product (K == 1) or a small dot-product reduction.
_DECOMPOSED_MM: dict[tuple[str, str], Callable[[int, int, int], bool]] = {
    ("mm", "triton"): lambda m, k, n: k == 1 and m != 1 and n != 1,
    ("addmm", "triton"): lambda m, k, n: k == 1 and m != 1 and n != 1,
    # kernel/bmm.py tuned_bmm: dot-shaped bmm (M == N == 1, K <= 32) stays
    # generated code on GPUs (float dtypes; the dtype is not checked here).
    ("bmm", "triton"): lambda m, k, n: k == 1 or (m == 1 and n == 1 and k <= 32),
    ("mm", "cpp"): lambda m, k, n: (m == 1 and n == 1) or (k == 1 and m != 1 and n != 1 and m + n <= 32),
    ("addmm", "cpp"): lambda m, k, n: m == 1 and (n == 1 or (k <= 16 and n <= 16)),
    # kernel/bmm.py tuned_bmm on CPU: "decompose to small ops when memory
    # bound" whenever M == 1 or N == 1, whatever K.
    ("bmm", "cpp"): lambda m, k, n: k == 1 or m == 1 or n == 1,
}


def _decomposed_kind(gm: fx.GraphModule, node: fx.Node, infos, codegen: str) -> KernelKind | None:
    """POINTWISE / REDUCTION when Inductor turns this small matmul into generated code."""
    form = _mm_form(gm, node, infos)
    if form is None:
        return None
    name, m, k, n = form
    rule = _DECOMPOSED_MM.get((name, codegen))
    if rule is None or not rule(m, k, n):
        return None
    return K.POINTWISE if k == 1 else K.REDUCTION


# --------------------------------------------------------------------------
# Fusion (union-find over FX nodes)
# --------------------------------------------------------------------------

Range = tuple[int, int]  # (outer numel, reduction numel); r == 1 for pointwise


class _Groups:
    """Union-find of fusible nodes with members, first position and range."""

    def __init__(self, pos: dict[fx.Node, int]):
        self.pos = pos
        self.parent: dict[fx.Node, fx.Node] = {}
        self.members: dict[fx.Node, list[fx.Node]] = {}
        self.range: dict[fx.Node, Range | None] = {}
        self.has_range: dict[fx.Node, bool] = {}
        self.min_pos: dict[fx.Node, int] = {}
        # Inputs from outside the group, kept per root so cycle checks cost the
        # group's boundary, not its size (long fused chains were quadratic).
        self.external: dict[fx.Node, set[fx.Node]] = {}

    def add(self, node: fx.Node, rng: Range | None) -> None:
        self.parent[node] = node
        self.members[node] = [node]
        self.range[node] = rng
        self.min_pos[node] = self.pos[node]
        self.external[node] = set(_arg_nodes(node)) - {node}

    def find(self, node: fx.Node) -> fx.Node:
        root = node
        while self.parent[root] is not root:
            root = self.parent[root]
        while self.parent[node] is not root:  # path compression
            self.parent[node], node = root, self.parent[node]
        return root

    def union(self, a: fx.Node, b: fx.Node, rng: Range | None) -> fx.Node:
        ra, rb = self.find(a), self.find(b)
        if ra is rb:
            return ra
        if len(self.members[ra]) < len(self.members[rb]):
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.members[ra].extend(self.members.pop(rb))
        self.min_pos[ra] = min(self.min_pos[ra], self.min_pos.pop(rb))
        joined = self.external[ra] | self.external.pop(rb)
        self.external[ra] = {p for p in joined if p not in self.parent or self.find(p) is not ra}
        self.range[ra] = rng
        self.range.pop(rb, None)
        return ra


def _merge_range(a: Range | None, b: Range | None, codegen: str) -> tuple[bool, Range | None]:
    """(compatible, merged range) of two iteration ranges."""
    if codegen == "cpp" or a is None or b is None:
        return True, a or b  # C++ kernels hold any mix of loop nests
    (na, ra), (nb, rb) = a, b
    if ra == 1 and rb == 1:
        return na == nb, a
    if ra > 1 and rb > 1:
        return a == b, a
    red, pw = (a, b) if ra > 1 else (b, a)
    return pw[0] in (red[0], red[0] * red[1]), red


# Inductor constants the "triton" rules use (torch/_inductor/config.py).
UNROLL_REDUCTIONS_THRESHOLD = 8  # unroll_reductions_threshold: r < 8 becomes pointwise code
MAX_POINTWISE_CAT_INPUTS = 8  # max_pointwise_cat_inputs
REALIZE_ACC_READS = 8  # realize_acc_reads_threshold: more reads, the value is realized
REALIZE_READS = 4  # realize_reads_threshold: a reused value with more reads is realized
REALIZE_OPCOUNT = 30  # realize_opcount_threshold: a bigger inner function is realized
CAT_OPS_PER_INPUT = 5  # ops of one pointwise-cat input (bounds check, mask, masked load, where)

# Normalizations: a reduction whose output has the input's shape.
_NORM_OPS = frozenset({
    "layer_norm", "native_layer_norm", "group_norm", "native_group_norm", "rms_norm",
    "_fused_rms_norm", "batch_norm", "native_batch_norm", "_native_batch_norm_legit",
    "instance_norm", "softmax", "_softmax", "log_softmax", "_log_softmax", "normalize",
    "layernorm", "groupnorm", "rmsnorm", "batchnorm1d", "batchnorm2d", "batchnorm3d",
    "instancenorm1d", "instancenorm2d", "instancenorm3d", "logsoftmax",
})
# Rule 8 (evidence: layer norms of width 4 vs 8/16 in the GPU dumps).
_UNROLLED_NORM_OPS = frozenset({"layer_norm", "native_layer_norm", "LayerNorm"})


def _norm_size(node: fx.Node) -> int | None:
    """Elements one layer norm reduces over (its normalized_shape), if known."""
    shape = node.args[1] if len(node.args) > 1 else node.kwargs.get("normalized_shape")
    if node.op == "call_module":
        return None  # LayerNorm modules: see _Fusion._plan_triton
    if isinstance(shape, int):
        return shape
    if isinstance(shape, (tuple, list)) and all(isinstance(d, int) for d in shape):
        total = 1
        for d in shape:
            total *= d
        return total
    return None


class _Fusion:
    """Groups fusible nodes of one graph into generated kernels."""

    def __init__(self, gm: fx.GraphModule, kinds: dict[fx.Node, KernelKind],
                 infos: dict[fx.Node, list[TensorInfo] | None], codegen: str):
        self.nodes = list(gm.graph.nodes)
        self.pos = {n: i for i, n in enumerate(self.nodes)}
        self.gm, self.kinds, self.infos, self.codegen = gm, kinds, infos, codegen
        self.base: dict[fx.Node, fx.Node] = {}
        self.groups = _Groups(self.pos)
        # "triton" only (rules 8-11): layer norms whose reduction Inductor
        # unrolls, cats lowered as one pointwise kernel, cats lowered as a
        # ConcatKernel, and the producers each pointwise cat inlines.
        self.unrolled: set[fx.Node] = set()
        self.pw_cats: set[fx.Node] = set()
        self.concat_cats: set[fx.Node] = set()
        self.absorbed: dict[fx.Node, list[fx.Node]] = {}
        self.unrealized: dict[fx.Node, bool] = {}
        self.acc_reads: dict[fx.Node, set[fx.Node]] = {}
        self.inlined: set[fx.Node] = set()  # set by predict_kernels (rule 11)
        self._consumers: dict[fx.Node, list[fx.Node]] = {}

    # -- data flow through views -------------------------------------------
    def _resolve_views(self) -> None:
        for node in self.nodes:
            src = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
            if src is None and node.all_input_nodes:
                src = node.all_input_nodes[0]
            is_view = self.kinds[node] is K.VIEW and src is not None
            self.base[node] = self.base[src] if is_view else node

    def _read_key(self, inp: fx.Node) -> fx.Node:
        """What reading ``inp`` touches: its base buffer when ``inp`` is (a whole
        view of) it, else the subset view itself (a slice, select, ...)."""
        if self.codegen == "cpp" and self.base[inp].op == "placeholder":
            return self.base[inp]  # approximation, see the module docstring (rule 3)
        node = inp
        while node is not self.base[inp]:
            if target_name(node.target) not in _WHOLE_VIEW_OPS and node.op != "call_module":
                return inp
            node = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else node.all_input_nodes[0]
        return node

    def producers(self, node: fx.Node) -> list[fx.Node]:
        """Buffers ``node`` reads (views resolved), in argument order."""
        seen: dict[fx.Node, None] = {}
        for inp in _arg_nodes(node):
            seen.setdefault(self.base[inp], None)
        return list(seen)

    def _range(self, node: fx.Node) -> Range | None:
        """(outer, r) iteration range; a reduction's r = biggest input / output."""
        out = self.infos.get(node)
        if not out or out[0].numel is None:
            return None
        numel = out[0].numel
        if self.kinds[node] is not K.REDUCTION:
            return (numel, 1)
        ins = [info.numel for i in _arg_nodes(node) for info in (self.infos.get(i) or [])]
        biggest = max((n for n in ins if n is not None), default=0)
        if numel == 0 or biggest <= numel:
            return (numel, 1)
        return (numel, biggest // numel)

    # -- acyclicity ----------------------------------------------------------
    def _creates_cycle(self, roots: Iterable[fx.Node]) -> bool:
        """Would contracting the groups ``roots`` into one make a cycle?

        True when a path leaves the union and comes back into it; searched
        upward from the union's external inputs, pruned below its first node.
        """
        roots = set(roots)
        groups = self.groups
        floor = min(groups.min_pos[r] for r in roots)
        stack = [p for r in roots for p in groups.external[r]]
        if self.codegen == "triton":
            # A view of a member is a direct read of it, not a path that
            # leaves the union (views launch nothing). Not applied to "cpp",
            # whose calibrated counts were made with the stricter check.
            stack = [self.base[p] for p in stack]
        stack = [p for p in stack if p not in groups.parent or groups.find(p) not in roots]
        seen: set[fx.Node] = set()
        while stack:
            node = stack.pop()
            if node in seen or self.pos[node] < floor:
                continue
            seen.add(node)
            if node in groups.parent:  # a whole group moves as one unit
                root = groups.find(node)
                if root in roots:
                    return True
                for m in groups.members[root]:
                    seen.add(m)
                stack.extend(groups.external[root])
            else:
                stack.extend(_arg_nodes(node))
        return False

    def _try_merge(self, a: fx.Node, b: fx.Node) -> bool:
        ra, rb = self.groups.find(a), self.groups.find(b)
        if ra is rb:
            return True
        ok, rng = _merge_range(self.groups.range[ra], self.groups.range[rb], self.codegen)
        if not ok or self._creates_cycle((ra, rb)):
            return False
        self.groups.union(ra, rb, rng)
        return True

    def _force_merge(self, prod: fx.Node, cat: fx.Node) -> bool:
        """Inline a pointwise producer into a pointwise cat (rule 10): any
        numel, the cat's range, unless a reduction's range is in the way."""
        ra, rb = self.groups.find(prod), self.groups.find(cat)
        if ra is rb:
            return True
        if any(rng is not None and rng[1] > 1 for rng in (self.groups.range[ra], self.groups.range[rb])):
            return self._try_merge(prod, cat)
        if self._creates_cycle((ra, rb)):
            return False
        self.groups.union(ra, rb, self.groups.range[rb])
        return True

    # -- triton lowering decisions (rules 8-11) ------------------------------
    def consumers(self, node: fx.Node) -> list[fx.Node]:
        """Non-view users of ``node``, views looked through (the output node included).

        Memoized: cat planning asks again for every cat reading a node, and a batched
        tensor can have thousands of view users (seconds per prediction at 2,000 features).
        """
        if node in self._consumers:
            return self._consumers[node]
        out: list[fx.Node] = []
        self._consumers[node] = out
        stack = list(node.users)
        seen: set[fx.Node] = set()
        while stack:
            user = stack.pop()
            if user in seen:
                continue
            seen.add(user)
            if self.kinds.get(user) is K.VIEW:
                stack.extend(user.users)
            else:
                out.append(user)
        return out

    def _pointwise_like(self, node: fx.Node) -> bool:
        """An Inductor ``Pointwise`` at lowering: elementwise ops, gathers
        (embedding is an indirect load), reductions over one element, pointwise cats."""
        kind = self.kinds[node]
        if node in self.pw_cats or kind in (K.POINTWISE, K.GATHER):
            return True
        if kind is not K.REDUCTION or _op_label(self.gm, node).lower() in _NORM_OPS:
            return False
        rng = self.groups.range.get(node) if node in self.groups.parent else None
        return rng is not None and rng[1] == 1  # a sum over one element

    def _plan_triton(self) -> None:
        """Decide, in graph order, which nodes stay unrealized (inlined into
        their readers), and how each cat is lowered (lowering.py ``cat``)."""
        reads_reduction: dict[fx.Node, bool] = {}
        opcount: dict[fx.Node, int] = {}
        for node in self.nodes:
            kind = self.kinds[node]
            if kind is K.REDUCTION and _op_label(self.gm, node) in _UNROLLED_NORM_OPS:
                r = _norm_size(node)
                if node.op == "call_module":
                    shape = getattr(self.gm.get_submodule(node.target), "normalized_shape", None)
                    r = None if shape is None else int(torch.Size(shape).numel())
                if r is not None and 1 < r < UNROLL_REDUCTIONS_THRESHOLD:
                    self.unrolled.add(node)
            if kind is K.CAT and node in self.groups.parent:
                self._plan_cat(node, reads_reduction)
            if not self._pointwise_like(node):
                continue
            acc: set[fx.Node] = set()
            red = False
            inputs = _arg_nodes(node)
            # inner-function size: a masked load per cat input, one op per node
            ops = CAT_OPS_PER_INPUT * len(inputs) if node in self.pw_cats else 1
            for inp in inputs:
                b = self.base[inp]
                if self.unrealized.get(b):
                    acc |= self.acc_reads[b]
                    red = red or reads_reduction[b]
                    ops += opcount[b]
                else:
                    acc.add(self._read_key(inp))
                    red = red or (self.kinds[b] is K.REDUCTION and not self._pointwise_like(b))
            self.acc_reads[node] = acc
            reads_reduction[node] = red
            opcount[node] = ops
            # realize_acc_reads_threshold (8), realize_opcount_threshold (30);
            # on reuse, realize_reads_threshold (4)
            self.unrealized[node] = len(acc) <= REALIZE_ACC_READS and ops <= REALIZE_OPCOUNT and (
                len(node.users) <= 1 or len(acc) <= REALIZE_READS)

    def _plan_cat(self, cat: fx.Node, reads_reduction: dict[fx.Node, bool]) -> None:
        inputs = [i for i in _arg_nodes(cat) if self.infos.get(i) != []]
        if not inputs or len(inputs) > MAX_POINTWISE_CAT_INPUTS:
            self.concat_cats.add(cat)
            return
        needs_copy, reduction = [], []
        for inp in inputs:
            b = self.base[inp]
            unrealized = bool(self.unrealized.get(b))
            needs_copy.append(unrealized or b not in self.groups.parent)
            reduction.append((self.kinds[b] is K.REDUCTION and not self._pointwise_like(b))
                             or (unrealized and reads_reduction.get(b, False)))
        users = self.consumers(cat)
        pointwise_uses = bool(users) and all(self.kinds.get(u) in (K.POINTWISE, K.CAT) for u in users)
        if (any(needs_copy) and pointwise_uses) or (all(needs_copy) and not any(reduction)):
            self.pw_cats.add(cat)
            # Inlined: each unrealized input read only here, and, recursively,
            # the unrealized producers read only by an inlined node.
            absorbed = [self.base[i] for i in inputs
                        if self.unrealized.get(self.base[i]) and len(self.consumers(self.base[i])) == 1]
            stack = list(absorbed)
            while stack:
                for inp in _arg_nodes(stack.pop()):
                    prod = self.base[inp]
                    if (self.unrealized.get(prod) and prod not in absorbed
                            and len(self.consumers(prod)) == 1):
                        absorbed.append(prod)
                        stack.append(prod)
            self.absorbed[cat] = absorbed
        else:
            self.concat_cats.add(cat)

    # -- passes ----------------------------------------------------------------
    def run(self) -> _Groups:
        self._resolve_views()
        for node in self.nodes:
            if self.kinds[node] in FUSIBLE_KINDS:
                self.groups.add(node, self._range(node))
        if self.codegen == "triton":
            self._plan_triton()
        # C++: a cat is always a ConcatKernel (lowering.py ``cat``: pointwise
        # cat is off on CPU), so it never fuses with producers or consumers.
        # Triton: the same for the cats lowered as a ConcatKernel (rule 9).
        isolated = {n for n in self.groups.parent
                    if self.codegen == "cpp" and self.kinds[n] is K.CAT} | self.concat_cats
        # Triton: a pointwise cat inlines its unrealized inputs first (rule 10).
        for cat in self.nodes:
            for prod in self.absorbed.get(cat, ()):
                self._force_merge(prod, cat)
        # Vertical: join each fusible producer's group.
        for node in self.nodes:
            if node not in self.groups.parent or node in isolated:
                continue
            for prod in self.producers(node):
                if prod not in self.groups.parent or prod in isolated:
                    continue
                if node in self.unrolled and self.kinds[prod] in FUSIBLE_KINDS:
                    continue  # rule 8: the stats kernel sits between them
                self._try_merge(prod, node)
        # Horizontal: consumers of one buffer that share the read.
        # The read must be the same elements (Inductor's shared MemoryDep:
        # buffer and index), so two different slices of one buffer do not count.
        # A C++ cat copies the inputs it cannot realize in place; those copies
        # share reads with the inputs' other readers (and fuse with them).
        readers: dict[fx.Node, list[fx.Node]] = {}
        for node in self.nodes:
            if node not in self.groups.parent or node in self.concat_cats:
                continue
            inputs = _arg_nodes(node)
            if node in isolated:
                inputs = [i for i in inputs if not _realizes_into_cat(i, self, self.groups, self.gm)]
            for inp in dict.fromkeys(self._read_key(i) for i in inputs):
                readers.setdefault(inp, []).append(node)
        for group in readers.values():
            for other in group[1:]:
                self._try_merge(group[0], other)
        return self.groups


# --------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class PredictedKernel:
    """One predicted launch: its kind, the FX nodes in it, bytes, FLOPs, time.

    ``kind`` of a fused kernel is REDUCTION if it holds one, else POINTWISE
    (CAT / GATHER when it holds only those). ``note`` says e.g. "addmm (bias
    fused)" or which op names were fused.
    """

    kind: KernelKind
    nodes: tuple[fx.Node, ...]
    bytes_moved: int
    flops: float
    seconds: float
    note: str = ""


def _op_label(gm: fx.GraphModule, node: fx.Node) -> str:
    if node.op == "call_module":
        return type(gm.get_submodule(node.target)).__name__
    return target_name(node.target)


def _nbytes(infos: list[TensorInfo] | None) -> int:
    return sum(i.nbytes for i in infos or [])


def _numel(infos: list[TensorInfo] | None) -> int:
    return sum(i.numel or 0 for i in infos or [])


class _Costing:
    """Bytes and FLOPs of nodes and groups."""

    def __init__(self, gm: fx.GraphModule, kinds: dict[fx.Node, KernelKind],
                 infos: dict[fx.Node, list[TensorInfo] | None], fusion: _Fusion):
        self.gm, self.kinds, self.infos, self.fusion = gm, kinds, infos, fusion

    def node_flops(self, node: fx.Node) -> float:
        kind = self.kinds[node]
        label = _op_label(self.gm, node)
        if kind is K.MATMUL:
            return self._matmul_flops(node)
        if kind is K.REDUCTION:
            ins = max((_numel(self.infos.get(i)) for i in _arg_nodes(node)), default=0)
            return FLOPS_PER_ELEMENT.get(label.lower(), 1) * ins
        if kind in (K.POINTWISE, K.GATHER):
            return FLOPS_PER_ELEMENT.get(label.lower(), 1) * _numel(self.infos.get(node))
        return 0.0

    def _matmul_flops(self, node: fx.Node) -> float:
        """2 * out_numel * K; K = reduction size (conv: Cin/groups * kernel)."""
        out = _numel(self.infos.get(node)[:1] if self.infos.get(node) else None)
        weight_shape = None
        if node.op == "call_module":
            module = self.gm.get_submodule(node.target)
            weight = getattr(module, "weight", None)
            if isinstance(weight, torch.Tensor) and weight.dim() > 2:
                weight_shape = tuple(weight.shape)
        name = _op_label(self.gm, node)
        tensors = [i for i in _arg_nodes(node) if self.infos.get(i)]
        if weight_shape is None and "conv" in name and len(tensors) > 1:
            weight_shape = self.infos[tensors[1]][0].shape
        if weight_shape is not None and all(d is not None for d in weight_shape):
            k = 1
            for d in weight_shape[1:]:
                k *= d
            return 2.0 * out * k
        # addmm/baddbmm/addmv/addbmm: the first tensor is the bias.
        lhs_index = 1 if name.startswith("add") or name == "baddbmm" else 0
        if len(tensors) <= lhs_index:
            return 0.0
        shape = self.infos[tensors[lhs_index]][0].shape
        k = shape[-1] if shape and shape[-1] is not None else 0
        return 2.0 * out * k

    def extern_bytes(self, node: fx.Node) -> int:
        own = _nbytes(self.infos.get(node))
        return sum(_nbytes(self.infos.get(i)) for i in _arg_nodes(node)) + own + self.param_bytes(node)

    def param_bytes(self, node: fx.Node) -> int:
        """Bytes of a call_module node's own parameters (read by its kernel).

        A gather reads only the rows it returns, so it is capped at its output.
        """
        if node.op != "call_module":
            return 0
        module = self.gm.get_submodule(node.target)
        total = sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
        if self.kinds[node] is K.GATHER:
            total = min(total, _nbytes(self.infos.get(node)))
        return total

    def group_bytes(self, members: Sequence[fx.Node]) -> int:
        """External reads (as used, so slices count their size) + escaping writes."""
        inside = set(members)
        reads: dict[fx.Node, int] = {}
        for m in members:
            for inp in _arg_nodes(m):
                if self.fusion.base[inp] not in inside:
                    reads[inp] = _nbytes(self.infos.get(inp))
        writes = sum(self.param_bytes(m) for m in members)
        for m in members:
            if any(self._escapes(m, u, inside) for u in m.users):
                writes += _nbytes(self.infos.get(m))
        return sum(reads.values()) + writes

    def _escapes(self, node: fx.Node, user: fx.Node, inside: set[fx.Node]) -> bool:
        if user.op == "output":
            return True
        if self.kinds[user] is K.VIEW:
            return any(self._escapes(user, u, inside) for u in user.users)
        return user not in inside


def _kind_of_group(kinds: Iterable[KernelKind]) -> KernelKind:
    kinds = set(kinds) & FUSIBLE_KINDS
    for kind in (K.REDUCTION, K.POINTWISE, K.GATHER, K.CAT):
        if kind in kinds and (kind is not K.GATHER or kinds <= {K.GATHER, K.CAT}):
            return kind
    return K.POINTWISE


# Views that keep a whole buffer (no subset, same element order): a generated
# producer seen through them can still be realized straight into a cat slice.
_WHOLE_VIEW_OPS = frozenset({
    "view", "reshape", "_unsafe_view", "_reshape_alias", "view_as", "reshape_as",
    "unsqueeze", "squeeze", "flatten", "unflatten", "contiguous", "alias",
    "detach", "identity", "lift_fresh", "Flatten", "Unflatten", "Identity",
})


def _realizes_into_cat(inp: fx.Node, fusion: _Fusion, groups: _Groups, gm: fx.GraphModule) -> bool:
    """True when cat input ``inp`` needs no copy: it is (a whole view of) a
    buffer computed by generated code, not itself a cat (ConcatKernel
    ``can_realize_into_without_copy``: FlexibleLayout, not extern output)."""
    base = fusion.base[inp]
    if base not in groups.parent or fusion.kinds[base] is K.CAT:
        return False
    node = inp
    while node is not base:
        if _op_label(gm, node) not in _WHOLE_VIEW_OPS:
            return False  # slice / select / permute ...: a strided subset, copied
        node = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else node.all_input_nodes[0]
    return True


def _is_free_cat(members: Sequence[fx.Node], kinds, fusion: _Fusion, groups: _Groups,
                 gm: fx.GraphModule, claimed: set[fx.Node] | None = None) -> bool:
    """A CAT-only group whose inputs all come from generated kernels is free:
    the producers write straight into the output slices (ConcatKernel).

    C++ flavour (``claimed`` given, cats are singleton groups): each input
    must be a whole view of a generated, non-cat buffer not already realized
    into an earlier cat (``claimed``); otherwise the cat is one copy kernel.
    """
    if any(kinds[m] is not K.CAT for m in members):
        return False
    inputs = [i for m in members for i in _arg_nodes(m)]
    if claimed is None:
        return bool(inputs) and all(fusion.base[i] in groups.parent for i in inputs)
    bases = [fusion.base[i] for i in inputs]
    free = (bool(inputs) and len(set(bases)) == len(bases)
            and all(_realizes_into_cat(i, fusion, groups, gm) and fusion.base[i] not in claimed
                    for i in inputs))
    claimed.update(bases)
    return free


def _whole_view(inp: fx.Node, base: fx.Node, gm: fx.GraphModule) -> bool:
    """True when ``inp`` is ``base`` or a chain of whole views of it."""
    node = inp
    while node is not base:
        if _op_label(gm, node) not in _WHOLE_VIEW_OPS:
            return False
        node = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else node.all_input_nodes[0]
    return True


def _concat_copies(cat: fx.Node, fusion: _Fusion, groups: _Groups, gm: fx.GraphModule) -> int:
    """Copy kernels of a cat Inductor lowers as a ConcatKernel on GPU (rule 9).

    A whole view of a generated buffer is realized into its slice (free).
    Copies of graph inputs (placeholders, parameters) are registered as one
    operation list and run as one foreach kernel (``triton_for_fused``).
    Every other input (a slice of a generated buffer, an extern call's
    output) is one copy kernel of its own.
    """
    inputs = [i for i in _arg_nodes(cat) if fusion.infos.get(i) != []]
    graph_inputs, others = 0, 0
    for inp in inputs:
        base = fusion.base[inp]
        if base.op in ("placeholder", "get_attr"):
            graph_inputs += 1
        elif base in groups.parent and base not in fusion.concat_cats and _whole_view(inp, base, gm):
            continue
        else:
            others += 1
    return (1 if graph_inputs else 0) + others


def _is_inlined(members: Sequence[fx.Node], fusion: _Fusion, groups: _Groups, gm: fx.GraphModule) -> bool:
    """Rule 11: a group of unrealized pointwise nodes whose every reader
    outside it is generated code that inlines it (not an extern call, not the
    graph output, not a ConcatKernel realizing it into a slice) launches nothing."""
    inside = set(members)
    escaped = False
    for m in members:
        if fusion.kinds[m] is not K.POINTWISE or m in fusion.pw_cats:
            return False
        outside = [u for u in fusion.consumers(m) if u not in inside]
        if not outside:
            continue
        if not fusion.unrealized.get(m):
            return False
        for user in outside:
            if user.op == "output" or user not in groups.parent:
                return False
            if user in fusion.concat_cats and any(
                    fusion.base[i] is m and _whole_view(i, m, gm) for i in _arg_nodes(user)):
                return False
        escaped = True
    return escaped


def _units_behind(buf: fx.Node, unit_of: dict[fx.Node, int], fusion: _Fusion) -> set[int]:
    """Units producing ``buf``: its own, or for a free cat (an inlined
    pointwise group) those of its inputs."""
    if buf in unit_of:
        return {unit_of[buf]}
    if fusion.kinds[buf] is not K.CAT and buf not in fusion.inlined:
        return set()
    return {u for p in fusion.producers(buf) for u in _units_behind(p, unit_of, fusion)}


def _realized_at(members: Sequence[fx.Node], fusion: _Fusion) -> int:
    """Position where Inductor materializes a generated group: lowering keeps
    a pointwise result unrealized (inlined into its readers) until a reader
    needs a buffer, so the group's code lands at its first reader outside
    the group (views and cats looked through; the graph output is the end)."""
    inside = set(members)
    best = None
    stack = [u for m in members for u in m.users]
    seen: set[fx.Node] = set()
    while stack:
        user = stack.pop()
        if user in seen or user in inside:
            continue
        seen.add(user)
        if fusion.kinds.get(user) is K.VIEW:
            stack.extend(user.users)
            continue
        pos = fusion.pos[user]
        best = pos if best is None else min(best, pos)
    return best if best is not None else max(fusion.pos[m] for m in members)


def _schedule(units: list[list[fx.Node]], unit_of: dict[fx.Node, int], fusion: _Fusion,
              lazy: bool = False) -> list[int]:
    """Inductor-like order: units by first node (``lazy``: generated units at
    the reader that realizes them, see :func:`_realized_at`), then a
    depth-first topological sort visiting dependencies in that order
    (iterative: graphs are deep)."""
    def key(members: list[fx.Node]) -> int:
        if lazy and not (len(members) == 1 and fusion.kinds[members[0]] in (K.MATMUL, K.OPAQUE)):
            return _realized_at(members, fusion)
        return min(fusion.pos[m] for m in members)
    first = [key(members) for members in units]
    deps: list[list[int]] = []
    for idx, members in enumerate(units):
        found = {u for m in members for b in fusion.producers(m) for u in _units_behind(b, unit_of, fusion)}
        found.discard(idx)
        deps.append(sorted(found, key=lambda u: first[u]))
    order: list[int] = []
    state = [0] * len(units)  # 0 new, 1 open, 2 done
    for start in sorted(range(len(units)), key=lambda u: first[u]):
        stack = [(start, 0)]
        while stack:
            unit, i = stack.pop()
            if state[unit] == 2:
                continue
            state[unit] = 1
            while i < len(deps[unit]) and state[deps[unit][i]] != 0:
                i += 1
            if i < len(deps[unit]):
                stack.append((unit, i + 1))
                stack.append((deps[unit][i], 0))
            else:
                state[unit] = 2
                order.append(unit)
    return order


def predict_kernels(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any] | None = None,
    profile: str | DeviceProfile = "h100",
) -> list[PredictedKernel]:
    """The kernels Inductor is predicted to launch for ``gm``, in schedule order.

    ``profile`` sets the device numbers and the fusion flavour
    (``profile.codegen``: "triton" or "cpp"); see the module docstring.
    """
    prof = get_profile(profile)
    infos = _all_infos(gm, example_inputs)
    kinds = {n: _classify(gm, n, infos.get(n)) for n in gm.graph.nodes}
    for node, kind in kinds.items():
        if kind is K.MATMUL:
            kinds[node] = _decomposed_kind(gm, node, infos, prof.codegen) or kind
    fusion = _Fusion(gm, kinds, infos, prof.codegen)
    groups = fusion.run()
    cost = _Costing(gm, kinds, infos, fusion)

    # Launching units: fused groups (minus free cats) and extern/opaque nodes.
    units: list[list[fx.Node]] = []
    claimed: set[fx.Node] | None = set() if prof.codegen == "cpp" else None
    copies: dict[fx.Node, int] = {}  # triton ConcatKernel -> its copy kernels (rule 9)
    triton = prof.codegen == "triton"
    for node in gm.graph.nodes:
        if node in groups.parent and groups.find(node) is node:
            members = sorted(groups.members[node], key=fusion.pos.__getitem__)
            if triton and node in fusion.concat_cats:
                copies[node] = _concat_copies(node, fusion, groups, gm)
                if copies[node]:
                    units.append(members)
            elif triton and _is_inlined(members, fusion, groups, gm):
                fusion.inlined.update(members)
            elif triton or not _is_free_cat(members, kinds, fusion, groups, gm, claimed):
                units.append(members)
        elif kinds[node] in (K.MATMUL, K.OPAQUE):
            units.append([node])
    unit_of = {m: i for i, members in enumerate(units) for m in members}
    order = _schedule(units, unit_of, fusion, lazy=prof.codegen == "cpp")

    kernels: list[PredictedKernel] = []
    pending: list[fx.Node] = []  # cpp: generated code waiting for a flush

    def flush() -> None:
        if pending:
            kernels.append(_generated_kernel(pending, kinds, cost, prof, gm))
            pending.clear()

    for idx in order:
        members = units[idx]
        if kinds[members[0]] in (K.MATMUL, K.OPAQUE) and len(members) == 1:
            flush()
            kernels.extend(_grouped_linear_kernels(members[0], cost, prof, gm)
                           or [_extern_kernel(members[0], kinds, cost, prof, gm)])
        elif prof.codegen == "cpp":
            pending.extend(members)
        elif members[0] in copies:
            one = _generated_kernel(members, kinds, cost, prof, gm)
            n = copies[members[0]]
            kernels.extend(PredictedKernel(K.CAT, one.nodes, one.bytes_moved // n, 0.0,
                                           kernel_time(prof, K.CAT, one.bytes_moved // n, 0.0),
                                           f"cat copy {i + 1}/{n} (ConcatKernel)") for i in range(n))
        else:
            for m in members:
                if m in fusion.unrolled:  # rule 8: the statistics kernel first
                    nbytes = _nbytes(infos.get(_arg_nodes(m)[0])) if _arg_nodes(m) else 0
                    kernels.append(PredictedKernel(K.REDUCTION, (m,), nbytes, 0.0,
                                                   kernel_time(prof, K.REDUCTION, nbytes, 0.0),
                                                   "layer_norm statistics (unrolled, r < 8)"))
            kernels.append(_generated_kernel(members, kinds, cost, prof, gm))
    flush()
    return kernels


def _generated_kernel(members: Sequence[fx.Node], kinds, cost: _Costing,
                      prof: DeviceProfile, gm: fx.GraphModule) -> PredictedKernel:
    kind = _kind_of_group(kinds[m] for m in members)
    nbytes = cost.group_bytes(members)
    flops = sum(cost.node_flops(m) for m in members)
    labels = dict.fromkeys(_op_label(gm, m) for m in members)
    return PredictedKernel(kind, tuple(members), nbytes, flops,
                           kernel_time(prof, kind, nbytes, flops), "fused: " + "+".join(labels))


def _extern_kernel(node: fx.Node, kinds, cost: _Costing, prof: DeviceProfile,
                   gm: fx.GraphModule) -> PredictedKernel:
    kind = kinds[node]
    nbytes = cost.extern_bytes(node)
    flops = cost.node_flops(node)
    label = _op_label(gm, node)
    note = label
    if kind is K.MATMUL and _has_bias(gm, node, label):
        note = f"{label} -> addmm (bias fused)"
    return PredictedKernel(kind, (node,), nbytes, flops, kernel_time(prof, kind, nbytes, flops), note)


def _grouped_linear_kernels(node: fx.Node, cost: _Costing, prof: DeviceProfile,
                            gm: fx.GraphModule) -> list[PredictedKernel]:
    """Kernels of a grouped linear call ``(xs, ws, bs)``; [] for any other node."""
    if node.op != "call_function" or target_name(node.target) not in GROUPED_OPS or len(node.args) < 2:
        return []
    xs, ws = node.args[0], node.args[1]
    bs = node.args[2] if len(node.args) > 2 and node.args[2] is not None else [None] * len(xs)
    members = []
    for x, w, b in zip(xs, ws, bs):
        xi = (cost.infos.get(x) or [None])[0] if isinstance(x, fx.Node) else None
        wi = (cost.infos.get(w) or [None])[0] if isinstance(w, fx.Node) else None
        if xi is None or wi is None or xi.numel is None or len(wi.shape) != 2 or None in wi.shape:
            return []  # shapes unknown: priced as one plain extern call
        n_out, k = wi.shape
        out = (xi.numel // k if k else 0) * n_out
        bias = _nbytes(cost.infos.get(b)) if isinstance(b, fx.Node) else 0
        members.append((xi.nbytes + wi.nbytes + bias + out * xi.itemsize, 2.0 * out * k))
    if prof.codegen == "cpp":
        # The fallback runs one F.linear per member, inside one more op dispatch.
        return [PredictedKernel(K.MATMUL, (node,), int(nbytes), flops,
                                kernel_time(prof, K.MATMUL, nbytes, flops) + (prof.launch_s(K.MATMUL) if i == 0 else 0),
                                f"grouped_linear member {i} (F.linear fallback)")
                for i, (nbytes, flops) in enumerate(members)]
    nbytes = sum(m[0] for m in members)
    flops = sum(m[1] for m in members)
    seconds = prof.launch_s(K.MATMUL) + prof.grouped_host_s + prof.grouped_host_s_per_member * len(members) + sum(
        kernel_time(prof, K.MATMUL, m[0], m[1]) - prof.launch_s(K.MATMUL) for m in members)
    return [PredictedKernel(K.MATMUL, (node,), int(nbytes), flops, seconds,
                            f"grouped_linear ({len(members)} linears, one launch)")]


def _has_bias(gm: fx.GraphModule, node: fx.Node, label: str) -> bool:
    if node.op == "call_module":
        return getattr(gm.get_submodule(node.target), "bias", None) is not None
    if label == "linear":
        bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        return bias is not None
    return label in ("addmm", "baddbmm", "addbmm", "addmv")


def predicted_launches(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any] | None = None,
    profile: str | DeviceProfile = "h100",
) -> int:
    """Number of kernels Inductor is predicted to launch for ``gm``."""
    return len(predict_kernels(gm, example_inputs, profile))


def predicted_time(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any] | None = None,
    profile: str | DeviceProfile = "h100",
) -> float:
    """Predicted seconds for one run of ``gm`` (sum over predicted kernels)."""
    return sum(k.seconds for k in predict_kernels(gm, example_inputs, profile))
