"""Batching (horizontal fusion): one batched alternative per group of same-shaped ops.

Batching is a multi-pattern over n independent nodes, so it is not an egglog
rule (pairwise merges would build n^2 terms, subsets 2^n). Instead, after the
first saturation, candidates are grouped by a fusion key (op, operand shapes,
constants, dtype), then split greedily into groups whose members do not
depend on each other (a bitset of candidate ancestors per node), so a group
never builds a cycle through its own members. Each
group gains one batched term over stacked operands, and each member is
unioned with its slice of that term. Saturation then runs again: the stacks
cancel against surrounding splits and cats (a stack of slices of one tensor
is a view of it), and the extractor decides whether the batched program pays.

Covers Inductor's group_batch_fusion.py (OPTIMUS_PATTERNS.md):
  batch_linear (22, 27)        same-shaped linears  -> one bmm over stacked operands
  batch_linear_lhs (23)        linears sharing one input -> one linear on concatenated weights (any widths)
  batch_layernorm (24)         same layer_norm      -> one layer_norm, stacked affine
  batch_tanh/sigmoid/relu (25, 30), batch_detach/nan_to_num/clamp/dropout (26),
  batch_aten_add/sub/mul/div (29): any elementwise op (Unary/Scalar/Binary) of equal shapes
"""

from __future__ import annotations

import inspect
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..opspec import MATMUL, POINTWISE, REDUCTION, OpSpec, Slot
from ..terms import cons_list, vec
from ..translate import Translation

MIN_GROUP = 2  # the cost model, not a threshold, decides whether a group pays

_TERM = re.compile(r'^\((Unary|Binary|Scalar|Op1|Op2|Op3) "([^"]+)" ((?:\(Id \d+\) ?)+)([-+\w.]*)\)$')
_ID = re.compile(r"\(Id (\d+)\)")


@dataclass(frozen=True)
class Candidate:
    """One FX node that could join a batch."""

    node: int
    ctor: str
    key: str
    operands: tuple[int, ...]
    scalar: str  # the Scalar constructor's constant, as written


def parse_candidate(i: int, term: str) -> Candidate | None:
    match = _TERM.match(term)
    if match is None:
        return None
    ctor, key, ids, scalar = match.groups()
    return Candidate(i, ctor, key, tuple(int(x) for x in _ID.findall(ids)), scalar)


def candidate_ancestors(t: Translation, candidates: set[int]) -> dict[int, int]:
    """For every candidate, a bitset (Python int) of the candidates it depends on.

    One pass in graph order (which is topological); bits are candidate indices.
    Big-int ORs keep this fast for thousands of candidates.
    """
    index = t.index
    bit = {i: 1 << k for k, i in enumerate(sorted(candidates))}
    below: dict[int, int] = {}
    for i, node in enumerate(t.gm.graph.nodes):
        mask = 0
        for a in node.all_input_nodes:
            j = index[a]
            mask |= below[j] | bit.get(j, 0)
        below[i] = mask
    return {i: below[i] for i in candidates} | {-(i + 1): bit[i] for i in candidates}


def independent_groups(members: list[Candidate], ancestors: dict[int, int]) -> list[list[Candidate]]:
    """Split same-key candidates into groups with no dependency inside a group.

    Greedy in graph order: a candidate joins the first group none of whose
    members it depends on (later candidates cannot be ancestors of earlier ones).
    """
    groups: list[tuple[int, list[Candidate]]] = []
    for c in sorted(members, key=lambda c: c.node):
        mine, deps = ancestors[-(c.node + 1)], ancestors[c.node]
        for k, (mask, group) in enumerate(groups):
            if not deps & mask:
                group.append(c)
                groups[k] = (mask | mine, group)
                break
        else:
            groups.append((mine, [c]))
    return [group for _, group in groups]


