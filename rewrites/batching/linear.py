"""Linears -> one matmul: same shapes (bmm), ragged input widths (padded bmm), one shared input.

batch_linear (Inductor 22, 27)      same-shaped linears -> one bmm over stacked operands
batch_linear_lhs (23)               linears sharing one input -> one linear on concatenated weights
(not in Inductor) linear_padk       one output width, any input widths -> one bmm over inputs and
                                    weights zero-padded to the widest input
"""

from __future__ import annotations

from collections import defaultdict

import torch

from optimus_eqsat.op_keys import LINEAR_B, LINEAR_KEYS
from optimus_eqsat.opspec import MATMUL, POINTWISE, OpSpec, Slot
from optimus_eqsat.rewrites.batching.builder import BatchBuilder
from optimus_eqsat.rewrites.batching.candidates import Candidate, shapes_known
from optimus_eqsat.rewrites.batching.kinds import BatchKind, register
from optimus_eqsat.rewrites.batching.views import zero_padded
from optimus_eqsat.term import Binary, Cat, Id, Op2, Op3, Permute, Reshape, Slice, Term, Union, cons_list
from optimus_eqsat.translate import Translation

#: dtypes whose rounding between a product and its bias add shows
LOW_PRECISION = frozenset({torch.bfloat16, torch.float16})


def is_2d_linear(t: Translation, c: Candidate) -> bool:
    """A linear (with or without bias) of a 2-D weight, all shapes known."""
    return c.key in LINEAR_KEYS and shapes_known(t, c) and len(t.shapes[c.operands[1]]) == 2


def stacked_linear(b: BatchBuilder, group: list[Candidate], stacked_x: Id, stacked_w: Id) -> None:
    """The group's linears as one bmm of ``stacked_x`` [n, m, k] by ``stacked_w`` [n, N, k]
    transposed, plus the stacked biases; each member is its slice of the result."""
    t, c0 = b.t, group[0]
    n, m, n_out = len(group), t.symbols.product(t.shapes[c0.operands[0]][:-1]), t.shapes[c0.operands[1]][0]
    w_t = Permute(stacked_w, (0, 2, 1))
    if c0.key == LINEAR_B and t.dtypes.get(c0.node) in LOW_PRECISION:
        # The bias inside the matmul, as the linear has it: a bf16 product rounded before a
        # separate bias add is rounded twice (3-4x eager's gradient error was seen under autocast)
        stacked_b = _stacked_biases(b, group)
        baddbmm = t.registry.add_named(
            "baddbmm", OpSpec("call_function", torch.baddbmm, (Slot(0), Slot(1), Slot(2)), (), MATMUL)
        )
        y = b.new(Op3(baddbmm, stacked_b, stacked_x, w_t), (n, m, n_out))
    else:
        mm = t.registry.add_named("matmul", OpSpec("call_function", torch.matmul, (Slot(0), Slot(1)), (), MATMUL))
        y = b.new(Op2(mm, stacked_x, w_t), (n, m, n_out))
        if c0.key == LINEAR_B:
            stacked_b = _stacked_biases(b, group)
            add = t.registry.add_named("add", OpSpec("call_function", torch.add, (Slot(0), Slot(1)), (), POINTWISE))
            y = b.new(Binary(add, y, stacked_b), (n, m, n_out))
    b.unstack(y, [c.node for c in group])


def _stacked_biases(b: BatchBuilder, group: list[Candidate]) -> Id:
    """The group's biases stacked: [n, 1, N]."""
    return b.stack([c.operands[2] for c in group], 2)[0]


@register
class Linear(BatchKind):
    """linear_i(x_i, w_i, b_i) -> bmm(stack(x), stack(w)^T) + stack(b): one extern kernel."""

    name = "linear"

    def key(self, t: Translation, c: Candidate) -> tuple | None:
        if not is_2d_linear(t, c):
            return None
        return ("linear", c.key, tuple(t.shapes[o] for o in c.operands), t.dtypes.get(c.node))

    def build(self, b: BatchBuilder, group: list[Candidate]) -> bool:
        t, c0 = b.t, group[0]
        x_shape, k = t.shapes[c0.operands[0]], t.shapes[c0.operands[1]][1]
        stacked, _ = b.stack([c.operands[0] for c in group], len(x_shape))
        stacked_x = b.new(Reshape(stacked, (len(group), t.symbols.product(x_shape[:-1]), k)))  # [n, m, k]
        stacked_linear(b, group, stacked_x, b.stack([c.operands[1] for c in group], 2)[0])
        return True


