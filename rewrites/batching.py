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
Runs of other groups' members and of evenly spaced slices are stacked as views
from the start, and every cat of such runs gains a view-built alternative
(batch_views.py); groups are built in dependency order for that (build_order).

Covers Inductor's group_batch_fusion.py (OPTIMUS_PATTERNS.md):
  batch_linear (22, 27)        same-shaped linears  -> one bmm over stacked operands
  batch_linear_lhs (23)        linears sharing one input -> one linear on concatenated weights (any widths)
  batch_layernorm (24)         same layer_norm      -> one layer_norm, stacked affine
  batch_tanh/sigmoid/relu (25, 30), batch_detach/nan_to_num/clamp/dropout (26),
  batch_aten_add/sub/mul/div (29): any elementwise op (Unary/Scalar/Binary) of equal shapes
  group_linear (28)            linears of any shapes (one dtype) -> one optimus_eqsat::grouped_linear
                               call (Triton grouped GEMM on CUDA, no fbgemm); members are getitems
  (not in Inductor)            plain embedding lookups into tables of one width and dtype -> one
                               lookup into the row-concatenated tables with shifted indices
  (not in Inductor)            linears of one output width and any input widths -> one bmm over
                               inputs and weights zero-padded to the widest input (padk)

A linear is a candidate for several kinds at once (bmm, padk, lhs, group_linear): every
alternative is unioned with it and the cost model picks. group_linear is one
extern launch on GPU profiles, but its host time (measured on an H200: 0.3 ms a
call plus 17 us a member) exceeds the launches it saves, and on the CPU profile
it runs one F.linear per member; so it is only built where
``group_linear_can_pay`` under the profile (a cheap-host profile, in tests).
Same-shaped linears whose stacks are free take the bmm.
"""

from __future__ import annotations

import inspect
import math
import operator
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import networkx as nx
import torch
import torch.nn.functional as F

from ..kernels.grouped_linear import grouped_linear
from ..opspec import GATHER, GROUPED_MATMUL, GROUPED_MEMBER, MATMUL, PACK, POINTWISE, REDUCTION, OpSpec, Slot
from ..terms import cons_list, vec
from ..translate import Translation
from .batch_views import cat_alternatives, make_item, stack_terms

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


def build_order(groups: list[list[Candidate]]) -> list[int]:
    """Indices of ``groups`` with every group after the groups whose members it reads,
    so its operand stacks can be views of their batched terms (batch_views.py).

    Groups can read each other both ways (then the order inside that strongly
    connected set is by last member); ties go to the group whose last member comes first.
    """
    owners: dict[int, list[int]] = defaultdict(list)
    for g, group in enumerate(groups):
        for c in group:
            owners[c.node].append(g)
    reads = nx.DiGraph()
    reads.add_nodes_from(range(len(groups)))
    reads.add_edges_from((h, g) for g, group in enumerate(groups) for c in group for o in c.operands
                         for h in owners.get(o, ()) if h != g)
    last = [group[-1].node for group in groups]
    dag = nx.condensation(reads)
    members = nx.get_node_attributes(dag, "members")
    order: list[int] = []
    for scc in nx.lexicographical_topological_sort(dag, key=lambda s: min(last[g] for g in members[s])):
        order.extend(sorted(members[scc], key=lambda g: last[g]))
    return order


class BatchBuilder:
    """Writes the facts of batched alternatives, with fresh ids for new terms."""

    def __init__(self, t: Translation):
        self.t = t
        self.facts: list[str] = []
        self.outputs: list[int] = []  # ids of the batched terms, one per group
        self.groups: list[tuple[int, list[int]]] = []  # (batched term id, member node ids)
        # member node id -> (batched term, position): chained groups read the previous
        # batched term directly instead of stacking its slices again
        self.slot_of: dict[int, tuple[str, int]] = {}

    def new(self, term: str, shape: tuple[int, ...] | None = None) -> str:
        """Name ``term`` by a fresh id; give it a shape when rules cannot derive it."""
        i = self.t.next_id
        self.t.next_id += 1
        self.facts.append(f"(union (Id {i}) {term})")
        if shape is not None:
            self.facts.append(f"(set (shape (Id {i})) {vec(shape)})")
        return f"(Id {i})"

    def stack(self, ids: list[int], rank: int) -> tuple[str, tuple[int, ...]]:
        """torch.stack of the operands at dim 0, each first padded on the left to ``rank``.

        Runs of earlier groups' members and of evenly spaced slices are stacked as views
        (batch_views.py): no list of n cells to build, and no copy per operand.
        """
        shapes = [(1,) * (rank - len(self.t.shapes[i])) + self.t.shapes[i] for i in ids]
        items = [make_item(self.t, f"(Id {i})", self.slot_of, s) for i, s in zip(ids, shapes)]
        first, *others = stack_terms(self.t, items, self.facts.append)
        stacked = self.new(first)
        self.facts.extend(f"(union {stacked} {term})" for term in others)
        return stacked, (len(ids),) + shapes[0]

    def record(self, batched: str, members: list[int]) -> None:
        """Note a group's batched term ``(Id k)`` and its member nodes."""
        self.outputs.append(int(_ID.match(batched).group(1)))
        self.groups.append((self.outputs[-1], list(members)))

    def unstack(self, batched: str, members: list[int]) -> None:
        self.record(batched, members)
        for k, m in enumerate(members):
            self.facts.append(f"(union (Id {m}) (Reshape (Slice {batched} 0 {k} {k + 1}) {vec(self.t.shapes[m])}))")
            self.slot_of[m] = (batched, k)


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
    x_shape, k = t.shapes[c0.operands[0]], t.shapes[c0.operands[1]][1]
    stacked, _ = b.stack([c.operands[0] for c in group], len(x_shape))
    stacked_x = b.new(f"(Reshape {stacked} {vec((len(group), math.prod(x_shape[:-1]), k))})")  # [n, m, k]
    _stacked_linear(b, group, stacked_x, b.stack([c.operands[1] for c in group], 2)[0])


