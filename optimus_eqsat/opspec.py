"""Op keys: how an elementwise or generic op of the term language maps back to FX.

The term language names elementwise and generic ops by a String key (``Unary
"relu" x``, ``Op1 "softmax(dim=1)" x``). The translator registers, for every
key it emits, an :class:`OpSpec` that says how to rebuild the op as an FX node:
the call kind, the target, and an argument template whose tensor operands are
:class:`Slot` placeholders. Equal ops get equal keys, so the e-graph shares them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch.fx

from optimus_eqsat.fxvocab import target_name

# Cost-model kinds of generic ops (the cost model reads them).
POINTWISE = "pointwise"
REDUCTION = "reduction"
MATMUL = "matmul"
GATHER = "gather"
OTHER = "other"
# Kinds of the grouped-linear batching terms (rewrites/batching/grouped_linear.py):
GROUPED_MATMUL = "grouped_matmul"  # the one grouped call: a launch, its work is priced in its members
GROUPED_MEMBER = "grouped_member"  # one linear riding in a grouped call: its FLOPs and bytes
PACK = "pack"  # operand packing and getitem of a grouped call: no kernel


@dataclass(frozen=True)
class Slot:
    """The i-th tensor operand of an op key's template."""

    index: int

    def __repr__(self) -> str:
        return f"${self.index}"


@dataclass(frozen=True)
class OpSpec:
    """How to emit one op key as an FX node."""

    op: str  # "call_function" or "call_method"
    target: Any
    args: tuple
    kwargs: tuple  # sorted (name, value) pairs, hashable
    kind: str = OTHER

    @property
    def arity(self) -> int:
        return len(_slots(self.args) | _slots(dict(self.kwargs)))

    def emit(self, graph: torch.fx.Graph, operands: list[torch.fx.Node], name: str | None = None) -> torch.fx.Node:
        fill = lambda v: fill_slots(v, operands)  # noqa: E731
        return graph.create_node(self.op, self.target, fill(self.args), fill(dict(self.kwargs)), name=name)


def _slots(value: Any) -> set[int]:
    if isinstance(value, Slot):
        return {value.index}
    if isinstance(value, (tuple, list)):
        return set().union(*(_slots(v) for v in value)) if value else set()
    if isinstance(value, dict):
        return _slots(tuple(value.values()))
    return set()


def fill_slots(value: Any, operands: list[torch.fx.Node]) -> Any:
    if isinstance(value, Slot):
        return operands[value.index]
    if isinstance(value, tuple):
        return tuple(fill_slots(v, operands) for v in value)
    if isinstance(value, list):
        return [fill_slots(v, operands) for v in value]
    if isinstance(value, dict):
        return {k: fill_slots(v, operands) for k, v in value.items()}
    return value


@dataclass
class OpRegistry:
    """The op keys of one translation, and their specs."""

    specs: dict[str, OpSpec] = field(default_factory=dict)
    signatures: dict[str, str] = field(default_factory=dict)  # key -> readable full signature
    _by_signature: dict[str, str] = field(default_factory=dict)

    def register(self, spec: OpSpec) -> str:
        """Key of a generic op: a short readable token, equal for equal specs."""
        name = target_name(spec.target, qualified=True)  # overloads told apart: "aten.add.Tensor"
        signature = f"{spec.op} {name}{_fmt(spec.args)}{_fmt_kwargs(spec.kwargs)}"
        key = self._by_signature.get(signature)
        if key is None:
            token = re.sub(r"[^A-Za-z0-9_.]", "_", name.split(".")[-1])
            key = f"{token}:{len(self._by_signature)}"
            self._by_signature[signature] = key
            self.specs[key] = spec
            self.signatures[key] = signature
        return key

    def add_named(self, key: str, spec: OpSpec) -> str:
        """Register a fixed key that rules match on (e.g. "add", "matmul")."""
        self.specs.setdefault(key, spec)
        self.signatures.setdefault(key, key)
        return key


def _fmt(args: tuple) -> str:
    return "(" + ", ".join(repr(a) for a in args) + ")"


def _fmt_kwargs(kwargs: tuple) -> str:
    return "" if not kwargs else "{" + ", ".join(f"{k}={v!r}" for k, v in kwargs) + "}"
