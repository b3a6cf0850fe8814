"""Symbolic sizes: how a dynamic dim travels through the e-graph and back.

Graphs traced with dynamic shapes (``torch.compile(dynamic=True)``,
``mark_dynamic``, Dynamo's automatic dynamic shapes) hold SymInts in their fake
values. The e-graph's ``Shape`` vectors hold i64s, so every distinct size
expression (``s0``, ``16*s0``, ``s0 + s1``) gets a *code*: a negative number no
concrete size can be (:data:`SYMBOL_BASE` minus its index).

- Codes are equal exactly when the expressions are (Dynamo's, after its
  replacements): shapes (s0, 16) and (s0, 16) compare equal, (s0, 16) and
  (s1, 16) do not unless Dynamo knows s0 == s1. Equality is all rules and
  batching keys need of most sizes.
- A rule or handler that computes with a size (an offset, a product, a split
  of a dim) is guarded to sizes >= 0: a code is copied, never computed with,
  so nothing is built that holds only at the example size.
- The cost model prices a code at its hint (the example's value,
  :func:`size_hint`, which adds no guard); the rebuilder writes a code back as
  FX (``-1`` where that is exact, else the expression over the graph's inputs:
  :mod:`optimus_eqsat.rebuild_sizes`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

SYMBOL_BASE = -(10**9)  # codes are SYMBOL_BASE - k: far from any size or size arithmetic
UNHINTED_SIZE = 8192  # the price of a size with no hint (data dependent): Inductor's own fallback


class DeclinedGraph(Exception):
    """A graph the optimizer leaves as it is: a decline, not a failure (``raise_on_error`` does
    not raise it); the reason goes to the report."""


class DataDependentSize(DeclinedGraph):
    """A graph holds a size Dynamo read from data (an unbacked symbol: ``torch.where``,
    ``nonzero`` or ``.item()`` under ``capture_dynamic_output_shape_ops`` /
    ``capture_scalar_outputs``). Such graphs are declined: a rebuilt graph's fake run mints new
    symbols for those sizes that no node of the graph binds, and Inductor refuses the graph."""


def decline_data_dependent_sizes(gm: torch.fx.GraphModule) -> None:
    """Raise :class:`DataDependentSize` when any node's traced value holds an unbacked symbol."""
    for n in gm.graph.nodes:
        value = n.meta.get("val", n.meta.get("example_value"))
        try:
            unbacked = free_unbacked_symbols(value)
        except Exception:  # a value free_symbols cannot read (an opaque object): holds no size
            continue
        if unbacked:
            names = ", ".join(sorted(str(s) for s in unbacked))
            raise DataDependentSize(f"{n.name} has data-dependent sizes ({names})")


class PinnedSize(DeclinedGraph):
    """A graph holds a symbolic size that Dynamo's guards pin to a constant. Such graphs are
    declined (optimized as they are, i.e. not at all): Dynamo's meta writes the pinned size
    sometimes as the expression and sometimes as the constant, so shapes the rules derive
    disagree with recorded ones (egglog refuses the merge); encoded as the constant instead,
    rewrites broadcast along the pinned dim, and Inductor (torch 2.13) miscompiles an expand
    of such a dim under dynamic shapes (wrong values, seen on a random graph and reproduced
    without this optimizer: ``(-torch.chunk(x, 4, -1)[1]).expand(4, 2, 2)``)."""


def is_symbolic(size: int) -> bool:
    """Whether an encoded size is a symbolic code (concrete sizes are >= 0)."""
    return size < 0


def all_concrete(sizes: Iterable[int]) -> bool:
    """Whether no encoded size in ``sizes`` is symbolic."""
    return all(s >= 0 for s in sizes)


def static_tensor(t: torch.Tensor) -> bool:
    """Whether every size, stride and the storage offset of ``t`` is a plain int."""
    return all(type(s) is int for s in (*t.shape, *t.stride(), t.storage_offset()))


def symbolic_value(value: Any) -> bool:
    """Whether ``value`` is a SymInt or a tensor with a symbolic size, stride or offset."""
    return isinstance(value, torch.SymInt) or (isinstance(value, torch.Tensor) and not static_tensor(value))


def size_hint(size: Any) -> int | None:
    """The example value of a size (an int, or a SymInt's hint) without adding a guard
    (``int(symint)`` would specialize it); None for anything else."""
    if isinstance(size, bool):
        return None
    if isinstance(size, int):
        return size
    if isinstance(size, torch.SymInt):
        return _symint_hint(size)
    return None


def _symint_hint(size: torch.SymInt) -> int:
    """A SymInt's example value, without a guard (:data:`UNHINTED_SIZE` when it has none)."""
    from torch.fx.experimental.symbolic_shapes import optimization_hint

    return int(optimization_hint(size, fallback=UNHINTED_SIZE))


def concrete_inputs(example_inputs: Sequence[Any] | None) -> list[Any] | None:
    """Example inputs with SymInts replaced by their hints (what a run needs)."""
    if example_inputs is None:
        return None
    return [size_hint(v) if isinstance(v, torch.SymInt) else v for v in example_inputs]


