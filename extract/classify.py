"""What the fusion model starts from: each node's tensors and its kernel kind.

Shapes come from node meta (``meta["val"]``, ``["example_value"]``,
``["tensor_meta"]``, or the rebuild's e-graph shape); where meta is missing
and example inputs are given, from one run of them
(:func:`optimus_eqsat.fxvocab.node_values`). Kinds come from the vocabulary's
op tables (:mod:`optimus_eqsat.fxvocab.ops`), refined per node by a few named
side conditions, and small matmuls that Inductor decomposes into generated
code become POINTWISE / REDUCTION (rule 6; the size rules are each code
generator's ``decomposed_mm`` table, see fusion_triton.py and fusion_cpp.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch.fx as fx

from optimus_eqsat.extract.cost_model import KernelKind
from optimus_eqsat.fxvocab import (
    ExampleInputError,
    TensorInfo,
    module_kind,
    node_tensor_infos,
    node_values,
    op_kind,
    op_label,
    target_name,
    tensor_infos,
)

__all__ = ["Infos", "classify_node", "graph_infos", "has_bias", "node_kinds"]

log = logging.getLogger(__name__)
K = KernelKind

Infos = dict[fx.Node, list[TensorInfo] | None]
# (form, M, K, N) -> whether Inductor decomposes the matmul (rule 6), per code generator
DecomposedMM = Mapping[str, Callable[[int, int, int], bool]]


def graph_infos(gm: fx.GraphModule, example_inputs: Sequence[Any] | None) -> Infos:
    """Tensors each node produces: node meta (the rebuild's e-graph shapes included),
    and where it is missing one run of ``example_inputs``.

    Shapes are a refinement: inputs that do not run through the graph give a
    warning and a prediction without them. A node whose run value holds no
    tensor (a size, scalar arithmetic) stays None (unknown), as ShapeProp left it
    when the cost model ran that; meta that says "no tensor" gives [].
    """
    try:
        values = node_values(gm, example_inputs, shape_meta=True)
    except ExampleInputError as exc:
        # Fake inputs cannot give a value the graph reads (a .item() under dynamic shapes):
        # expected, and the meta is there; any other failure is the caller's to hear about.
        level = logging.INFO if _data_dependent(exc.__cause__) else logging.WARNING
        log.log(level, "the example inputs did not run (%s); predicting without their shapes", exc)
        values = node_values(gm, None, shape_meta=True)
    return {node: tensor_infos(value) for node, value in values.items()}


def _data_dependent(exc: BaseException | None) -> bool:
    """Whether ``exc`` is fake tensors' refusal to produce a value that depends on data."""
    from torch._subclasses.fake_tensor import DataDependentOutputException
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    return isinstance(exc, (DataDependentOutputException, GuardOnDataDependentSymNode))


def arg_nodes(node: fx.Node) -> list[fx.Node]:
    """The FX nodes ``node`` reads."""
    return list(node.all_input_nodes)


def _is_tensor_node(node: Any) -> bool:
    """True when ``node`` is an FX node whose meta says it holds a tensor."""
    return isinstance(node, fx.Node) and bool(node_tensor_infos(node))


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
            return module_kind(gm.get_submodule(cast(str, node.target)))
        except AttributeError:
            return K.OPAQUE
    name = target_name(node.target)
    kind = _refine(name, node, op_kind(name) or K.OPAQUE)
    # Scalar arithmetic (SymInt math in Dynamo graphs) launches nothing.
    if kind not in (K.VIEW, K.NONE) and infos is not None and not infos:
        return K.NONE
    return kind


def classify_node(gm: fx.GraphModule, node: fx.Node) -> KernelKind:
    """The :class:`KernelKind` ``node`` becomes under Inductor (before fusion)."""
    return _classify(gm, node, node_tensor_infos(node))


def node_kinds(gm: fx.GraphModule, infos: Infos, decomposed_mm: DecomposedMM) -> dict[fx.Node, KernelKind]:
    """Every node's kind; matmuls that ``decomposed_mm`` says Inductor turns into
    generated code become POINTWISE (K == 1) or REDUCTION."""
    kinds = {n: _classify(gm, n, infos.get(n)) for n in gm.graph.nodes}
    for node, kind in kinds.items():
        if kind is K.MATMUL:
            kinds[node] = _decomposed_kind(gm, node, infos, decomposed_mm) or kind
    return kinds


# --------------------------------------------------------------------------
# Rule 6: small matmuls Inductor decomposes into generated code
# (torch/_inductor/decomposition.py: mm, addmm; kernel/bmm.py: bmm)
# --------------------------------------------------------------------------


def has_bias(gm: fx.GraphModule, node: fx.Node, label: str) -> bool:
    """Whether a matmul node adds a bias (a linear with bias is one addmm)."""
    if node.op == "call_module":
        return getattr(gm.get_submodule(cast(str, node.target)), "bias", None) is not None
    if label == "linear":
        bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        return bias is not None
    return label in ("addmm", "baddbmm", "addbmm", "addmv")


def mm_form(gm: fx.GraphModule, node: fx.Node, infos: Infos) -> tuple[str, int, int, int] | None:
    """("mm" | "addmm" | "bmm", M, K, N) of a matmul node; None if unknown."""
    name = op_label(gm, node).lower()
    out = infos.get(node)
    tensors = [i for i in arg_nodes(node) if infos.get(i)]
    if not out or not tensors or out[0].numel is None:
        return None
    if name in ("addmm", "baddbmm"):
        tensors = tensors[1:]
    if not tensors:
        return None
    lhs = cast(list[TensorInfo], infos[tensors[0]])[0].shape  # tensors have infos (filtered above)
    rhs = cast(list[TensorInfo], infos[tensors[1]])[0].shape if len(tensors) > 1 else None
    if not lhs or any(d is None for d in lhs) or not out[0].shape:
        return None
    # no dim of lhs is None, nor of out (its numel is known)
    k, n = cast(int, lhs[-1]), cast(int, out[0].shape[-1])
    if name in ("bmm", "baddbmm") or (name in ("matmul", "__matmul__") and rhs and len(rhs) > 2):
        return "bmm", cast(int, lhs[-2]) if len(lhs) > 1 else 1, k, n
    if name not in ("linear", "mm", "addmm", "matmul", "__matmul__"):
        return None
    m = (out[0].numel // n) if n else 0
    biased = has_bias(gm, node, name) and name != "matmul"
    return ("addmm" if biased else "mm"), m, k, n


def _decomposed_kind(gm: fx.GraphModule, node: fx.Node, infos: Infos, decomposed_mm: DecomposedMM) -> KernelKind | None:
    """POINTWISE / REDUCTION when Inductor turns this small matmul into generated code."""
    form = mm_form(gm, node, infos)
    if form is None:
        return None
    name, m, k, n = form
    rule = decomposed_mm.get(name)
    if rule is None or not rule(m, k, n):
        return None
    return K.POINTWISE if k == 1 else K.REDUCTION
