"""Op names of FX targets.

Two namings, for two jobs:

- :func:`target_name` (and :func:`op_label`, :func:`call_name`): the short name
  the op tables of :mod:`.ops` are keyed by; every target has one.
- :func:`canonical_name`: the one name the translator gives every spelling of
  an op it knows (``x.split`` / ``torch.split`` / ``aten.split``, ``concat`` ->
  ``cat``); None for targets it does not know.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

# ---------------------------------------------------------------- short names


def target_name(target: Any, *, qualified: bool = False) -> str:
    """The op name of a call_function / call_method target.

    By default (op tables, labels) aten overloads lose namespace and overload
    (``aten::relu.default`` -> ``"relu"``), and a target without ``__name__``
    is named by its type. ``qualified=True`` (op keys and signatures, which
    must tell overloads apart) keeps torch ops whole (``"aten.add.Tensor"``)
    and names a target without ``__name__`` by its repr.
    """
    if isinstance(target, str):
        return target
    if qualified:
        name = getattr(target, "__name__", None) or repr(target)
        module = getattr(target, "__module__", "") or ""
        return str(target) if module.startswith("torch._ops") else name
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1]
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name.split("::")[-1]
    return getattr(target, "__name__", type(target).__name__)


def op_label(gm: torch.fx.GraphModule, node: torch.fx.Node) -> str:
    """What a call node does: its module's class name (call_module), else :func:`target_name`."""
    if node.op == "call_module":
        return type(gm.get_submodule(str(node.target))).__name__
    return target_name(node.target)


def call_name(node: torch.fx.Node) -> str:
    """:func:`target_name` of a call_function / call_method node; "" for any other node."""
    return target_name(node.target) if node.op in ("call_function", "call_method") else ""


# ---------------------------------------------------------------- canonical names

_FUNCTION_MODULES = (torch, F, torch.special, torch.Tensor)

_OPERATOR_NAMES = {
    operator.add: "add",
    operator.sub: "sub",
    operator.mul: "mul",
    operator.truediv: "div",
    operator.pow: "pow",
    operator.neg: "neg",
    operator.getitem: "getitem",
    operator.matmul: "matmul",
}

_ALIASES = {
    "concat": "cat",
    "concatenate": "cat",
    "true_divide": "div",
    "divide": "div",
    "multiply": "mul",
    "subtract": "sub",
    "clip": "clamp",
    "absolute": "abs",
    "negative": "neg",
    "_unsafe_view": "view",
    "swapaxes": "transpose",
    "swapdims": "transpose",
    "moveaxis": "movedim",
    "__getitem__": "getitem",
    "split_with_sizes": "split",
    "__add__": "add",
    "__radd__": "radd",
    "__mul__": "mul",
    "__rmul__": "rmul",
    "__sub__": "sub",
    "__rsub__": "rsub",
    "__truediv__": "div",
    "__rtruediv__": "rdiv",
    "__neg__": "neg",
    "__matmul__": "matmul",
    "__pow__": "pow",
    "__rpow__": "rpow",
    "rsub": "rsub",
}


# prims ops of post-grad graphs that are plain aten-like math (prims.fma: a * b + c). Other
# prims stay unknown: some are random (prims.inductor_random) and must keep their order.
_PRIMS = frozenset({"fma"})


def canonical_name(node: torch.fx.Node) -> str | None:
    """The canonical op name of a call node, or None when the target is unknown.

    Methods are known by name; functions when they are the function of that
    name in torch, torch.nn.functional, torch.special or torch.Tensor, an
    operator of ``_OPERATOR_NAMES``, or an aten overload.
    """
    target = node.target
    name: str | None
    if node.op == "call_method":
        name = str(target)
    elif node.op == "call_function":
        if target in _OPERATOR_NAMES:
            return _OPERATOR_NAMES[target]
        if isinstance(target, torch._ops.OpOverload):
            if target.namespace != "aten" and not (target.namespace == "prims" and target._opname in _PRIMS):
                return None
            name = target._opname
        else:
            name = getattr(target, "__name__", None)
            if name is None or not any(getattr(m, name, None) is target for m in _FUNCTION_MODULES):
                return None
    else:
        return None
    return _ALIASES.get(name, name)
