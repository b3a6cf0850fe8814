"""What an FX call node computes, with its inputs named: a rebuilt graph's node that computes
what its namesake in the graph it was rebuilt from computed, from the same values, has the
same value (its meta need not be propagated again); a rebuilt program that is its source node
for node costs what its source costs (it need not be predicted again)."""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.fx
from torch.fx.node import map_aggregate, map_arg

from optimus_eqsat.fxvocab import canonical_name


class _Input:
    """A node read by a computation, by name."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Input) and other.name == self.name

    __hash__ = None  # type: ignore[assignment]


def computation(n: torch.fx.Node) -> tuple | None:
    """A call node's kind, its op (by canonical name where it has one, so ``operator.mul``
    and ``torch.mul`` agree) and its arguments, its inputs by name; None for other nodes and
    where an argument holds a tensor (constants are compared by value)."""
    if n.op not in ("call_function", "call_method"):
        return None
    found_tensor = False

    def note_tensor(a: Any) -> Any:
        nonlocal found_tensor
        found_tensor = found_tensor or isinstance(a, torch.Tensor)
        return a

    named = map_arg((n.args, n.kwargs), lambda m: cast(Any, _Input(m.name)))
    args = map_aggregate(named, note_tensor)
    return None if found_tensor else (n.op, canonical_name(n) or n.target, args)


def same_computation(known: dict[str, tuple], n: torch.fx.Node) -> bool:
    """``n`` computes what ``known`` (node name -> :func:`computation`) says its namesake did."""
    ref = known.get(n.name)
    return ref is not None and _same_value(ref, computation(n))


def same_program(a: torch.fx.GraphModule, b: torch.fx.GraphModule) -> bool:
    """``a`` and ``b`` run the same nodes in the same order: names, placeholders, attributes,
    computations and outputs alike (targets compared by canonical name)."""
    nodes_a, nodes_b = list(a.graph.nodes), list(b.graph.nodes)
    if len(nodes_a) != len(nodes_b):
        return False
    for x, y in zip(nodes_a, nodes_b):
        if x.name != y.name or x.op != y.op:
            return False
        if x.op in ("call_function", "call_method"):
            ref = computation(y)
            if ref is None or not _same_value(ref, computation(x)):
                return False
        elif x.target != y.target or not _same_value(_named(x), _named(y)):  # inputs, outputs, modules
            return False
    return True


def _named(n: torch.fx.Node) -> Any:
    return map_arg((n.args, n.kwargs), lambda m: m.name)


def _same_value(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # (a tensor default: not compared)
        return False