def _stacked_linear(b: BatchBuilder, group: list[Candidate], stacked_x: str, stacked_w: str) -> None:
    """The group's linears as one bmm of ``stacked_x`` [n, m, k] by ``stacked_w`` [n, N, k]
    transposed, plus the stacked biases; each member is its slice of the result."""
    t, c0 = b.t, group[0]
    n, m, n_out = len(group), math.prod(t.shapes[c0.operands[0]][:-1]), t.shapes[c0.operands[1]][0]
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


def padk_fusion_key(t: Translation, c: Candidate) -> tuple | None:
    """Linears of one output width and batch shape but any input width K may share one
    bmm over inputs and weights zero-padded along K to the widest. Optimus' batch_linear
    needs equal shapes, and on CPU group_linear is a loop: this is what makes the ragged
    feature projections of a dynamic-schema model one kernel."""
    if c.key in ("linear", "linear_b") and _shapes_known(t, c) and len(t.shapes[c.operands[1]]) == 2:
        x_shape, (n_out, _) = t.shapes[c.operands[0]], t.shapes[c.operands[1]]
        return ("linear_padk", c.key, x_shape[:-1], n_out, t.dtypes.get(c.node))
    return None


def _batch_linear_padk(b: BatchBuilder, group: list[Candidate]) -> None:
    """linear_i(x_i, w_i, b_i), K_i ragged -> bmm(cat(pad(stack(x))), cat(pad(stack(w)))^T) + stack(b).

    Members are ordered by K, then graph order, so each width class stacks as a run (a
    view of its batched producer) and is padded once. Zero columns of x meet zero columns
    of w, so every product is unchanged. Groups of one width are left to _batch_linear.
    """
    t = b.t
    ks = {c.node: t.shapes[c.operands[1]][1] for c in group}
    if len(set(ks.values())) < 2:
        return
    kmax = max(ks.values())
    group = sorted(group, key=lambda c: (ks[c.node], c.node))
    lead = t.shapes[group[0].operands[0]][:-1]
    m = math.prod(lead)
    classes: dict[int, list[Candidate]] = defaultdict(list)
    for c in group:
        classes[ks[c.node]].append(c)

    def padded(stacked: str, shape: tuple[int, ...]) -> str:
        if shape[-1] == kmax:
            return stacked
        pad = t.registry.register(OpSpec("call_function", F.pad, (Slot(0), (0, kmax - shape[-1])), (), POINTWISE))
        return b.new(f"(Op1 \"{pad}\" {stacked})", shape[:-1] + (kmax,))

    xs, ws = [], []
    for k, members in classes.items():
        sx, _ = b.stack([c.operands[0] for c in members], len(lead) + 1)
        xs.append(padded(b.new(f"(Reshape {sx} {vec((len(members), m, k))})"), (len(members), m, k)))
        sw, shape_w = b.stack([c.operands[1] for c in members], 2)
        ws.append(padded(sw, shape_w))
    counts = [len(members) for members in classes.values()]
    n_out = t.shapes[group[0].operands[1]][0]
    stacked_x = b.new(f"(Cat {cons_list(xs, 0, b.facts.append, t.new_list_id, counts)})", (len(group), m, kmax))
    stacked_w = b.new(f"(Cat {cons_list(ws, 0, b.facts.append, t.new_list_id, counts)})", (len(group), n_out, kmax))
    _stacked_linear(b, group, stacked_x, stacked_w)