class BatchBuilder:
    """Writes the facts of batched alternatives, with fresh ids for new terms."""

    def __init__(self, t: Translation):
        self.t = t
        self.facts: list[str] = []
        self.outputs: list[int] = []  # ids of the batched terms, one per group
        self.groups: list[tuple[int, list[int]]] = []  # (batched term id, member node ids)

    def new(self, term: str, shape: tuple[int, ...] | None = None) -> str:
        """Name ``term`` by a fresh id; give it a shape when rules cannot derive it."""
        i = self.t.next_id
        self.t.next_id += 1
        self.facts.append(f"(union (Id {i}) {term})")
        if shape is not None:
            self.facts.append(f"(set (shape (Id {i})) {vec(shape)})")
        return f"(Id {i})"

    def stack(self, ids: list[int], rank: int) -> tuple[str, tuple[int, ...]]:
        """torch.stack of the operands at dim 0, each first padded on the left to ``rank``."""
        items, shape = [], None
        for i in ids:
            s = self.t.shapes[i]
            padded = (1,) * (rank - len(s)) + s
            items.append(f"(Reshape (Id {i}) {vec((1,) + padded)})")
            shape = padded
        return self.new(f"(Cat {cons_list(items, 0, self.facts.append, self.t.new_list_id)})"), (len(ids),) + shape

    def unstack(self, batched: str, members: list[int]) -> None:
        self.outputs.append(int(_ID.match(batched).group(1)))
        self.groups.append((self.outputs[-1], list(members)))
        for k, m in enumerate(members):
            self.facts.append(f"(union (Id {m}) (Reshape (Slice {batched} 0 {k} {k + 1}) {vec(self.t.shapes[m])}))")


def _shapes_known(t: Translation, c: Candidate) -> bool:
    return c.node in t.shapes and all(o in t.shapes for o in c.operands)


def _layer_norm_args(spec: OpSpec) -> dict[str, Any] | None:
    if spec.target is not F.layer_norm:
        return None
    try:
        bound = inspect.signature(F.layer_norm).bind(*spec.args, **dict(spec.kwargs))
    except TypeError:
        return None
    bound.apply_defaults()
    return dict(bound.arguments)


def fusion_key(t: Translation, c: Candidate) -> tuple | None:
    """Nodes with equal keys may be batched together; None: not batchable."""
    if not _shapes_known(t, c):
        return None
    shapes = tuple(t.shapes[o] for o in c.operands)
    dtype = t.dtypes.get(c.node)
    spec = t.registry.specs.get(c.key)
    if c.ctor in ("Unary", "Scalar", "Binary") and spec is not None and spec.kind == POINTWISE:
        return (c.ctor, c.key, shapes, c.scalar, dtype)
    if c.key in ("linear", "linear_b") and len(t.shapes[c.operands[1]]) == 2:
        return ("linear", c.key, shapes, dtype)
    if spec is not None and _layer_norm_args(spec) is not None:
        return ("layer_norm", c.key, shapes, dtype)
    return None


def lhs_fusion_key(t: Translation, c: Candidate) -> tuple | None:
    """Linears reading the same input (any output width) may share one matmul."""
    if c.key in ("linear", "linear_b") and _shapes_known(t, c) and len(t.shapes[c.operands[1]]) == 2:
        return ("linear_lhs", c.key, c.operands[0], t.dtypes.get(c.node))
    return None


def _batch_elementwise(b: BatchBuilder, group: list[Candidate]) -> None:
    c0 = group[0]
    rank = len(b.t.shapes[c0.node])
    stacks = [b.stack([c.operands[k] for c in group], rank)[0] for k in range(len(c0.operands))]
    out = (len(group),) + b.t.shapes[c0.node]
    if c0.ctor == "Scalar":
        batched = b.new(f"(Scalar \"{c0.key}\" {stacks[0]} {c0.scalar})")
    else:
        batched = b.new(f"({c0.ctor} \"{c0.key}\" {' '.join(stacks)})", out)
    b.unstack(batched, [c.node for c in group])


def _batch_linear(b: BatchBuilder, group: list[Candidate]) -> None:
    """linear_i(x_i, w_i, b_i) -> bmm(stack(x), stack(w)^T) + stack(b): one extern kernel."""
    t, c0 = b.t, group[0]
    x_shape, (n_out, k) = t.shapes[c0.operands[0]], t.shapes[c0.operands[1]]
    m = math.prod(x_shape[:-1])
    xs = [b.new(f"(Reshape (Id {c.operands[0]}) {vec((m, k))})") for c in group]
    # stack() reads operand shapes from the translation; the 2-D views get theirs here
    x_ids = [int(_ID.match(x).group(1)) for x in xs]
    for x_id in x_ids:
        t.shapes[x_id] = (m, k)
    stacked_x, _ = b.stack(x_ids, 2)
    stacked_w, _ = b.stack([c.operands[1] for c in group], 2)
    n = len(group)
    mm = t.registry.add_named("matmul", OpSpec("call_function", torch.matmul, (Slot(0), Slot(1)), (), MATMUL))
    y = b.new(f"(Op2 \"{mm}\" {stacked_x} (Permute {stacked_w} (vec-of 0 2 1)))", (n, m, n_out))
    if c0.key == "linear_b":
        stacked_b, _ = b.stack([c.operands[2] for c in group], 2)  # [n, 1, N]
        add = t.registry.add_named("add", OpSpec("call_function", torch.add, (Slot(0), Slot(1)), (), POINTWISE))
        y = b.new(f"(Binary \"{add}\" {y} {stacked_b})", (n, m, n_out))
    b.unstack(y, [c.node for c in group])


