"""2-D matmuls (aten ``mm``) of equal shapes -> one batched matmul.

(Inductor's batch_linear_post_grad batches ``addmm``/``mm`` of linears; this is
the kind for every other ``mm``.) Backward graphs hold them: the weight gradient
of a linear is ``mm(grad.t(), x)``, and a batched forward leaves one per member.
Members' operands are stacked; an operand every member shares is not (``matmul``
broadcasts it: a shared right operand makes the batch one ``mm`` over the
stacked rows); an operand that is the same transpose of each member's tensor is
stacked from those tensors and transposed once, so a stack of gradients that are
slices of one batched gradient stays a view.
"""

from __future__ import annotations

import torch

from optimus_eqsat.opspec import MATMUL, OpSpec, Slot
from optimus_eqsat.rewrites.batching.builder import BatchBuilder
from optimus_eqsat.rewrites.batching.candidates import Candidate, shapes_known
from optimus_eqsat.rewrites.batching.kinds import BatchKind, register
from optimus_eqsat.term import Id, Op2, Permute, Term
from optimus_eqsat.translate import Translation


def _transposed(t: Translation, i: int) -> int | None:
    """j when node i is ``j`` transposed (a 2-D ``Permute(Id j, (1, 0))``), else None."""
    term = t.terms.get(i)
    if isinstance(term, Permute) and isinstance(term.x, Id) and term.perm == (1, 0):
        return term.x.i
    return None


def batched_operand(b: BatchBuilder, ids: list[int]) -> Term:
    """The members' 2-D operands as one [n, r, c] operand: a shared one as it is (matmul
    broadcasts it), a common transpose stacked under one transpose, else the stack."""
    t = b.t
    if len(set(ids)) == 1:
        return Id(ids[0])
    inner = [_transposed(t, i) for i in ids]
    if all(j is not None for j in inner):
        stacked, _ = b.stack(inner, 2)  # type: ignore[arg-type]
        return Permute(stacked, (0, 2, 1))
    return b.stack(ids, 2)[0]


@register
class MatMul(BatchKind):
    """mm_i(a_i, b_i) -> matmul(stack(a), stack(b)): one bmm (one mm when b is shared)."""

    name = "matmul"

    def key(self, t: Translation, c: Candidate) -> tuple | None:
        if c.key != "matmul" or c.ctor != "Op2" or not shapes_known(t, c):
            return None
        shapes = tuple(t.shapes[o] for o in c.operands)
        if any(len(s) != 2 for s in shapes):
            return None
        return ("matmul", shapes, t.dtypes.get(c.node))

    def build(self, b: BatchBuilder, group: list[Candidate]) -> bool:
        t = b.t
        lhs, rhs = ([c.operands[k] for c in group] for k in (0, 1))
        if len(set(lhs)) == 1 and len(set(rhs)) == 1:
            return False  # one computation
        mm = t.registry.add_named("matmul", OpSpec("call_function", torch.matmul, (Slot(0), Slot(1)), (), MATMUL))
        out = (len(group),) + t.shapes[group[0].node]
        y = b.new(Op2(mm, batched_operand(b, lhs), batched_operand(b, rhs)), out)
        b.unstack(y, [c.node for c in group])
        return True
