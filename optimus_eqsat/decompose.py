"""FX rewrites run before translation, for what the term language would keep opaque.

:func:`before_translation` applies both below to one copy of the graph.

**Private in-place ops.** ``nn.ReLU(inplace=True)`` and friends (``F.relu(x,
inplace=True)``, ``x.relu_()``, ``torch.relu_(x)``) write into their input. The
translator keeps every node that reads or writes mutated memory opaque, in
order, so one in-place activation after each layer of an MLP stops everything
downstream from being optimized. When the written tensor is fresh memory (made by
a non-view op) that nothing else reads (the in-place op is its only user), no one
can observe the write: the out-of-place op is the same program.

**Eval-mode batch norms.** An eval-mode batch norm (running statistics, no update: ``F.batch_norm(...,
training=False)``, what ``nn.BatchNorm1d`` calls under ``model.eval()``) is a
per-channel affine map. Recommendation models put one after every layer of their
MLP experts and towers, so as one opaque op it stops the experts' linears and
activations from batching. Written as the elementwise ops it is::

    scale = rsqrt(running_var + eps) * weight      # parameters only
    y = (x - running_mean) * scale + bias

each op is a node the translator reads and batching groups like any other; in
inference the scale is parameter-only work (built once by the parameter cache,
folded under freezing), and Inductor fuses the rest into one pointwise kernel,
as its own batch-norm decomposition does. Only inputs of rank 2 (batch, channels)
are decomposed: there every statistic broadcasts over the last dim as it is, and
the new nodes' meta is their input's (same shape and dtype). Training-mode batch
norms (batch statistics, running statistics written in place) stay as they are.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from .fx_graphs import copy_module
from .fxvocab import ALIASING_OPS, canonical_name
from .fxvocab.meta import _META_KEYS, meta_value
from .normalize import HANDLERS, MODULE_OPS
from .fxvocab.mutation import inplace_position, is_mutating

_SIGNATURE = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
_DEFAULTS = {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5}


def _bound(node: torch.fx.Node) -> dict[str, Any] | None:
    """``F.batch_norm``'s arguments by name, or None for any other node."""
    if node.op != "call_function" or node.target is not F.batch_norm or len(node.args) > len(_SIGNATURE):
        return None
    args = {**_DEFAULTS, **dict(zip(_SIGNATURE, node.args)), **node.kwargs}
    return args if set(args) <= set(_SIGNATURE) else None


def _decomposable(node: torch.fx.Node) -> dict[str, Any] | None:
    """The arguments of an eval-mode batch norm of a rank-2 tensor whose statistics and
    affine parameters are tensors of its dtype, or None."""
    args = _bound(node)
    if args is None or args["training"] is not False or not isinstance(args["eps"], (int, float)):
        return None
    out = _shape_dtype(node)
    if out is None or len(out[0]) != 2:
        return None
    for name in ("running_mean", "running_var", "weight", "bias"):
        value = args[name]
        if value is None and name in ("weight", "bias"):
            continue
        stat = _shape_dtype(value) if isinstance(value, torch.fx.Node) else None
        if stat != (out[0][1:], out[1]):
            return None
    return args


def _shape_dtype(node: torch.fx.Node) -> tuple[tuple, torch.dtype] | None:
    """(shape, dtype) of the tensor node meta says ``node`` holds, or None."""
    value = meta_value(node)
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    return (tuple(shape), dtype) if shape is not None and isinstance(dtype, torch.dtype) else None


def _like(new: torch.fx.Node, source: torch.fx.Node) -> torch.fx.Node:
    """``new`` with ``source``'s tensor meta (same shape and dtype)."""
    for key in _META_KEYS:
        if key in source.meta:
            new.meta[key] = source.meta[key]
    return new


