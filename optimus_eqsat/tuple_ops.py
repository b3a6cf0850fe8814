"""Ops that return a tuple of tensors (``var_mean``, ``native_layer_norm``, ...): one term per item.

Aten graphs read the items of a tuple op with ``getitem`` users: Inductor's
layer norm is ``var_mean`` (variance, mean), AOTAutograd's undecomposed one
``native_layer_norm`` (output, mean, rstd) and its gradient
``native_layer_norm_backward`` (input, weight and bias gradients). The term
language has single-output ops only, so the translator gives a tuple op no term
of its own (like a split, its status is "pieces") and each item becomes an op
term of its own key, ``KEY#k``, over the op's operands; ``getitem`` users take
their item. Rules and batching then treat the items as ordinary ops.

Rebuilt, the items of one op over the same operands must not compute it twice:
:class:`TupleItemSpec` emits the op once per graph and operands, and each item as
a ``getitem`` of that one node.
"""

from __future__ import annotations

import operator
import weakref
from dataclasses import dataclass
from typing import Any

import torch.fx

from optimus_eqsat.fxvocab import OP_KINDS, canonical_name
from optimus_eqsat.opspec import OpSpec, fill_slots
from optimus_eqsat.term import Op1, Op2, Op3, Term

__all__ = ["TUPLE_OPS", "TupleItemSpec", "h_tuple_op", "tuple_item_specs"]

# Pure ops returning a tuple of tensors, by canonical name (all items are read by getitem).
TUPLE_OPS = frozenset({"var_mean", "std_mean", "native_layer_norm", "native_layer_norm_backward", "aminmax"})

# graph -> (op, target, args, kwargs, operand nodes) -> the one node computing the tuple
_PRODUCERS: weakref.WeakKeyDictionary[torch.fx.Graph, dict[tuple, torch.fx.Node]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class TupleItemSpec(OpSpec):
    """Item ``item`` of a tuple op: ``getitem(op(...), item)``, the op emitted once."""

    item: int = 0

    def emit(self, graph: torch.fx.Graph, operands: list[torch.fx.Node], name: str | None = None) -> torch.fx.Node:
        producers = _PRODUCERS.setdefault(graph, {})
        key = (self.op, self.target, self.args, self.kwargs, tuple(operands))
        whole = producers.get(key)
        if whole is None or whole.graph is not graph or whole._erased:
            args, kwargs = fill_slots(self.args, operands), fill_slots(dict(self.kwargs), operands)
            whole = producers[key] = graph.create_node(self.op, self.target, args, kwargs)
        return graph.call_function(operator.getitem, (whole, self.item), name=name)


def tuple_item_specs(registry: Any, key: str, spec: OpSpec, count: int) -> list[str]:
    """Keys ``KEY#k`` for the ``count`` items of the tuple op ``spec`` registered as ``key``."""
    return [
        registry.add_named(f"{key}#{k}", TupleItemSpec(spec.op, spec.target, spec.args, spec.kwargs, spec.kind, item=k))
        for k in range(count)
    ]


def h_tuple_op(ctx: Any, a: dict[str, Any]) -> list[Term]:
    """The items of a tuple op: one op term each, keyed ``KEY#k`` (a list: the node's pieces)."""
    node = ctx.node
    name = canonical_name(node)
    kind = OP_KINDS[name].value if name in OP_KINDS else "other"
    whole = ctx.generic(kind)  # registers the whole op's spec; its term is not used
    value = node.meta.get("val")
    count = (
        len(value)
        if isinstance(value, (tuple, list))
        else 1 + max((u.args[1] for u in node.users if isinstance(u.args[1], int)), default=0)
    )
    registry = ctx.t.registry  # the translator's op registry
    keys = tuple_item_specs(registry, whole.op, registry.specs[whole.op], count)
    ctor = {1: Op1, 2: Op2, 3: Op3}[len(_operands(whole))]
    return [ctor(k, *_operands(whole)) for k in keys]


def _operands(term: Term) -> tuple[Term, ...]:
    if isinstance(term, Op1):
        return (term.x,)
    if isinstance(term, Op2):
        return (term.a, term.b)
    if isinstance(term, Op3):
        return (term.a, term.b, term.c)
    raise TypeError(f"not an op term: {term}")
