"""One sample of a solved query: free variables drawn where they are first used, terms evaluated.

A free variable is drawn when a term first needs it, from what that position
needs: a Slice's dim within its operand's rank and its bounds within that
dim, a Reshape's target with as many elements, an operand of a matmul that
fits the first one, a list's tail whose members concatenate with its head.
Evaluating the query's structures on the matched side (``matched``) raises
:class:`~.meaning.Invalid` for a sample the e-graph could not hold; the
actions' new terms are evaluated the same way, and an error there is the rule's.
"""

from __future__ import annotations

from typing import cast

import torch

from optimus_eqsat.rule_check.logic import Call, Goal, Lit, Node, Var
from optimus_eqsat.rule_check.meaning import (
    PRIMITIVES,
    SAMPLE_OPS,
    TV,
    Invalid,
    ListVal,
    NotCheckable,
    apply_ctor,
    apply_view,
    op_meaning,
)
from optimus_eqsat.rule_check.sampling import SampleSpace
from optimus_eqsat.term import CTORS

_OPS = frozenset({"Unary", "Binary", "Scalar", "Op1", "Op2", "Op3"})


class Instance:
    """Values of one sample of ``goal``."""

    def __init__(self, goal: Goal, space: SampleSpace):
        self.goal, self.space = goal, space
        self.values: dict[int, object] = {}  # id(term) -> value: drawn variables and evaluated structures
        self.leaves: dict[int, TV] = {}  # Leaf/Id index -> tensor
        self._busy: set[int] = set()

    # ---------------------------------------------------------------- values
    def value(self, t: object, matched: bool = True, hint: tuple | None = None) -> object:
        """The value of term ``t`` (memoized: a variable and a shared structure have one value)."""
        t = self.goal.resolve(t)
        if isinstance(t, Lit):
            return t.value
        key = id(t)
        if key in self.values:
            return self.values[key]
        if key in self._busy:
            raise Invalid("a value defined by itself")
        self._busy.add(key)
        try:
            if isinstance(t, Var):
                v = self._draw(t, hint)
            elif isinstance(t, Node):
                v = self._node(t, matched, hint)
            else:  # the goal's terms are literals, variables, nodes and calls
                v = self._call(cast(Call, t), matched, hint)
        finally:
            self._busy.discard(key)
        self.values[key] = v
        return v

    def known(self, t: object) -> object | None:
        """The value of ``t`` if this sample computed it."""
        t = self.goal.resolve(t)
        return t.value if isinstance(t, Lit) else self.values.get(id(t))

    def _free(self, t: object) -> bool:
        t = self.goal.resolve(t)
        return isinstance(t, Var) and id(t) not in self.values

    def _node(self, node: Node, matched: bool, outer: tuple | None) -> object:
        ctor = node.ctor
        if ctor in ("Id", "Leaf"):  # names of values: one tensor per index (Id i and Leaf i name one value)
            i = cast(int, self.value(node.args[0], matched, (ctor, "i", [], None)))
            if i not in self.leaves:
                self.leaves[i] = self.space.tensor(self.space.shape())
            return self.leaves[i]
        if ctor == "Slice":
            return self._slice(node, matched)
        args: list = []
        for arg, field in zip(node.args, CTORS[ctor].field_names):
            args.append(self.value(arg, matched, (ctor, field, args, outer)))
        return apply_ctor(ctor, args, matched)

    def _slice(self, node: Node, matched: bool) -> TV:
        x_t, d_t, a_t, b_t = node.args
        x = self.value(x_t, matched, ("Slice", "x", [], None))
        if not isinstance(x, TV):
            raise Invalid("Slice of a non-tensor")
        shape = tuple(x.value.shape)
        d = cast(int, self.value(d_t, matched, ("Slice", "dim", [x], None)))
        n = shape[d] if 0 <= d < len(shape) else 0
        if self._free(a_t) or self._free(b_t):
            a = None if self._free(a_t) else cast(int, self.value(a_t, matched))
            b = None if self._free(b_t) else cast(int, self.value(b_t, matched))
            a, b = self.space.bounds(n, a, b)
            for t, v in ((a_t, a), (b_t, b)):
                self.values.setdefault(id(self.goal.resolve(t)), v)
        return apply_view("Slice", x, [d, self.value(a_t, matched), self.value(b_t, matched)])

    def _draw(self, var: Var, hint: tuple | None) -> object:
        """A value for a free variable, fitting the position ``hint`` describes."""
        space = self.space
        ctor, field, prev, outer = hint or (None, None, [], None)
        sort = var.sort
        if sort == "Tensor":
            shape = self._operand_shape(ctor, prev) or space.shape()
            if ctor == "Slice" and not shape:  # a sliced tensor has a dim
                shape = (space.size(),)
            return space.tensor(shape)
        if sort == "TList":
            return space.list_like(prev[0] if ctor == "TCons" and prev else None)
        if sort == "String":
            return space.op_key(ctor if ctor in SAMPLE_OPS else "Unary")
        if sort == "f64":
            x = prev[1] if ctor == "Scalar" and len(prev) > 1 else None
            return space.constant(integral=isinstance(x, TV) and not x.value.is_floating_point())
        if sort == "Shape":
            shape = tuple(prev[0].value.shape) if prev and isinstance(prev[0], TV) else space.shape()
            if ctor == "Reshape":
                return space.reshape_target(shape)
            if ctor == "Permute":
                return space.permutation(len(shape))
            if ctor == "Expand":
                return space.expand_target(shape)
            return shape
        if ctor == "Slice" and field == "dim" and prev and isinstance(prev[0], TV):
            return space.dim_of(tuple(prev[0].value.shape))
        if ctor == "TNil":  # the dim of a list: within the rank of the members before it
            _, _, before, _ = outer or (None, None, [], None)
            head = before[0] if before and isinstance(before[0], TV) else None
            return space.dim_of(tuple(head.value.shape)) if head is not None else space.small_int()
        if ctor in ("Id", "Leaf"):
            return space.leaf_index()
        return space.small_int()

    def _operand_shape(self, ctor: str | None, prev: list) -> tuple | None:
        """A shape for the next tensor operand of an op that fits the ones before it."""
        if ctor not in _OPS or not prev or not isinstance(prev[0], str):
            return None
        tensors = [tuple(p.value.shape) for p in prev[1:] if isinstance(p, TV)]
        meaning = op_meaning(ctor, prev[0])
        if meaning.operand_shape is not None:
            return meaning.operand_shape(len(tensors), tensors, self.space.size, self.space.rng)
        if ctor == "Binary" and tensors:
            return self.space.broadcast_like(tensors[0])
        return None

    def _call(self, call: Call, matched: bool, hint: tuple | None = None) -> object:
        if call.fn == "ldim":
            return self._ldim(call.args[0], matched, hint)
        fn = PRIMITIVES[call.fn]
        args = [self.value(a, matched) for a in call.args]
        try:
            return fn(*args)
        except (Invalid, NotCheckable):
            raise
        except Exception as exc:  # a primitive applied outside its domain: no match
            raise Invalid(f"{call.fn}: {exc}") from None

    def _ldim(self, t: object, matched: bool, hint: tuple | None) -> int:
        """A list's dim, read from its end: a member may depend on it (the dim of a Slice in
        the list is the list's), so the members are not evaluated for it. A dim still to
        draw is drawn for the position asking (``hint``: a Slice's dim)."""
        t = self.goal.resolve(t)
        while isinstance(t, Node) and t.ctor in ("TCons", "LAppend", "MapUnary") and id(t) not in self.values:
            t = self.goal.resolve(t.args[1])
        if isinstance(t, Node) and t.ctor == "TNil" and id(t) not in self.values:
            return cast(int, self.value(t.args[0], matched, hint))
        lst = self.value(t, matched)
        if not isinstance(lst, ListVal):
            raise Invalid("ldim of a non-list")
        return lst.dim

    # ---------------------------------------------------------------- the query
    def match(self) -> None:
        """Evaluate the query's structures and test its conditions; Invalid when this sample
        is no match (an ill-formed term, a condition that does not hold)."""
        for root in self.goal.roots:
            self.value(root, True)
        for constraint in self.goal.constraints:
            if constraint[0] == "eq":
                a, b = self.value(constraint[1]), self.value(constraint[2])
                if not same(a, b):
                    raise Invalid("a condition does not hold")
            elif not self.value(constraint[1]):
                raise Invalid("a condition does not hold")

    def float_eps(self, *values: object) -> float:
        """The rounding unit of the least precise float dtype in this sample."""
        dtypes = set(self.space.dtypes_drawn)
        for v in values:
            items = v.items if isinstance(v, ListVal) else (v,)
            dtypes |= {i.value.dtype for i in items if isinstance(i, TV)}
        return max((torch.finfo(d).eps for d in dtypes if d.is_floating_point), default=0.0)


def same(a: object, b: object) -> bool:
    """Equality of condition values (numbers, strings, shapes; tensors and lists exactly)."""
    if isinstance(a, TV) and isinstance(b, TV):
        return a.value.shape == b.value.shape and bool(torch.equal(a.value, b.value))
    if isinstance(a, ListVal) and isinstance(b, ListVal):
        return a.dim == b.dim and len(a.items) == len(b.items) and all(map(same, a.items, b.items))
    if isinstance(a, (TV, ListVal)) or isinstance(b, (TV, ListVal)):
        return False
    return a == b