def _batch_linear_lhs(b: BatchBuilder, group: list[Candidate]) -> None:
    """linear(x, w_i, b_i) -> linear(x, cat(w), cat(b)) sliced along the last dim: one kernel."""
    t, c0 = b.t, group[0]
    x = c0.operands[0]
    widths = [t.shapes[c.operands[1]][0] for c in group]
    weights = [f"(Id {c.operands[1]})" for c in group]
    w = b.new(f"(Cat {cons_list(weights, 0, b.facts.append, b.t.new_list_id, widths)})")
    out_shape = t.shapes[x][:-1] + (sum(widths),)
    if c0.key == "linear_b":
        biases = [f"(Id {c.operands[2]})" for c in group]
        bias = b.new(f"(Cat {cons_list(biases, 0, b.facts.append, b.t.new_list_id, widths)})")
        y = b.new(f"(Op3 \"{c0.key}\" (Id {x}) {w} {bias})", out_shape)
    else:
        y = b.new(f"(Op2 \"{c0.key}\" (Id {x}) {w})", out_shape)
    b.record(y, [c.node for c in group])
    last, start = len(out_shape) - 1, 0
    for c, width in zip(group, widths):
        b.facts.append(f"(union (Id {c.node}) (Slice {y} {last} {start} {start + width}))")
        start += width


# ---------------------------------------------------------------- group_linear
# Linears of any shapes -> one grouped-GEMM call. The term language has only
# fixed-arity ops (Op1-Op3), so the call's 3N operands travel in a chain of
# packing terms that no rule matches and no kernel runs:
#     item_i = Op2 "gl_item" x_i w_i | Op3 "gl_item_b" x_i w_i b_i
#     chain  = Op1 "gl_list" item_1, then Op2 "gl_cons" chain item_i
#     call   = Op1 "grouped_linear" chain           (a Python list of N tensors)
#     y_i    = Op1 "gl_get:i" call                   (operator.getitem: a view)
# The call's OpSpec emits ``grouped_linear([x..], [w..], [b..])`` straight from the
# chain's operands and erases the chain's FX nodes, so the rebuilt graph holds one
# call and N getitems, just as hand-written code would. Members are getitems of
# a list rather than slices of one concatenated tensor: concatenating would cost
# a copy of every output (the kernel writes N separate buffers), and a flat
# tensor would need equal leading dims. The price: rules cannot see through the
# call (its outputs are only getitems), which is fine, nothing simplifies there.