@dataclass
class SymbolicSizes:
    """The size expressions of one graph, each with its code, hint and (for free symbols) a source."""

    exprs: list[sympy.Expr] = field(default_factory=list)  # code k -> expression (k = SYMBOL_BASE - code)
    hints: list[int] = field(default_factory=list)
    codes: dict[sympy.Expr, int] = field(default_factory=dict)
    # free symbol -> (placeholder, dim) holding it; dim None: a SymInt placeholder
    sources: dict[sympy.Symbol, tuple[torch.fx.Node, int | None]] = field(default_factory=dict)
    shape_env: Any = None  # Dynamo's, read from the first SymInt: proves two expressions equal

    def __bool__(self) -> bool:
        return bool(self.exprs)

    # ---------------------------------------------------------------- encoding
    def code(self, expr: sympy.Expr, hint: int) -> int:
        """The code of ``expr`` (registered with ``hint`` the first time).

        An expression Dynamo can prove equal to a known one gets that one's code (Dynamo
        writes some sizes unsimplified: ``(s0**2)//s0`` beside ``s0``); two codes for one
        size would let a derived shape differ from the recorded one. The code keeps the
        shorter expression, which is what the rebuilder writes."""
        found = self.codes.get(expr)
        if found is not None:
            return found
        for k, known in enumerate(self.exprs):
            if self.hints[k] == hint and self._provably_equal(known, expr):
                found = self.codes[expr] = SYMBOL_BASE - k
                if sympy.count_ops(expr) < sympy.count_ops(known):
                    self.exprs[k] = expr
                return found
        found = self.codes[expr] = SYMBOL_BASE - len(self.exprs)
        self.exprs.append(expr)
        self.hints.append(hint)
        return found

    def _provably_equal(self, a: sympy.Expr, b: sympy.Expr) -> bool:
        """Whether Dynamo's shape environment proves ``a == b`` for every value (no guard added)."""
        return bool(self._evaluate_static(sympy.Eq(a, b)))

    def encode(self, size: Any) -> int | None:
        """An int as it is, a SymInt as its value (when constant) or code; None otherwise."""
        if isinstance(size, bool):
            return None
        if isinstance(size, int):
            return size
        if not isinstance(size, torch.SymInt):
            return None
        constant = size.node.maybe_as_int()
        if constant is not None:
            return int(constant)
        if self.shape_env is None:
            self.shape_env = size.node.shape_env
        expr = size.node.expr
        if expr.is_number:
            return int(expr)
        if self._pinned(expr):
            raise PinnedSize(f"the symbolic size {expr} is pinned to a constant by Dynamo's guards")
        return self.code(expr, _symint_hint(size))

    def _pinned(self, expr: sympy.Expr) -> bool:
        """Whether Dynamo's guards pin ``expr`` to one value (``(s0 + 3)//4`` under
        ``Eq((s0 + 3)//4, 1)``) without replacing it by that value."""
        value = self._evaluate_static(expr)
        return value is not None and bool(value.is_number)

    def _evaluate_static(self, expr: sympy.Expr) -> sympy.Expr | None:
        """``expr`` as Dynamo's guards decide it for every value (no guard added), else None."""
        if self.shape_env is None:
            return None
        try:
            return self.shape_env._maybe_evaluate_static(expr)
        except Exception:  # a private helper of ShapeEnv: never a reason to fail
            return None

    def encode_shape(self, shape: Iterable[Any]) -> tuple[int, ...] | None:
        """A tensor shape encoded (None when some size is neither int nor SymInt)."""
        out = tuple(self.encode(s) for s in shape)
        return None if any(s is None for s in out) else out  # type: ignore[return-value]

    def note_source(self, node: torch.fx.Node, value: Any) -> None:
        """Record where the free symbols of a placeholder's value can be read at run time:
        a SymInt placeholder is the symbol itself; a tensor's dim of exactly one symbol is
        ``x.size(dim)`` (a SymInt placeholder is preferred: no node to add)."""
        if isinstance(value, torch.SymInt):
            expr = value.node.expr
            if isinstance(expr, sympy.Symbol):
                self.sources[expr] = (node, None)
            return
        for d, s in enumerate(getattr(value, "shape", ()) if isinstance(value, torch.Tensor) else ()):
            if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol):
                self.sources.setdefault(s.node.expr, (node, d))

    # ---------------------------------------------------------------- reading codes
    def expr(self, size: int) -> sympy.Expr:
        """The expression of an encoded size (a concrete size is an Integer)."""
        return self.exprs[SYMBOL_BASE - size] if is_symbolic(size) else sympy.Integer(size)

    def hint(self, size: int) -> int:
        """The example value of an encoded size (the size itself when concrete)."""
        return self.hints[SYMBOL_BASE - size] if is_symbolic(size) else size

    def hinted(self, shape: Sequence[int]) -> tuple[int, ...]:
        """A shape with every code replaced by its hint (what the cost model prices)."""
        return tuple(self.hint(s) for s in shape)

    def product(self, sizes: Sequence[int]) -> int:
        """The product of encoded sizes: an int when all are concrete, else the product's code."""
        if all_concrete(sizes):
            return math.prod(sizes)
        expr = sympy.Integer(1)
        for s in sizes:
            expr = expr * self.expr(s)
        if expr.is_number:
            return int(expr)
        return self.code(expr, math.prod(self.hint(s) for s in sizes))

    def name(self, size: int) -> str:
        """How a size reads in labels: ``16`` or ``16*s0``."""
        return str(self.expr(size))
