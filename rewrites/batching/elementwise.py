"""Elementwise ops of equal shapes -> one op over stacked operands.

Covers Inductor's batch_tanh/sigmoid/relu (25, 30), batch_nan_to_num/clamp/dropout
(26) and batch_aten_add/sub/mul/div (29): any Unary, Scalar or
Binary op whose key is pointwise; and the elementwise ops of several tensors
that backward graphs hold (``where`` of a relu gradient, ``prims.fma`` of a
softmax gradient, ``threshold_backward``, ``sigmoid_backward``, ...), which the
translator keeps as Op2/Op3 terms. Not ``detach`` (Optimus batches it too): it
launches nothing, so a batch of detaches only adds the stack of their inputs (in
training that would stack every batch norm's statistics before their running update).
Nor dtype casts: Inductor fuses a cast into the kernel that reads it, and under autocast,
where every linear's input, weight and bias are cast, batched casts of the weights beside
the batched linears' stacks of them grew rechub's PLE's e-graph 7x (50k e-nodes, 17 s of
saturation, past the backend's budget) for no launch saved.

An operand every member shares (the zero of ``where(mask, 0, grad)``) is not
stacked: elementwise ops broadcast, and a shared operand of at most the output's
rank broadcasts against the stack's new leading dim exactly as against each member.
"""

from __future__ import annotations

from typing import cast

from optimus_eqsat.fxvocab import CAST_OPS, VIEW_OPS, target_name
from optimus_eqsat.normalize import ELEMENTWISE_MULTI, ELEMENTWISE_UNARY
from optimus_eqsat.opspec import POINTWISE, OpSpec
from optimus_eqsat.rewrites.batching.builder import BatchBuilder
from optimus_eqsat.rewrites.batching.candidates import Candidate, shapes_known
from optimus_eqsat.rewrites.batching.kinds import BatchKind, register
from optimus_eqsat.term import CTORS, ELEMENTWISE_CTORS, Id, Scalar, Term
from optimus_eqsat.translate import Translation

_OP_CTORS = ("Op1", "Op2", "Op3")
ELEMENTWISE_OP_NAMES = frozenset(ELEMENTWISE_UNARY | ELEMENTWISE_MULTI)


def is_elementwise_op(spec: OpSpec | None) -> bool:
    """Whether an op key's spec is an elementwise op of its tensors (broadcasting, no dims)."""
    return spec is not None and spec.kind == POINTWISE and target_name(spec.target) in ELEMENTWISE_OP_NAMES


def stacked_operands(b: BatchBuilder, group: list[Candidate], rank: int) -> list[Term] | None:
    """Per operand position, the stack of the members' operands, or the operand itself
    where every member shares it (broadcast); None when every operand is shared (the
    members are one computation)."""
    out: list[Term] = []
    for k in range(len(group[0].operands)):
        ids = [c.operands[k] for c in group]
        if len(set(ids)) == 1 and len(b.t.shapes[ids[0]]) <= rank:
            out.append(Id(ids[0]))
        else:
            out.append(b.stack(ids, rank)[0])
    if all(isinstance(term, Id) and term.i == group[0].operands[k] for k, term in enumerate(out)):
        return None
    return out


@register
class Elementwise(BatchKind):
    name = "elementwise"

    def key(self, t: Translation, c: Candidate) -> tuple | None:
        spec = t.registry.specs.get(c.key)
        if not shapes_known(t, c) or spec is None or spec.kind != POINTWISE:
            return None
        if c.ctor not in ELEMENTWISE_CTORS and not (c.ctor in _OP_CTORS and is_elementwise_op(spec)):
            return None
        if target_name(spec.target) in VIEW_OPS | CAST_OPS:  # (no launch of their own: see the module docstring)
            return None
        return (c.ctor, c.key, tuple(t.shapes[o] for o in c.operands), c.scalar_key, t.dtypes.get(c.node))

    def build(self, b: BatchBuilder, group: list[Candidate]) -> bool:
        c0 = group[0]
        rank = len(b.t.shapes[c0.node])
        operands = stacked_operands(b, group, rank)
        if operands is None:
            return False
        out = (len(group),) + b.t.shapes[c0.node]
        if c0.ctor == "Scalar":
            batched = b.new(Scalar(c0.key, operands[0], cast(float, c0.scalar)))  # a Scalar candidate has one
        else:
            batched = b.new(CTORS[c0.ctor].cls(c0.key, *operands), out)
        b.unstack(batched, [c.node for c in group])
        return True