def _batch_layer_norm(b: BatchBuilder, group: list[Candidate]) -> None:
    """layer_norm_i -> one layer_norm without affine over the stack, then stacked scale and shift."""
    t, c0 = b.t, group[0]
    args = _layer_norm_args(t.registry.specs[c0.key])
    plain = t.registry.register(OpSpec("call_function", F.layer_norm,
                                       (Slot(0), tuple(args["normalized_shape"]), None, None, args["eps"]), (),
                                       REDUCTION))
    rank = len(t.shapes[c0.node])
    stacked_x, out = b.stack([c.operands[0] for c in group], rank)
    y = b.new(f"(Op1 \"{plain}\" {stacked_x})", out)
    named = {"mul": torch.mul, "add": torch.add}
    for slot, op in ((args["weight"], "mul"), (args["bias"], "add")):
        if isinstance(slot, Slot):
            key = t.registry.add_named(op, OpSpec("call_function", named[op], (Slot(0), Slot(1)), (), POINTWISE))
            stacked, _ = b.stack([c.operands[slot.index] for c in group], rank)
            y = b.new(f"(Binary \"{key}\" {y} {stacked})", out)
    b.unstack(y, [c.node for c in group])


def _batch_linear_lhs(b: BatchBuilder, group: list[Candidate]) -> None:
    """linear(x, w_i, b_i) -> linear(x, cat(w), cat(b)) sliced along the last dim: one kernel."""
    t, c0 = b.t, group[0]
    x = c0.operands[0]
    widths = [t.shapes[c.operands[1]][0] for c in group]
    weights = [f"(Id {c.operands[1]})" for c in group]
    w = b.new(f"(Cat {cons_list(weights, 0, b.facts.append, b.t.new_list_id)})")
    out_shape = t.shapes[x][:-1] + (sum(widths),)
    if c0.key == "linear_b":
        biases = [f"(Id {c.operands[2]})" for c in group]
        bias = b.new(f"(Cat {cons_list(biases, 0, b.facts.append, b.t.new_list_id)})")
        y = b.new(f"(Op3 \"{c0.key}\" (Id {x}) {w} {bias})", out_shape)
    else:
        y = b.new(f"(Op2 \"{c0.key}\" (Id {x}) {w})", out_shape)
    b.outputs.append(int(_ID.match(y).group(1)))
    b.groups.append((b.outputs[-1], [c.node for c in group]))
    last, start = len(out_shape) - 1, 0
    for c, width in zip(group, widths):
        b.facts.append(f"(union (Id {c.node}) (Slice {y} {last} {start} {start + width}))")
        start += width


_BUILDERS = {"linear": _batch_linear, "layer_norm": _batch_layer_norm, "linear_lhs": _batch_linear_lhs}


@dataclass
class Batches:
    """What batching added: the facts, members per kind, and the batched terms' ids per kind."""

    facts: list[str]
    members: dict[str, int]
    outputs: dict[str, list[int]]
    groups: list[tuple[int, list[int]]]  # (batched term id, member node ids)


def batch_facts(t: Translation) -> Batches:
    """Facts adding one batched alternative per group, with what they batch."""
    keyed: dict[tuple, list[Candidate]] = defaultdict(list)
    for i, term in t.terms.items():
        candidate = parse_candidate(i, term)
        if candidate is None:
            continue
        for key_of in (fusion_key, lhs_fusion_key):
            key = key_of(t, candidate)
            if key is not None:
                keyed[key].append(candidate)
    keyed = {k: v for k, v in keyed.items() if len(v) >= MIN_GROUP}
    ancestors = candidate_ancestors(t, {c.node for members in keyed.values() for c in members})
    builder = BatchBuilder(t)
    stats: dict[str, int] = defaultdict(int)
    outputs: dict[str, list[int]] = defaultdict(list)
    for key, members in keyed.items():
        kind = key[0] if key[0] in _BUILDERS else "elementwise"
        for group in independent_groups(members, ancestors):
            if len(group) >= MIN_GROUP:
                _BUILDERS.get(kind, _batch_elementwise)(builder, group)
                stats[f"batch-{kind}"] += len(group)
                outputs[f"batch-{kind}"].append(builder.outputs[-1])
    return Batches(builder.facts, dict(stats), dict(outputs), builder.groups)
