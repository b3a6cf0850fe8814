"""Lookups into tables of one width -> one lookup into the tables concatenated along rows.

(Not in Inductor.) Built only when parameters are frozen (inference under
Inductor's freezing): then the tables are concatenated once, at compile time.
Not behind the backend's parameter cache, which would hold that second copy
of every table for as long as the program lives.
Otherwise the concatenation would copy every table on every step (and hold a
second copy in memory), which never pays: the lookups stay apart, and Inductor
fuses separate gathers into its generated code anyway. The concatenated tables
are a second copy in memory even when frozen, so groups whose tables hold more
than ``MAX_FROZEN_TABLE_BYTES`` are declined.

Each table's indices are shifted by its first row: the indices
are concatenated first and shifted by one elementwise op (``shift_segments``), so
the shift is one kernel however many tables; it is an Op1, never a Unary: it
depends on the position, so it must not be pushed into the cat's members. Only
plain lookups: padding_idx (it masks one row's gradient), max_norm (it
renormalizes the table in place), scale_grad_by_freq, sparse gradients and
per-sample weights keep their own lookup. Valid for in-range indices; an
out-of-range or negative index, an error in the original, would read a
neighbouring table.
"""

from __future__ import annotations

import inspect
import math
from typing import cast

import torch
import torch.nn.functional as F

from optimus_eqsat.fxvocab.symbolic import all_concrete
from optimus_eqsat.kernels.batched_ops import shift_rows, shift_segments
from optimus_eqsat.opspec import GATHER, POINTWISE, OpSpec, Slot
from optimus_eqsat.rewrites.batching.builder import BatchBuilder
from optimus_eqsat.rewrites.batching.candidates import Candidate, shapes_known
from optimus_eqsat.rewrites.batching.kinds import BatchContext, BatchKind, register
from optimus_eqsat.term import Cat, Id, Op1, Op2, Reshape, Slice, Term, Union, cons_list
from optimus_eqsat.translate import Translation

_ATEN_EMBEDDING = ("weight", "input", "padding_idx", "scale_grad_by_freq", "sparse")
MAX_FROZEN_TABLE_BYTES = 64 << 20  # a second copy of small tables only


def embedding_slots(spec: OpSpec) -> tuple[int, int] | None:
    """(indices slot, table slot) of a plain embedding lookup; None otherwise."""
    if spec.kind != GATHER:
        return None
    kwargs = dict(spec.kwargs)
    if spec.target is F.embedding:
        try:
            bound = inspect.signature(F.embedding).bind(*spec.args, **kwargs)
        except TypeError:
            return None
        bound.apply_defaults()
        a = dict(bound.arguments)
        plain = a["padding_idx"] is None and a["max_norm"] is None
    elif spec.target in (torch.embedding, torch.ops.aten.embedding.default, torch.ops.aten.embedding):
        if len(spec.args) > len(_ATEN_EMBEDDING) or set(kwargs) - set(_ATEN_EMBEDDING):
            return None
        a = {
            "padding_idx": -1,
            "scale_grad_by_freq": False,
            "sparse": False,
            **dict(zip(_ATEN_EMBEDDING, spec.args)),
            **kwargs,
        }
        plain = a["padding_idx"] in (-1, None)
    else:
        return None
    if not plain or a["scale_grad_by_freq"] or a["sparse"]:
        return None
    idx, table = a["input"], a["weight"]
    if not (isinstance(idx, Slot) and isinstance(table, Slot)) or spec.arity != 2:
        return None
    return idx.index, table.index