def _gl_item(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> tuple:
    """One member's operands (packing only; erased when the grouped call is emitted)."""
    return (x, w, b)


def _gl_list(item: tuple) -> list:
    return [item]


def _gl_cons(items: list, item: tuple) -> list:
    return [*items, item]


def grouped_linear_packed(items: list) -> list[torch.Tensor]:
    """The grouped call on packed operands (what a chain left in a graph computes)."""
    return grouped_linear([i[0] for i in items], [i[1] for i in items], [i[2] for i in items])


@dataclass(frozen=True)
class GroupedLinearSpec(OpSpec):
    """Emits the grouped call from the packing chain's operands, then drops the chain."""

    def emit(self, graph: torch.fx.Graph, operands: list[torch.fx.Node], name: str | None = None) -> torch.fx.Node:
        chain, node, items = [], operands[0], []
        while node.op == "call_function" and node.target is _gl_cons:
            chain.append(node)
            items.append(node.args[1])
            node = node.args[0]
        if not (node.op == "call_function" and node.target is _gl_list):
            return graph.call_function(grouped_linear_packed, (operands[0],), name=name)  # not a chain: still correct
        chain.append(node)
        items.append(node.args[0])
        items.reverse()
        if not all(i.op == "call_function" and i.target is _gl_item for i in items):
            return graph.call_function(grouped_linear_packed, (operands[0],), name=name)
        xs = [i.args[0] for i in items]
        ws = [i.args[1] for i in items]
        bs = [i.args[2] if len(i.args) > 2 else None for i in items]
        new = graph.call_function(grouped_linear, (xs, ws, bs), name=name)
        for dead in [*chain, *dict.fromkeys(items)]:  # last link first: each is then unused
            if not dead.users:
                graph.erase_node(dead)
        return new


def group_linear_key(t: Translation, c: Candidate) -> tuple | None:
    """Linears of any shapes (same dtype) may share one grouped-GEMM call."""
    if c.key in ("linear", "linear_b") and _shapes_known(t, c) and len(t.shapes[c.operands[1]]) == 2:
        dtype = t.dtypes.get(c.node)
        if dtype is not None and all(t.dtypes.get(o) == dtype for o in c.operands):
            return ("group_linear", dtype)
    return None


def _group_linear(b: BatchBuilder, group: list[Candidate]) -> None:
    """linear_i(x_i, w_i, b_i) -> getitem(grouped_linear(xs, ws, bs), i): one extern call on GPUs."""
    reg = b.t.registry
    item = reg.add_named("gl_item", OpSpec("call_function", _gl_item, (Slot(0), Slot(1)), (), GROUPED_MEMBER))
    item_b = reg.add_named("gl_item_b", OpSpec("call_function", _gl_item, (Slot(0), Slot(1), Slot(2)), (),
                                               GROUPED_MEMBER))
    first = reg.add_named("gl_list", OpSpec("call_function", _gl_list, (Slot(0),), (), PACK))
    cons = reg.add_named("gl_cons", OpSpec("call_function", _gl_cons, (Slot(0), Slot(1)), (), PACK))
    call = reg.add_named("grouped_linear", GroupedLinearSpec("call_function", grouped_linear_packed, (Slot(0),), (),
                                                             GROUPED_MATMUL))
    chain = None
    for c in group:
        ids = " ".join(f"(Id {o})" for o in c.operands)
        packed = b.new(f"(Op3 \"{item_b}\" {ids})" if c.key == "linear_b" else f"(Op2 \"{item}\" {ids})")
        chain = b.new(f"(Op1 \"{first}\" {packed})" if chain is None else f"(Op2 \"{cons}\" {chain} {packed})")
    y = b.new(f"(Op1 \"{call}\" {chain})")
    b.record(y, [c.node for c in group])
    for k, c in enumerate(group):
        get = reg.add_named(f"gl_get:{k}", OpSpec("call_function", operator.getitem, (Slot(0), k), (), PACK))
        b.facts.append(f"(union (Id {c.node}) (Op1 \"{get}\" {y}))")


# ---------------------------------------------------------------- embedding
# Lookups into tables of one width -> one lookup into the tables concatenated
# along rows, with each table's indices shifted by its first row (the indices
# are concatenated first and shifted by one elementwise op, shift_segments, so
# the shift is one kernel however many tables; an Op1, never a Unary: it depends
# on the position, so it must not be pushed into the cat's members). Only plain
# lookups: padding_idx (it masks one row's gradient), max_norm (it renormalizes
# the table in place), scale_grad_by_freq, sparse gradients and per-sample
# weights keep their own lookup. Valid for in-range indices; an out-of-range or
# negative index, an error in the original, would read a neighbouring table.

_ATEN_EMBEDDING = ("weight", "input", "padding_idx", "scale_grad_by_freq", "sparse")


def _embedding_slots(spec: OpSpec) -> tuple[int, int] | None:
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
        a = {"padding_idx": -1, "scale_grad_by_freq": False, "sparse": False,
             **dict(zip(_ATEN_EMBEDDING, spec.args)), **kwargs}
        plain = a["padding_idx"] in (-1, None)
    else:
        return None
    if not plain or a["scale_grad_by_freq"] or a["sparse"]:
        return None
    idx, table = a["input"], a["weight"]
    if not (isinstance(idx, Slot) and isinstance(table, Slot)) or spec.arity != 2:
        return None
    return idx.index, table.index


def embedding_key(t: Translation, c: Candidate) -> tuple | None:
    """Plain lookups into 2-D tables of one width and dtype (indices of one dtype)."""
    spec = t.registry.specs.get(c.key)
    if c.ctor != "Op2" or spec is None or not _shapes_known(t, c):
        return None
    slots = _embedding_slots(spec)
    if slots is None:
        return None
    idx, table = (c.operands[s] for s in slots)
    idx_dtype, table_shape = t.dtypes.get(idx), t.shapes[table]
    if idx_dtype not in (torch.int64, torch.int32) or len(table_shape) != 2 or t.dtypes.get(table) is None:
        return None
    return ("embedding", table_shape[1], t.dtypes[table], idx_dtype)


def shift_segments(idx: torch.Tensor, starts: tuple[int, ...], rows: tuple[int, ...]) -> torch.Tensor:
    """Flat indices of tables laid end to end: position p in segment s (segments start at
    ``starts``, ``starts[0] == 0``) gets ``sum(rows[:s])`` added. One elementwise kernel under
    Inductor (a comparison per boundary), so the index shift of all tables costs one kernel."""
    pos = torch.arange(idx.numel(), device=idx.device)
    out = idx
    for start, previous in zip(starts[1:], rows[:-1]):  # past each boundary, skip the table before it
        out = out + (pos >= start).to(idx.dtype) * previous
    return out


def _batch_embedding(b: BatchBuilder, group: list[Candidate]) -> None:
    """embedding(idx_i, W_i) -> rows of embedding(shift(cat(idx_i)), cat(W_i))."""
    t = b.t
    slots = [_embedding_slots(t.registry.specs[c.key]) for c in group]
    idxs = [c.operands[s[0]] for c, s in zip(group, slots)]
    tables = [c.operands[s[1]] for c, s in zip(group, slots)]
    rows = tuple(t.shapes[w][0] for w in tables)
    if t.dtypes[idxs[0]] == torch.int32 and sum(rows) >= 2**31:
        return  # shifted indices would overflow
    counts = [math.prod(t.shapes[idx]) for idx in idxs]
    starts = tuple(sum(counts[:k]) for k in range(len(counts)))
    width, total = t.shapes[tables[0]][1], sum(counts)
    flat = [f"(Reshape (Id {idx}) {vec((n,))})" for idx, n in zip(idxs, counts)]
    cat = b.new(f"(Cat {cons_list(flat, 0, b.facts.append, t.new_list_id, counts)})", (total,))
    shift = t.registry.register(OpSpec("call_function", shift_segments, (Slot(0), starts, rows), (), POINTWISE))
    indices = b.new(f"(Op1 \"{shift}\" {cat})", (total,))
    weights = [f"(Id {w})" for w in tables]
    table = b.new(f"(Cat {cons_list(weights, 0, b.facts.append, t.new_list_id, rows)})", (sum(rows), width))
    lookup = t.registry.register(OpSpec("call_function", F.embedding, (Slot(0), Slot(1)), (), GATHER))
    y = b.new(f"(Op2 \"{lookup}\" {indices} {table})", (total, width))
    b.record(y, [c.node for c in group])
    for c, start, n in zip(group, starts, counts):
        b.facts.append(f"(union (Id {c.node}) (Reshape (Slice {y} 0 {start} {start + n}) {vec(t.shapes[c.node])}))")


_BUILDERS = {"linear": _batch_linear, "linear_padk": _batch_linear_padk, "layer_norm": _batch_layer_norm,
             "linear_lhs": _batch_linear_lhs, "group_linear": _group_linear, "embedding": _batch_embedding}
_KEYS = (fusion_key, lhs_fusion_key, padk_fusion_key, group_linear_key, embedding_key)


@dataclass
class Batches:
    """What batching added: the facts, members per kind, and the batched terms' ids per kind."""

    facts: list[str]
    members: dict[str, int]
    outputs: dict[str, list[int]]
    groups: list[tuple[int, list[int]]]  # (batched term id, member node ids)


def group_linear_can_pay(profile: Any, n: int) -> bool:
    """Whether one grouped call for ``n`` linears can cost less than their ``n`` launches
    under ``profile`` (None: assume it can). A necessary condition only, checked before
    building: the measured host time of the call makes it fail on the shipped GPU
    profiles, and the CPU fallback runs every member anyway."""
    if profile is None:
        return True
    from ..extract.cost_model import KernelKind, get_profile

    p = get_profile(profile)
    if p.codegen != "triton":
        return False
    return p.grouped_host_s + n * p.grouped_host_s_per_member < (n - 1) * p.launch_s(KernelKind.MATMUL)


def batch_facts(t: Translation, profile: Any = None) -> Batches:
    """Facts adding one batched alternative per group, with what they batch.

    ``profile`` (a cost-model profile or its name) lets kinds that cannot pay on
    that device be skipped before they are built (group_linear); None builds all.
    """
    keyed: dict[tuple, list[Candidate]] = defaultdict(list)
    for i, term in t.terms.items():
        candidate = parse_candidate(i, term)
        if candidate is None:
            continue
        for key_of in _KEYS:
            key = key_of(t, candidate)
            if key is not None:
                keyed[key].append(candidate)
    keyed = {k: v for k, v in keyed.items() if len(v) >= MIN_GROUP}
    ancestors = candidate_ancestors(t, {c.node for members in keyed.values() for c in members})
    builder = BatchBuilder(t)
    stats: dict[str, int] = defaultdict(int)
    outputs: dict[str, list[int]] = defaultdict(list)
    groups = [(key[0] if key[0] in _BUILDERS else "elementwise", group)
              for key, members in keyed.items() for group in independent_groups(members, ancestors)
              if len(group) >= MIN_GROUP]
    for kind, group in (groups[k] for k in build_order([g for _, g in groups])):
        if kind == "group_linear" and not group_linear_can_pay(profile, len(group)):
            continue
        built = len(builder.outputs)
        _BUILDERS.get(kind, _batch_elementwise)(builder, group)
        if len(builder.outputs) == built:
            continue  # the builder declined this group
        stats[f"batch-{kind}"] += len(group)
        outputs[f"batch-{kind}"].append(builder.outputs[-1])
    if builder.groups and (views := cat_alternatives(t, builder.slot_of, builder.facts.append)):
        stats["cat-views"] = views
    return Batches(builder.facts, dict(stats), dict(outputs), builder.groups)
