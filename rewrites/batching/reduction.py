"""Reductions over given dims of equal shapes -> one reduction of the stack.

(Not an Optimus fusion; its post-grad passes leave them.) Backward graphs sum
every linear's output gradient into its bias gradient (``sum(g, [0], True)``),
and Inductor's decomposed layer norm (``var_mean``) and softmax (``amax``,
``sum``) reduce each member on its own. Stacked along a new leading dim, the same
reduction with every dim shifted by one computes all members at once. Reductions
over all dims (no dim given) are left alone; so are the items of tuple ops other
than by their own key (``var_mean``'s variance and mean batch separately, and the
rebuilt program computes their one batched ``var_mean`` once: tuple_ops.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from optimus_eqsat.fxvocab import target_name
from optimus_eqsat.opspec import OpSpec
from optimus_eqsat.rewrites.batching.builder import BatchBuilder
from optimus_eqsat.rewrites.batching.candidates import Candidate, shapes_known
from optimus_eqsat.rewrites.batching.kinds import BatchKind, register
from optimus_eqsat.term import Op1
from optimus_eqsat.translate import Translation
from optimus_eqsat.tuple_ops import TupleItemSpec, tuple_item_specs

# Ops of one tensor reducing (or normalizing) along ``dim``, by op name: torch-level
# spellings take dim as the second positional argument or as ``dim=``.
DIM_OPS = frozenset(
    {
        "sum",
        "mean",
        "amax",
        "amin",
        "var",
        "std",
        "var_mean",
        "std_mean",
        "logsumexp",
        "prod",
        "softmax",
        "log_softmax",
        "_softmax",
        "_log_softmax",
        "cumsum",
        "cumprod",
        "aminmax",
        "any",
        "all",
    }
)


def _dim_position(spec: OpSpec) -> tuple[str, Any] | None:
    """Where the dim argument sits in ``spec``: ("arg", index) or ("kwarg", name); None
    when ``spec`` is not a dim op of one tensor."""
    if target_name(spec.target) not in DIM_OPS or spec.arity != 1:
        return None
    if isinstance(spec.target, torch._ops.OpOverload):
        names = [a.name for a in spec.target._schema.arguments]
        if "dim" not in names:
            return None
        at = names.index("dim")
    else:
        at = 1
    if len(spec.args) > at:
        return ("arg", at)
    if "dim" in dict(spec.kwargs):
        return ("kwarg", "dim")
    return None


def shifted_spec(spec: OpSpec, rank: int) -> OpSpec | None:
    """``spec`` with its dims moved one to the right (for an input of ``rank`` dims that gains
    a leading batch dim); None when it reduces over all dims or is not a dim op."""
    where = _dim_position(spec)
    if where is None:
        return None
    kind, at = where
    dim = spec.args[at] if kind == "arg" else dict(spec.kwargs)["dim"]
    dims = [dim] if isinstance(dim, int) else list(dim) if isinstance(dim, (list, tuple)) else None
    if not dims or not all(isinstance(d, int) and -rank <= d < rank for d in dims):
        return None  # None or [] reduce over everything
    moved = [d % rank + 1 for d in dims]
    new = moved[0] if isinstance(dim, int) else type(dim)(moved)
    if kind == "arg":
        return dataclasses.replace(spec, args=spec.args[:at] + (new,) + spec.args[at + 1 :])
    return dataclasses.replace(spec, kwargs=tuple((k, new if k == "dim" else v) for k, v in spec.kwargs))


def register_spec(t: Translation, spec: OpSpec) -> str:
    """The key of ``spec``: tuple items under their op's key, ``KEY#k`` (tuple_ops.py)."""
    if isinstance(spec, TupleItemSpec):
        whole = t.registry.register(OpSpec(spec.op, spec.target, spec.args, spec.kwargs, spec.kind))
        return tuple_item_specs(t.registry, whole, spec, spec.item + 1)[spec.item]
    return t.registry.register(spec)


@register
class Reduction(BatchKind):
    """reduce_i(x_i, dims) -> reduce(stack(x), dims + 1): one reduction kernel."""

    name = "reduction"

    def key(self, t: Translation, c: Candidate) -> tuple | None:
        spec = t.registry.specs.get(c.key)
        if c.ctor != "Op1" or spec is None or not shapes_known(t, c):
            return None
        if shifted_spec(spec, len(t.shapes[c.operands[0]])) is None:
            return None
        return ("reduction", c.key, t.shapes[c.operands[0]], t.dtypes.get(c.node))

    def build(self, b: BatchBuilder, group: list[Candidate]) -> bool:
        t, c0 = b.t, group[0]
        rank = len(t.shapes[c0.operands[0]])
        spec = shifted_spec(t.registry.specs[c0.key], rank)
        if spec is None:
            return False
        stacked, _ = b.stack([c.operands[0] for c in group], rank)
        y = b.new(Op1(register_spec(t, spec), stacked), (len(group),) + t.shapes[c0.node])
        b.unstack(y, [c.node for c in group])
        return True
