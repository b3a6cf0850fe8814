"""Writes the facts of batched alternatives, with fresh ids for new terms."""

from __future__ import annotations

from optimus_eqsat.rewrites.batching.views import Piece, Slot, make_item, name_term, stack_terms
from optimus_eqsat.term import Expand, Fact, Id, Reshape, Slice, Term, Union
from optimus_eqsat.translate import Translation


class BatchBuilder:
    """Collects the facts one batching pass adds, and what each group became."""

    def __init__(self, t: Translation):
        self.t = t
        self.facts: list[Fact] = []
        self.outputs: list[int] = []  # ids of the batched terms, one per group
        self.groups: list[tuple[int, list[int]]] = []  # (batched term id, member node ids)
        # member node id -> (batched term, position): chained groups read the previous
        # batched term directly instead of stacking its slices again
        self.slot_of: dict[int, Slot] = {}
        # member node id -> (batched term id, dim, start, end) for members that are slices of
        # their batched term (a linear on concatenated weights): stacks of them, or of equal
        # slices of them, are strided views of that term
        self.columns: dict[int, Piece] = {}

    def new(self, term: Term, shape: tuple[int, ...] | None = None) -> Id:
        """Name ``term`` by a fresh id; give it a shape when rules cannot derive it."""
        return name_term(self.t, term, shape, self.facts.append)

    def stack(self, ids: list[int], rank: int) -> tuple[Id, tuple[int, ...]]:
        """torch.stack of the operands at dim 0, each first padded on the left to ``rank``.

        Runs of earlier groups' members and of evenly spaced slices are stacked as views
        (views.py): no list of n cells to build, and no copy per operand. A stack of one
        operand n times (experts reading one input) is also its expand along a new dim 0:
        a view, where the stack copies the operand n times and the batched program would
        save those copies for its backward.
        """
        shapes = [(1,) * (rank - len(self.t.shapes[i])) + self.t.shapes[i] for i in ids]
        items = [make_item(self.t, Id(i), self.slot_of, s, self.columns) for i, s in zip(ids, shapes)]
        first, *others = stack_terms(self.t, items, self.facts.append)
        stacked = self.new(first)
        self.facts.extend(Union(stacked, term) for term in others)
        if len(ids) > 1 and len(set(ids)) == 1:
            self.facts.append(Union(stacked, Expand(Reshape(Id(ids[0]), (1,) + shapes[0]), (len(ids),) + shapes[0])))
        return stacked, (len(ids),) + shapes[0]

    def record(self, batched: Id, members: list[int]) -> None:
        """Note a group's batched term and its member nodes."""
        self.outputs.append(batched.i)
        self.groups.append((batched.i, list(members)))

    def unstack(self, batched: Id, members: list[int]) -> None:
        """Each member is its slice of ``batched`` along dim 0."""
        self.record(batched, members)
        for k, m in enumerate(members):
            self.facts.append(Union(Id(m), Reshape(Slice(batched, 0, k, k + 1), self.t.shapes[m])))
            self.slot_of[m] = (batched, k)