@register
class LinearLhs(BatchKind):
    """linear(x, w_i, b_i) -> linear(x, cat(w), cat(b)) sliced along the last dim: one kernel."""

    name = "linear_lhs"

    def key(self, t: Translation, c: Candidate) -> tuple | None:
        if not is_2d_linear(t, c):
            return None
        return ("linear_lhs", c.key, c.operands[0], t.dtypes.get(c.node))

    def build(self, b: BatchBuilder, group: list[Candidate]) -> bool:
        t, c0 = b.t, group[0]
        x = c0.operands[0]
        widths = [t.shapes[c.operands[1]][0] for c in group]
        weights: list[Term] = [Id(c.operands[1]) for c in group]
        w = b.new(Cat(cons_list(weights, 0, b.facts.append, t.new_list_id, widths)))
        out_shape = t.shapes[x][:-1] + (sum(widths),)
        if c0.key == LINEAR_B:
            biases: list[Term] = [Id(c.operands[2]) for c in group]
            bias = b.new(Cat(cons_list(biases, 0, b.facts.append, t.new_list_id, widths)))
            y = b.new(Op3(c0.key, Id(x), w, bias), out_shape)
        else:
            y = b.new(Op2(c0.key, Id(x), w), out_shape)
        b.record(y, [c.node for c in group])
        t.shapes[y.i] = out_shape  # (read by the stacks of its columns, views.py)
        last, start = len(out_shape) - 1, 0
        for c, width in zip(group, widths):
            b.facts.append(Union(Id(c.node), Slice(y, last, start, start + width)))
            b.columns[c.node] = (y.i, last, start, start + width)
            start += width
        return True


@register
class LinearPadK(BatchKind):
    """linear_i(x_i, w_i, b_i), K_i ragged -> bmm(cat(pad(stack(x))), cat(pad(stack(w)))^T) + stack(b).

    Linears of one output width and batch shape but any input width K may share one
    bmm over inputs and weights zero-padded along K to the widest. Optimus' batch_linear
    needs equal shapes, and on CPU group_linear is a loop: this is what makes the ragged
    feature projections of a dynamic-schema model one kernel. Members are ordered by K,
    then graph order, so each width class stacks as a run (a view of its batched producer)
    and is padded once. Zero columns of x meet zero columns of w, so every product is
    unchanged. Groups of one width are left to :class:`Linear`.
    """

    name = "linear_padk"

    def key(self, t: Translation, c: Candidate) -> tuple | None:
        if not is_2d_linear(t, c):
            return None
        x_shape, (n_out, _) = t.shapes[c.operands[0]], t.shapes[c.operands[1]]
        return ("linear_padk", c.key, x_shape[:-1], n_out, t.dtypes.get(c.node))

    def build(self, b: BatchBuilder, group: list[Candidate]) -> bool:
        t = b.t
        ks = {c.node: t.shapes[c.operands[1]][1] for c in group}
        if len(set(ks.values())) < 2:
            return False
        kmax = max(ks.values())
        group = sorted(group, key=lambda c: (ks[c.node], c.node))
        lead = t.shapes[group[0].operands[0]][:-1]
        m = t.symbols.product(lead)  # a symbolic code when a leading dim is dynamic
        classes: dict[int, list[Candidate]] = defaultdict(list)
        for c in group:
            classes[ks[c.node]].append(c)

        def padded(stacked: Id, shape: tuple[int, ...]) -> Id:
            if shape[-1] == kmax:
                return stacked
            return zero_padded(t, stacked, shape, len(shape) - 1, kmax - shape[-1], b.facts.append)

        xs: list[Term] = []
        ws: list[Term] = []
        for k, members in classes.items():
            sx, _ = b.stack([c.operands[0] for c in members], len(lead) + 1)
            xs.append(padded(b.new(Reshape(sx, (len(members), m, k))), (len(members), m, k)))
            sw, shape_w = b.stack([c.operands[1] for c in members], 2)
            ws.append(padded(sw, shape_w))
        counts = [len(members) for members in classes.values()]
        n_out = t.shapes[group[0].operands[1]][0]
        stacked_x = b.new(Cat(cons_list(xs, 0, b.facts.append, t.new_list_id, counts)), (len(group), m, kmax))
        stacked_w = b.new(Cat(cons_list(ws, 0, b.facts.append, t.new_list_id, counts)), (len(group), n_out, kmax))
        stacked_linear(b, group, stacked_x, stacked_w)
        return True
