"""Elementwise ops of equal shapes -> one op over stacked operands.

Covers Inductor's batch_tanh/sigmoid/relu (25, 30), batch_detach/nan_to_num/
clamp/dropout (26) and batch_aten_add/sub/mul/div (29): any Unary, Scalar or
Binary op whose key is pointwise.
"""

from __future__ import annotations

from ...opspec import POINTWISE
from ...term import CTORS, ELEMENTWISE_CTORS, Scalar
from ...translate import Translation
from .builder import BatchBuilder
from .candidates import Candidate, shapes_known
from .kinds import BatchKind, register


@register
class Elementwise(BatchKind):
    name = "elementwise"

    def key(self, t: Translation, c: Candidate) -> tuple | None:
        spec = t.registry.specs.get(c.key)
        if not shapes_known(t, c) or c.ctor not in ELEMENTWISE_CTORS or spec is None \
                or spec.kind != POINTWISE:
            return None
        return (c.ctor, c.key, tuple(t.shapes[o] for o in c.operands), c.scalar_key, t.dtypes.get(c.node))

    def build(self, b: BatchBuilder, group: list[Candidate]) -> bool:
        c0 = group[0]
        rank = len(b.t.shapes[c0.node])
        stacks = [b.stack([c.operands[k] for c in group], rank)[0] for k in range(len(c0.operands))]
        out = (len(group),) + b.t.shapes[c0.node]
        if c0.ctor == "Scalar":
            batched = b.new(Scalar(c0.key, stacks[0], c0.scalar))
        else:
            batched = b.new(CTORS[c0.ctor].cls(c0.key, *stacks), out)
        b.unstack(batched, [c.node for c in group])
        return True