def before_translation(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` itself when neither rewrite applies, else a new GraphModule (sharing ``gm``'s
    parameters and submodules) with private in-place ops made out-of-place and eval-mode
    batch norms decomposed (see the module docstring). ``gm`` is never changed."""
    nodes = list(gm.graph.nodes)
    if not any(_private_inplace(gm, n) is not None or _decomposable(n) for n in nodes):
        return gm
    out = copy_module(gm)
    for node in list(out.graph.nodes):
        rewrite = _private_inplace(out, node)
        if rewrite is not None:
            rewrite()
    for node in list(out.graph.nodes):
        args = _decomposable(node)
        if args is not None:
            _decompose_batch_norm(out.graph, node, args)
    out.graph.lint()
    out.recompile()
    return out


def _private_inplace(gm: torch.fx.GraphModule, node: torch.fx.Node):
    """A function making ``node`` out-of-place, when it writes into a fresh tensor that only it
    reads and its out-of-place form is known; else None."""
    if node.op not in ("call_function", "call_method", "call_module") or not node.args \
            or node.kwargs.get("out") is not None:
        return None
    x = node.args[0]
    if not isinstance(x, torch.fx.Node) or len(x.users) != 1 or x.op in ("placeholder", "get_attr", "output"):
        return None
    if not _fresh(gm, x) or not is_mutating(gm, node):
        return None
    target = node.target
    if node.op == "call_module":  # symbolic_trace keeps nn.ReLU(inplace=True) a module call
        if type(gm.get_submodule(str(target))) is not torch.nn.ReLU or len(node.args) != 1 or node.kwargs:
            return None
        return lambda: (setattr(node, "op", "call_function"), setattr(node, "target", torch.relu))
    # A trailing underscore's twin is the out-of-place op only where the translator knows that
    # op (not requires_grad_ -> the requires_grad attribute, resize_ -> a deprecated alias).
    if node.op == "call_method":
        plain = str(target)[:-1]
        if not str(target).endswith("_") or plain not in HANDLERS or not hasattr(torch.Tensor, plain):
            return None
        return lambda: setattr(node, "target", plain)
    position = inplace_position(target) if getattr(target, "__module__", "") == F.__name__ else None
    if node.kwargs.get("inplace") is True:
        return lambda: node.update_kwarg("inplace", False)
    if position is not None and len(node.args) > position and node.args[position] is True:
        return lambda: node.update_arg(position, False)
    name = getattr(target, "__name__", "")
    for namespace in (torch, F):
        if name.endswith("_") and name[:-1] in HANDLERS and getattr(namespace, name, None) is target \
                and callable(getattr(namespace, name[:-1], None)):
            plain_fn = getattr(namespace, name[:-1])
            return lambda: setattr(node, "target", plain_fn)
    return None


# Conversions return their input itself when there is nothing to convert.
_MAY_RETURN_INPUT = frozenset({"to", "type", "type_as", "float", "half", "bfloat16", "double", "int", "long", "bool"})


def _fresh(gm: torch.fx.GraphModule, x: torch.fx.Node) -> bool:
    """Whether ``x`` is a tensor of its own memory: made by a known op that is no view, no
    conversion that may return its input, and no in-place write."""
    if x.op == "call_module":
        name = MODULE_OPS.get(type(gm.get_submodule(str(x.target))), (None,))[0]
    else:
        name = canonical_name(x)
    return name is not None and name not in ALIASING_OPS | _MAY_RETURN_INPUT and not is_mutating(gm, x)


def _decompose_batch_norm(graph: torch.fx.Graph, node: torch.fx.Node, args: dict[str, Any]) -> None:
    x, mean, var = args["input"], args["running_mean"], args["running_var"]
    with graph.inserting_before(node):
        scale = _like(graph.call_function(torch.rsqrt, (_like(graph.call_function(
            torch.add, (var, float(args["eps"]))), var),)), var)
        if args["weight"] is not None:
            scale = _like(graph.call_function(torch.mul, (scale, args["weight"])), var)
        centered = _like(graph.call_function(torch.sub, (x, mean)), node)
        y = _like(graph.call_function(torch.mul, (centered, scale)), node)
        if args["bias"] is not None:
            y = _like(graph.call_function(torch.add, (y, args["bias"])), node)
    node.replace_all_uses_with(y)
    graph.erase_node(node)