@register
class Embedding(BatchKind):
    """embedding(idx_i, W_i) -> rows of embedding(shift(cat(idx_i)), cat(W_i))."""

    name = "embedding"

    def can_pay(self, context: BatchContext, n: int) -> bool:
        return context.frozen

    def key(self, t: Translation, c: Candidate) -> tuple | None:
        """Plain lookups into 2-D tables of one width and dtype (indices of one dtype)."""
        spec = t.registry.specs.get(c.key)
        if c.ctor != "Op2" or spec is None or not shapes_known(t, c):
            return None
        slots = embedding_slots(spec)
        if slots is None:
            return None
        idx, table = (c.operands[s] for s in slots)
        idx_dtype, table_shape = t.dtypes.get(idx), t.shapes[table]
        if idx_dtype not in (torch.int64, torch.int32) or len(table_shape) != 2 or t.dtypes.get(table) is None:
            return None
        return ("embedding", table_shape[1], t.dtypes[table], idx_dtype)

    def build(self, b: BatchBuilder, group: list[Candidate]) -> bool:
        t = b.t
        slots = [cast(tuple[int, int], embedding_slots(t.registry.specs[c.key])) for c in group]  # as in key()
        idxs = [c.operands[s[0]] for c, s in zip(group, slots)]
        tables = [c.operands[s[1]] for c, s in zip(group, slots)]
        rows = tuple(t.shapes[w][0] for w in tables)
        if t.dtypes[idxs[0]] == torch.int32 and sum(rows) >= 2**31:
            return False  # shifted indices would overflow
        if sum(math.prod(t.shapes[w]) * t.dtypes[w].itemsize for w in tables) > MAX_FROZEN_TABLE_BYTES:
            return False
        if not all(all_concrete(t.shapes[idx]) for idx in idxs):
            return self._build_stacked(b, group, idxs, tables, rows)
        counts = [math.prod(t.shapes[idx]) for idx in idxs]
        starts = tuple(sum(counts[:k]) for k in range(len(counts)))
        width, total = t.shapes[tables[0]][1], sum(counts)
        flat: list[Term] = [Reshape(Id(idx), (n,)) for idx, n in zip(idxs, counts)]
        cat = b.new(Cat(cons_list(flat, 0, b.facts.append, t.new_list_id, counts)), (total,))
        shift = t.registry.register(OpSpec("call_function", shift_segments, (Slot(0), starts, rows), (), POINTWISE))
        indices = b.new(Op1(shift, cat), (total,))
        weights: list[Term] = [Id(w) for w in tables]
        table = b.new(Cat(cons_list(weights, 0, b.facts.append, t.new_list_id, rows)), (sum(rows), width))
        lookup = t.registry.register(OpSpec("call_function", F.embedding, (Slot(0), Slot(1)), (), GATHER))
        y = b.new(Op2(lookup, indices, table), (total, width))
        b.record(y, [c.node for c in group])
        for c, start, n in zip(group, starts, counts):
            b.facts.append(Union(Id(c.node), Reshape(Slice(y, 0, start, start + n), t.shapes[c.node])))
        return True

    @staticmethod
    def _build_stacked(
        b: BatchBuilder, group: list[Candidate], idxs: list[int], tables: list[int], rows: tuple[int, ...]
    ) -> bool:
        """Indices of a symbolic size (a dynamic batch): segment offsets in the flat
        concatenation would be symbolic, so indices of one shape are stacked instead,
        each row shifted by its table's first row (``shift_rows``), and every member is
        its row of the lookup. Indices of different shapes keep their own lookups."""
        t = b.t
        shape = t.shapes[idxs[0]]
        if any(t.shapes[i] != shape for i in idxs):
            return False
        stacked, stacked_shape = b.stack(idxs, len(shape))
        shift = t.registry.register(OpSpec("call_function", shift_rows, (Slot(0), rows), (), POINTWISE))
        indices = b.new(Op1(shift, stacked), stacked_shape)
        width = t.shapes[tables[0]][1]
        weights: list[Term] = [Id(w) for w in tables]
        table = b.new(Cat(cons_list(weights, 0, b.facts.append, t.new_list_id, rows)), (sum(rows), width))
        lookup = t.registry.register(OpSpec("call_function", F.embedding, (Slot(0), Slot(1)), (), GATHER))
        y = b.new(Op2(lookup, indices, table), stacked_shape + (width,))
        b.unstack(y, [c.node for c in group])
        return True
