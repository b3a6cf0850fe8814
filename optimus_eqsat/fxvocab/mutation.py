"""Which nodes of an FX graph write to memory they read, and which memory.

In-place ops (``add_``, ``inplace=True``, ``out=``, mutable aten schemas), norms that
update their running statistics in training, and embeddings with ``max_norm``, which
renormalize the rows they look up in their table. The translator orders and keeps
such nodes opaque; the measured choice copies what they write before timing; the run
for shapes puts it back.
"""

from __future__ import annotations

import inspect
import operator
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

__all__ = [
    "inplace_position",
    "is_mutating",
    "renormed_table",
    "running_stats_written",
    "written_attributes",
    "written_inputs",
]


def inplace_position(target: Any) -> int | None:
    try:
        params = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return None
    return params.index("inplace") if "inplace" in params else None


# Functional norms that update their running statistics in place (in training mode, or
# with input statistics): parameter names in call order, the flag, and its default.
_RUNNING_STATS_OPS: dict[Any, tuple[tuple[str, ...], str, bool]] = {
    F.batch_norm: (("input", "running_mean", "running_var", "weight", "bias", "training"), "training", False),
    F.instance_norm: (
        ("input", "running_mean", "running_var", "weight", "bias", "use_input_stats"),
        "use_input_stats",
        True,
    ),
    torch.batch_norm: (("input", "weight", "bias", "running_mean", "running_var", "training"), "training", False),
    torch.instance_norm: (
        ("input", "weight", "bias", "running_mean", "running_var", "use_input_stats"),
        "use_input_stats",
        True,
    ),
}


def running_stats_written(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The running statistics a batch or instance norm updates (none in eval mode)."""
    spec = _RUNNING_STATS_OPS.get(node.target) if node.op == "call_function" else None
    if spec is None:
        return []
    names, flag, default = spec
    args = {**dict(zip(names, node.args)), **node.kwargs}
    if not args.get(flag, default):
        return []
    return [v for k in ("running_mean", "running_var") if isinstance(v := args.get(k), torch.fx.Node)]


def written_inputs(gm: torch.fx.GraphModule, node: torch.fx.Node) -> list[torch.fx.Node]:
    """The inputs this node writes to: a norm's running statistics, the table of an embedding
    with ``max_norm``, the mutable arguments of an op whose schema says so, else the first
    argument of any other mutating node."""
    stats = running_stats_written(node)
    table = renormed_table(gm, node)
    if isinstance(table, torch.fx.Node):
        return [table]
    if stats or not is_mutating(gm, node):
        return stats
    if isinstance(node.target, torch._ops.OpOverload):
        written = [
            node.args[k] if k < len(node.args) else node.kwargs.get(a.name)
            for k, a in enumerate(node.target._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        ]
        nodes = [w for w in written if isinstance(w, torch.fx.Node)]
        if nodes:
            return nodes
    first = node.args[0] if node.args else None
    if foreach_inplace(node) and isinstance(first, (list, tuple)):
        return [t for t in first if isinstance(t, torch.fx.Node)]  # every tensor of its first list
    return [first] if isinstance(first, torch.fx.Node) else []


def foreach_inplace(node: torch.fx.Node) -> bool:
    """An in-place foreach op (``torch._foreach_add_(tensors, 1)``): it writes its first list."""
    name = getattr(node.target, "__name__", "") if node.op == "call_function" else ""
    return name.startswith("_foreach_") and name.endswith("_")


def is_mutating(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Does this node write to one of its inputs?"""
    if node.kwargs.get("inplace") is True or node.kwargs.get("out") is not None:
        return True
    if running_stats_written(node) or renormed_table(gm, node) is not None:
        return True
    target = node.target
    if node.op == "call_method":
        return str(target).endswith("_") and not str(target).startswith("_")
    if node.op == "call_module":
        return getattr(gm.get_submodule(str(target)), "inplace", False) is True
    if node.op != "call_function":
        return False
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable
    if target is operator.setitem or getattr(target, "__name__", "").startswith("__i"):
        return True
    name = getattr(target, "__name__", "")
    if (name.endswith("_") and not name.startswith("_")) or foreach_inplace(node):
        return True
    if target in (operator.iadd, operator.isub, operator.imul, operator.itruediv):
        return True
    position = inplace_position(target) if getattr(target, "__module__", "") == F.__name__ else None
    return position is not None and len(node.args) > position and node.args[position] is True


def renormed_table(gm: torch.fx.GraphModule, node: torch.fx.Node) -> torch.fx.Node | str | None:
    """The table an embedding lookup with ``max_norm`` renormalizes in place: the weight
    node of ``F.embedding``, the parameter name (``"emb.weight"``) of an ``nn.Embedding``
    module; None for any other node."""
    if node.op == "call_function" and node.target is F.embedding:
        args = {**dict(zip(("input", "weight", "padding_idx", "max_norm"), node.args)), **node.kwargs}
        weight = args.get("weight")
        return weight if args.get("max_norm") is not None and isinstance(weight, torch.fx.Node) else None
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        if isinstance(module, torch.nn.Embedding) and module.max_norm is not None:
            return f"{node.target}.weight"
    return None


def written_attributes(gm: torch.fx.GraphModule) -> set[str]:
    """Names of ``gm``'s parameters and buffers its graph may write: the attributes
    (``get_attr``) a write reaches, through the ops between (conservatively: any op's
    first argument), and the tables of embedding modules with ``max_norm``. A module's
    own writes to its buffers (a batch norm's statistics) are not followed."""
    written: set[str] = set()
    for node in gm.graph.nodes:
        table = renormed_table(gm, node)
        if isinstance(table, str):
            written.add(table)
        for target in written_inputs(gm, node):
            while (
                target.op in ("call_function", "call_method")
                and target.args
                and isinstance(target.args[0], torch.fx.Node)
            ):
                target = target.args[0]
            if target.op == "get_attr":
                written.add(str(target.target))
    return written
