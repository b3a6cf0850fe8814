"""Sizes written back as FX arguments: concrete ints, and symbolic sizes as run-time values.

A shape in the e-graph holds codes for symbolic sizes (:mod:`.fxvocab.symbolic`).
A rebuilt reshape or expand must say the size for every batch, never the
example's: a reshape with one symbolic size gets ``-1`` (inferred from the
element count, exact when the other sizes are concrete and nonzero); an expand
keeps a symbolic size its input already has with ``-1``; any other symbolic
size is computed from the graph's inputs: its expression over the free symbols,
each read from a SymInt placeholder or as ``x.size(d)`` of a placeholder that
holds it (one node per symbol and expression, shared by all users).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, cast

import sympy
import torch
import torch.fx

from optimus_eqsat.fxvocab.symbolic import SymbolicSizes, is_symbolic

Size = Any  # an int or an FX node that computes the size


class SizeWriteError(RuntimeError):
    """A symbolic size whose expression cannot be written as FX arithmetic."""


class SizeWriter:
    """Writes encoded sizes into one rebuilt graph.

    ``placeholder(node)``: the rebuilt graph's node for an original placeholder;
    ``call(op, target, args)``: adds a freshly named node.
    """

    def __init__(
        self,
        symbols: SymbolicSizes,
        placeholder: Callable[[torch.fx.Node], torch.fx.Node],
        call: Callable[[str, Any, tuple], torch.fx.Node],
    ):
        self.symbols, self.placeholder, self.call = symbols, placeholder, call
        self.written: dict[sympy.Expr, Size] = {}

    def reshape_sizes(self, shape: Sequence[int]) -> list[Size]:
        """Arguments of a reshape to ``shape``."""
        symbolic = [k for k, s in enumerate(shape) if is_symbolic(s)]
        if len(symbolic) == 1 and all(s > 0 for s in shape if not is_symbolic(s)):
            return [-1 if is_symbolic(s) else s for s in shape]
        return [self.size(s) for s in shape]

    def expand_sizes(self, shape: Sequence[int], source: Sequence[int] | None) -> list[Size]:
        """Arguments of an expand of a tensor of shape ``source`` (None: unknown) to ``shape``:
        a symbolic size the input has at that position (aligned right) stays as it is (-1)."""
        offset = len(shape) - len(source) if source is not None else None
        out: list[Size] = []
        for k, s in enumerate(shape):
            kept = offset is not None and k >= offset and cast("Sequence[int]", source)[k - offset] == s
            out.append(-1 if is_symbolic(s) and kept else self.size(s))
        return out

    def size(self, size: int) -> Size:
        """One encoded size: itself when concrete, else a node computing it."""
        return self._expr(self.symbols.expr(size)) if is_symbolic(size) else size

    def _expr(self, expr: sympy.Expr) -> Size:
        if expr.is_Integer:
            return int(expr)
        if expr in self.written:
            return self.written[expr]
        if isinstance(expr, sympy.Symbol):
            value = self._symbol(expr)
        elif isinstance(expr, (sympy.Add, sympy.Mul)):
            op = operator.add if isinstance(expr, sympy.Add) else operator.mul
            args = sorted(expr.args, key=lambda a: not a.is_Integer)  # Mul(16, s0) -> s0 * 16
            value = self._expr(args[-1])
            for arg in args[:-1]:
                value = self.call("call_function", op, (value, self._expr(arg)))
        elif isinstance(expr, sympy.Pow) and expr.exp.is_Integer and 1 < int(expr.exp) <= 8:
            base = value = self._expr(expr.base)  # s0**2 (a flattened square): s0 * s0
            for _ in range(int(expr.exp) - 1):
                value = self.call("call_function", operator.mul, (value, base))
        elif type(expr).__name__ in ("FloorDiv", "CleanDiv"):  # torch.utils._sympy.functions
            value = self.call("call_function", operator.floordiv, (self._expr(expr.args[0]), self._expr(expr.args[1])))
        else:
            raise SizeWriteError(f"cannot write the size {expr} ({type(expr).__name__}) as FX")
        self.written[expr] = value
        return value

    def _symbol(self, symbol: sympy.Symbol) -> Size:
        source = self.symbols.sources.get(symbol)
        if source is None:
            raise SizeWriteError(f"no graph input holds the size {symbol}")
        node, dim = source
        new = self.placeholder(node)
        return new if dim is None else self.call("call_method", "size", (new, dim))
