"""The op keys with a fixed meaning: the one table the translator, the rules, batching, the
rule checker and the explorer read.

Most op keys of the term language are made from the FX op they stand for (``"relu"``,
``"softmax(dim=1)"``); the keys below are the ones rules and batch kinds match on by name
(``(Op2 "linear" x w)`` in ``rewrites/algebraic.egg``). Each says what the translator emits it
for and how the rebuilder calls it: its target, operand count and cost-model kind. A rule
file may name only these (``tests/test_op_keys.py`` reads every ``.egg`` for it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from optimus_eqsat.opspec import MATMUL, POINTWISE

# Elementwise arithmetic: Binary (tensor, tensor) and Scalar (tensor, constant).
ADD, SUB, MUL, DIV, POW, MAXIMUM, MINIMUM = "add", "sub", "mul", "div", "pow", "maximum", "minimum"
# Scalar only: constant - x, constant / x, constant ** x (the rebuilder writes them reversed).
RSUB, RDIV, RPOW = "rsub", "rdiv", "rpow"
NEG = "neg"  # Unary: a plain negation
MATMUL_KEY = "matmul"  # Op2: torch.matmul
LINEAR, LINEAR_B = "linear", "linear_b"  # Op2 linear(x, w) and Op3 linear(x, w, b)


@dataclass(frozen=True)
class KeyedOp:
    """How the rebuilder writes an op key: ``target`` called on ``n_operands`` operands (a
    reversed Scalar's target is its key: the rebuilder swaps the operands), priced as ``kind``."""

    target: Callable | str
    n_operands: int
    kind: str

    def spec(self) -> tuple[Any, int, str]:
        return self.target, self.n_operands, self.kind


_ARITHMETIC: dict[str, Callable] = {ADD: torch.add, SUB: torch.sub, MUL: torch.mul, DIV: torch.div, POW: torch.pow}
_ARITHMETIC |= {MAXIMUM: torch.maximum, MINIMUM: torch.minimum}

OP_KEYS: dict[str, KeyedOp] = {
    **{key: KeyedOp(target, 2, POINTWISE) for key, target in _ARITHMETIC.items()},
    RSUB: KeyedOp(torch.rsub, 2, POINTWISE),
    RDIV: KeyedOp(RDIV, 2, POINTWISE),
    RPOW: KeyedOp(RPOW, 2, POINTWISE),
    NEG: KeyedOp(torch.neg, 1, POINTWISE),
    MATMUL_KEY: KeyedOp(torch.matmul, 2, MATMUL),
    LINEAR: KeyedOp(F.linear, 2, MATMUL),
    LINEAR_B: KeyedOp(F.linear, 3, MATMUL),
}

BINARY_KEYS = tuple(_ARITHMETIC)  # keys a Binary term takes (tensor op tensor)
SCALAR_KEYS = (*BINARY_KEYS, RSUB, RDIV, RPOW)  # keys a Scalar term takes (tensor op constant)
LINEAR_KEYS = (LINEAR, LINEAR_B)
