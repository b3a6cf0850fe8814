"""Optimal DAG extraction as a 0-1 integer program (highspy, or scipy ``milp``; HiGHS).

Variables: ``x_n`` (node n chosen), ``y_c`` (class c needed), and continuous
helper columns for acyclicity, only in cyclic strongly connected components
(elsewhere no choice can close a cycle).

    minimize   sum_n cost_n * x_n
    y_r = 1                                  for every root r
    sum_{n in c} x_n = y_c                   a needed class picks one node
    x_n <= y_ch                              a chosen node needs its children
    x_n = 0                                  for self-loop nodes (child == own class)
    acyclicity, per cyclic component K       reach rows (below), or big-M order rows

Reach rows (:func:`_hubs`, :func:`_reach_rows`). A feedback vertex set of K's
class graph is picked hub by hub; each hub X gets, for the strongly connected
set S it was cut from, a column ``r_c`` per class of S ("c reaches X") with

    r_c >= [c picks an arc to X]
    r_c >= [c picks an arc to d] + r_d - 1       d in S
    [X picks an arc to d] + r_d <= 1             X may not reach itself

where ``[c picks an arc to d]`` is the sum of x over c's nodes with child d
(or with d in their ``below`` set, see the conflicts). Every cycle meets a
hub, and lies inside the set of the first one it meets, so for integral x
these rows are exactly acyclicity; in the LP they imply every cycle
inequality (sum of a cycle's arcs <= its length - 1) through the hub at once.
One exit cut per component (:func:`_exit_cut`) completes them. They replaced
big-M order rows ``t_c - t_ch >= 1 - M (1 - x_n)`` (M = |K|, which let a
cycle's arcs sit at 1 - 1/M); those stay as the fallback where the reach
rows would exceed ``max_reach_arcs`` arcs in all (:func:`_order_rows`).
Measured on the ``--models`` e-graphs (pickled, 2 shared cores, highspy):
dynamic_schema proven in 5.2-5.6 s (15.9 s with order rows), ple 1.9-3.9 s
(5.3 s), mmoe 0.6-1.4 s (1.0 s), split_cat_chain(1000) 0.4 s (0.5 s); the
demo is still unproven (below). Tried and not kept: a level-indexed
formulation (x_{n,l} per feedback level: its LP lets an exit of weight eps
support a cycle, the bound did not move on dynamic_schema in 60 s), a lazy
loop adding cycle or exit cuts for the cycles of each integral solution
(dynamic_schema 34 s, the demo +1 view unit per re-solve), exit cuts for
every 2-class cycle (dynamic_schema unproven at 10 s), reach arcs for every
``below`` class rather than only lifted onto existing arcs (19 s), and
need-based dominance in the reduction (no faster).

The demo stays unproven: its bound at 10 s is about 20,100 units against
the greedy program's 31,574 (gap 0.363, as with the order rows; 8,840
without the exit cut), and after 30 s HiGHS had explored a quarter of the
tree. Its relaxed programs build the batched 8-piece relu as a cat of its
own slices, through prefix and list classes with many alternatives: one
equivalent cycle after another. The history
below was measured with the order rows.

Before the model is built, :func:`reduce_for_ilp` drops e-nodes that no
optimal acyclic program needs (exact reductions, so "optimal" stays optimal):

* *necessarily cyclic* nodes: ``need(d)`` is the set of classes every acyclic
  term of class ``d`` contains (greatest fixpoint of
  ``need(d) = {d} | AND_nodes OR_children need(child)``, Python ints as
  bitsets). A node of class ``c`` with a child ``d`` where ``c`` is in
  ``need(d)`` can never be in an acyclic program (self-loops included). On
  real e-graphs this removes the ``x = slice(cat(x, ..))`` round trips;
* *dominated* nodes: a node is dropped when another node of its class costs no
  more and uses a subset of its children (it can replace it in any program
  without adding an edge, so no cycle either);

then classes left without a finite acyclic term and everything the roots no
longer reach are removed, and the strongly connected components (where the
acyclicity rows live) are recomputed on what remains.

Costs are divided by the smallest positive cost before they reach HiGHS: real
costs are seconds (views 1e-9, kernels 1e-6), below HiGHS's absolute
tolerances, which made it stop at non-optimal points and report them optimal.

Need implications (in :func:`_build`): ``y_c <= y_d`` for every d in
``need(c)`` (only the Hasse pairs of that partial order, and not where c has
a single node with child d: already implied), and ``y_d = 1`` for d in the
need set of a root. These are valid for every acyclic program, so optimality
is unchanged. They fix the main LP weakness on multi-task models: a class
that every alternative of its user shares was paid only at the weight of one
alternative (the LP takes the max over users, not the sum).

Measured (``python -m benchmarks.bench_extractors --models``, 2 shared
cores): root LP bound / greedy cost, in units of the smallest cost, before ->
after the need rows: mmoe 1,636 -> 125,259 / 194,436; ple 1,636 -> 197,227 /
378,282; demo 7,008 -> 7,018 / 31,574; dynamic_schema 16,320 -> 16,972 /
247,780. At the 10 s limit the gap went from 0.32 to about 0.2 on mmoe and
from 0.48 to 0.21-0.24 on ple (better programs found too); demo (0.44) and
dynamic_schema (0.90) are unchanged and none of the four is proven optimal.
dlrm, deepfm, dcnv2, transformer, split_cat_chain(1000) stay proven in
< 0.5 s.

Why the bound stays weak on demo / dynamic_schema (measured, not fixed):

* the plain DAG model without any acyclicity rows solves in 0.2-0.6 s but
  to a cyclic program of 2-8 % of the greedy cost (demo 6,277, mmoe 2,506):
  cycles through views and lists (x = cat([slice(x), slice(x)]),
  reshape families where each view class is a reshape of every other, and
  ``cat([x]) = x``) justify whole models;
* with the big-M order rows the LP sets cycle edges to 1 - 1/M (M = size
  of the strongly connected component: 457 on demo, 93-204 elsewhere), so
  the real exit is paid about 1/M;
* exit cuts ``y_c <= sum of x over nodes of S with no child in S``
  separated on the LP solution (SCCs of its support at several thresholds,
  or min cuts from each class to the leaves in a flow network of the
  component) are violated and valid, but each round removes one of very
  many equivalent view cycles: demo's LP went 7,018 -> 9,438 in 50 rounds
  and 11,000 cuts (300 s), mmoe's did not move (125,259 -> 125,275). Not kept;
* a lazy cycle-cut loop (solve without order constraints, add exit cuts for
  the cycles of the chosen program, resolve) and a big-M order region grown
  from the cycles found were both slower than the formulation here: mmoe
  reached 140,334 after 55 integer resolves (112 s), demo 8,832 after 31.

The e-graphs then changed under us (rewrites edited concurrently): on the
e-graphs of the same command a little later (demo 839 classes / 2,949
reduced nodes, mmoe 483/681, ple 1,002/1,543, dynamic_schema 1,103/2,042),
without -> with the need rows: mmoe proven in 0.40 -> 0.25 s, ple proven in
1.61 -> 2.84 s, demo gap 0.40 -> 0.44 (worse incumbent at the limit),
dynamic_schema 0.187 either way. So the rows are an option
(``need_rows_max_nodes``); they were off by default until the cycle
conflicts below made them pay.

Cycle conflicts (in :func:`_build`, :func:`_cycle_conflicts`). ``below(n)``
for a node n of class c inside a cyclic component is the need of n's
children computed with c banned (:func:`_node_needs`): every acyclic program
picking n has those classes under c. Nodes n (class c), m (class d) with d in
below(n) and c in below(m) cannot both be chosen (``x_n + x_m <= 1``);
likewise triples n -> m1 -> m2 -> n (``sum <= 2``). Exact: each row only
forbids programs with a cycle. They cut the ``X = cat([slice(X), ..])``
round trips whose list class has alternatives (plain need misses them) and
the view round trips through lists. Measured on the pickled e-graphs of
``--models`` (2 shared cores, 10 s, HiGHS relaxation = the model without any
order rows): the relaxation optimum rose mmoe 122,971 -> 141,871 (the true
optimum, and acyclic: proven without order rows), ple 214,431 -> 239,745,
dynamic_schema 38,902 -> 59,000, demo 17,544 -> 20,098 (units of the
smallest cost). Node-level need rows ``x_n <= y_d`` for d in below(n) and
order rows ``t_c >= t_d + 1`` for them did not help (mmoe went from proven to
gap 0.04 with the former). Results with this model, need rows on (default
now ``need_rows_max_nodes=20,000``) and highspy:

* mmoe proven in 0.9 s (before: gap 0.15 at 10 s; optimum 141,871 units =
  1.418710e-04, the same as a 300 s run of the old model, proven at 25 s);
* ple proven in 6.0 s (before: gap 0.17; the old model's 300 s run reached the
  same program, 2.461095e-04, at gap 0.05);
* dynamic_schema gap 0.62 -> 0.38, demo 0.36 -> 0.36: not proven. Their
  incumbent is still the greedy program; the bound is the relaxation's.
  On demo a loop adding order rows only for the classes of the cycles found
  (M = their count) raised the bound by single view units per integer
  resolve (20,094 -> 20,113 after 32 resolves, 10-60 s each): what is left
  there is long (5-22 class) view/list cycles through batched layouts, and a
  repair of the relaxed program into an acyclic one (greedy passes biased to
  its nodes) gave nothing better than greedy, so the optimum may be far above
  the bound.

Solver: scipy 1.17's bundled HiGHS needs more than 10 s on ple with this very
model (gap 0.044 at 10 s) where highspy 1.16 proves it in 5.6 s, so
:func:`_solve` uses highspy when it is installed (a declared dependency) and
scipy ``milp`` otherwise, up to 5,000 reduced e-nodes; beyond, scipy is
faster (``IlpExtractor`` doc: synthetic splitcat(10000)), and the conflict
rows are capped the same way.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Callable
from types import SimpleNamespace

import networkx as nx
import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from .egraph import CompactGraph, ENode, Extraction, ExtractionError, ExtractionGraph, compact, dag_cost
from .greedy import GreedyDagExtractor

__all__ = ["IlpExtractor", "reduce_for_ilp"]


def _children_need(cg: CompactGraph, n: int, c: int, need_of: Callable[[int], int | None]) -> int | None:
    """Union of the needs of node n's children (n in class c); None when a child has
    no term (``need_of`` gives None) or is c itself."""
    u = 0
    for ch in cg.node_children[n]:
        v = None if ch == c else need_of(ch)
        if v is None:
            return None
        u |= v
    return u


def _class_need(cg: CompactGraph, c: int, need_of: Callable[[int], int | None]) -> int | None:
    """One step of the need fixpoint: c plus what every node of c with a term needs
    (None: no node of c has one yet)."""
    acc: int | None = None
    for n in cg.class_nodes[c]:
        u = _children_need(cg, n, c, need_of)
        if u is not None:
            acc = u if acc is None else acc & u
    return None if acc is None else acc | (1 << c)


def _local_need(local: dict[int, int | None], need: list[int | None]) -> Callable[[int], int | None]:
    """Need of a child in a component-local fixpoint (:func:`_needs_avoiding`): its local
    value inside the component; outside, 0 when it has a term (it holds no class of
    the component), else None."""
    return lambda ch: local[ch] if ch in local else need[ch] and 0


def _needs(cg: CompactGraph) -> list[int | None]:
    """Per class, the bitset of classes every acyclic term of it contains (None: no term)."""
    comps, _, _ = cg.components()
    parents: list[list[int]] = [[] for _ in range(cg.n_classes)]
    for n, chs in enumerate(cg.node_children):
        for ch in chs:
            parents[ch].append(cg.node_class[n])
    need: list[int | None] = [None] * cg.n_classes
    queued = [True] * cg.n_classes
    work = deque(c for m in comps for c in m)  # children first: few re-evaluations
    while work:
        c = work.popleft()
        queued[c] = False
        acc = _class_need(cg, c, need.__getitem__)
        if acc is None:
            continue
        if acc != need[c]:
            need[c] = acc
            for p in parents[c]:
                if not queued[p]:
                    queued[p] = True
                    work.append(p)
    return need


def _need_pairs(cg: CompactGraph, need: list[int | None]) -> list[tuple[int, int]]:
    """(c, d) with d in need(c), d != c, not implied through another e in need(c) (Hasse pairs).

    ``need`` is a strict partial order on classes with acyclic terms (d in
    need(c) and c in need(d) would put c strictly inside its own term), so
    ``y_c <= y_d`` over these pairs implies it for every d in need(c).
    """
    pairs: list[tuple[int, int]] = []
    for c, v in enumerate(need):
        if v is None:
            continue
        v &= ~(1 << c)
        cover = 0
        for d in _bits(v):
            cover |= need[d] & ~(1 << d)  # type: ignore[operator]
        pairs.extend((c, d) for d in _bits(v & ~cover))
    return pairs


def _bits(mask: int):
    """Indices of the set bits of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _needs_avoiding(cg: CompactGraph, members: list[int], banned: int, need: list[int | None],
                    parents_in: list[list[int]]) -> dict[int, int | None]:
    """``need`` on one component's classes for terms that do not use class ``banned``.

    Same fixpoint as :func:`_needs`, restricted to ``members`` and to bits of
    ``members``: a class of a lower component cannot reach ``banned`` and
    holds no class of this one, so it only matters whether it has a term.
    """
    local: dict[int, int | None] = dict.fromkeys(members)
    work = deque(c for c in members if c != banned)
    queued = set(work)
    while work:
        c = work.popleft()
        queued.discard(c)
        acc = _class_need(cg, c, _local_need(local, need))
        if acc is None:
            continue
        if acc != local[c]:
            local[c] = acc
            for p in parents_in[c]:
                if p != banned and p not in queued:
                    queued.add(p)
                    work.append(p)
    return local


def _node_needs(cg: CompactGraph, need: list[int | None], parts=None) -> dict[int, int | None]:
    """Per node with a child in its own cyclic component: the classes below it.

    ``below[n]`` is the set of classes of n's component that every acyclic
    program picking n for its class c contains below c: below n nothing may
    use c again, so it is the union over n's children of their need computed
    with c banned (:func:`_needs_avoiding`). ``parts``: ``cg.components()``
    if already computed. None:
    no such program (n is never usable). Larger than the plain need of n's
    children, because alternatives that go back through c are excluded.
    """
    comps, cyclic, labels = parts or cg.components()
    parents_in: list[list[int]] = [[] for _ in range(cg.n_classes)]
    for n, chs in enumerate(cg.node_children):
        c = cg.node_class[n]
        for ch in chs:
            if ch != c and labels[ch] == labels[c]:
                parents_in[ch].append(c)
    below: dict[int, int | None] = {}
    for members, is_cyclic in zip(comps, cyclic):
        if not is_cyclic or len(members) < 2:
            continue
        for c in members:
            inner = [n for n in cg.class_nodes[c] if any(labels[ch] == labels[c] for ch in cg.node_children[n])]
            if not inner:
                continue
            need_of = _local_need(_needs_avoiding(cg, members, c, need, parents_in), need)
            for n in inner:
                below[n] = _children_need(cg, n, c, need_of)
    return below


def _cycle_conflicts(cg: CompactGraph, below: dict[int, int | None],
                     max_rows: int = 50_000) -> list[tuple[int, ...]]:
    """Node pairs and triples that can never all be chosen (they close a cycle).

    Nodes n (class c) and m (class d) conflict when d is below n and c is
    below m (``below`` of :func:`_node_needs`): c would be under itself.
    Triples n -> m1 -> m2 -> n likewise, where no pair of them conflicts
    already. At most ``max_rows`` are returned (each one is valid alone).
    """
    usable = {n: v for n, v in below.items() if v is not None}

    def above(n: int, c: int) -> bool:  # class c is below node n
        return n in usable and (usable[n] >> c) & 1 == 1

    pairs: set[tuple[int, int]] = set()
    for n, v in usable.items():
        c = cg.node_class[n]
        for d in _bits(v):
            if d > c:
                pairs.update((n, m) for m in cg.class_nodes[d] if above(m, c))
    out: list[tuple[int, ...]] = sorted(pairs)

    def free(a: int, b: int) -> bool:
        return (min(a, b), max(a, b)) not in pairs and (max(a, b), min(a, b)) not in pairs

    for n, v in usable.items():
        c = cg.node_class[n]
        for d1 in _bits(v):  # the smallest class of the cycle is c: each triple once
            if d1 <= c:
                continue
            for m1 in cg.class_nodes[d1]:
                if m1 not in usable or not free(n, m1):
                    continue
                for d2 in _bits(usable[m1] & ~v):  # d2 in v: (n, m2) would be a pair
                    if d2 <= c:
                        continue
                    for m2 in cg.class_nodes[d2]:
                        if above(m2, c) and free(m1, m2) and free(n, m2):
                            out.append((n, m1, m2))
                            if len(out) >= max_rows:
                                return out
    return out


def _dominated(cg: CompactGraph, keep: list[bool], max_nodes: int = 256) -> None:
    """Clear ``keep`` for nodes dominated by a no-costlier node with a subset of their children."""
    cost, children = cg.node_cost, cg.node_children
    for nodes in cg.class_nodes:
        if len(nodes) < 2 or len(nodes) > max_nodes:
            continue
        alive = [n for n in nodes if keep[n]]
        # Cheapest first, then fewest children: a dominator comes before what it dominates.
        alive.sort(key=lambda n: (cost[n], len(children[n]), n))
        kept: list[tuple[int, frozenset[int]]] = []
        for n in alive:
            s = frozenset(children[n])
            if any(t <= s for _, t in kept):
                keep[n] = False
            else:
                kept.append((n, s))


def reduce_for_ilp(cg: CompactGraph, rounds: int = 3) -> CompactGraph:
    """Drop nodes no optimal acyclic program needs (see module doc); exact."""
    for _ in range(rounds):
        need = _needs(cg)
        keep = [True] * cg.n_nodes
        for n, chs in enumerate(cg.node_children):
            c = cg.node_class[n]
            if any(need[ch] is None or (need[ch] >> c) & 1 for ch in chs):
                keep[n] = False
        _dominated(cg, keep)
        if all(keep):
            break
        cg = _restrict(cg, keep)
    return cg


def _restrict(cg: CompactGraph, keep: list[bool]) -> CompactGraph:
    """The compact graph of the kept nodes (re-pruned), indices still into the input graph."""
    classes: list[list[ENode]] = [[] for _ in range(cg.n_classes)]
    ids: list[list[int]] = [[] for _ in range(cg.n_classes)]
    for n, c in enumerate(cg.node_class):
        if keep[n]:
            classes[c].append(ENode("", cg.node_children[n], cg.node_cost[n]))
            ids[c].append(n)
    sub = compact(ExtractionGraph(classes, list(cg.roots)))
    sub.node_local = [cg.node_local[ids[sub.class_orig[c]][k]] for c, k in zip(sub.node_class, sub.node_local)]
    sub.class_orig = [cg.class_orig[c] for c in sub.class_orig]
    return sub


class _Model:
    """Sparse rows and extra (continuous) columns of the MIP, appended as they are made."""

    def __init__(self, n_cols: int) -> None:
        self.n_cols = n_cols
        self.extra_ub: list[float] = []  # upper bounds of the columns past the x and y ones (lb 0)
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lo: list[float] = []
        self.hi: list[float] = []

    def column(self, ub: float = 1.0) -> int:
        self.extra_ub.append(ub)
        self.n_cols += 1
        return self.n_cols - 1

    def row(self, entries: list[tuple[int, float]], lb: float, ub: float) -> None:
        r = len(self.lo)
        for col, v in entries:
            self.rows.append(r)
            self.cols.append(col)
            self.vals.append(v)
        self.lo.append(lb)
        self.hi.append(ub)


def _arcs(cg: CompactGraph, members: list[int], below: dict[int, int | None]) -> dict[int, dict[int, list[int]]]:
    """Class arcs inside one component: ``arcs[c][d]`` = the nodes of c that put d under c.

    A node counts for (c, d) when d is its child or, for an arc that some
    node of c has directly, when d is in ``below(n)`` (every acyclic program
    picking n holds d under c): lifting the arc to those nodes strengthens
    the reach rows without adding arcs (before the exit cut was added, it
    took ple from 4.3 s to 0.7 s to prove, mmoe from 1.3 s to 0.6 s).
    Self-loops are left out (such nodes are fixed to 0).
    """
    inside = set(members)
    arcs: dict[int, dict[int, list[int]]] = {c: {} for c in members}
    for c in members:
        for n in cg.class_nodes[c]:
            for ch in cg.node_children[n]:
                if ch in inside and ch != c:
                    arcs[c].setdefault(ch, []).append(n)
    for c in members:
        for n in cg.class_nodes[c]:
            v = below.get(n)
            if v is None:
                continue
            for d in _bits(v):
                if d != c and d in arcs[c] and d not in cg.node_children[n]:
                    arcs[c][d].append(n)
    return arcs


def _cyclic_sets(nodes: list[int], edges: list[tuple[int, int]]) -> list[set[int]]:
    """The strongly connected sets of more than one class of the graph (``nodes`` in this order)."""
    graph = nx.DiGraph()
    graph.add_nodes_from(nodes)
    graph.add_edges_from(edges)
    return [t for t in nx.strongly_connected_components(graph) if len(t) > 1]


def _hubs(arcs: dict[int, dict[int, list[int]]], max_arcs: int) -> list[tuple[int, set[int]]] | None:
    """A feedback vertex set of the component's class graph, in removal order.

    Each hub comes with the strongly connected set it was cut from: every
    cycle runs through some hub, and the first hub it meets (in this order)
    has the whole cycle inside its set. Hub = the class with the most
    in x out arcs in its set. None when the sets together hold more than
    ``max_arcs`` arcs (the reach rows would be too many). Small graphs per
    set rather than networkx subgraph views, with the nodes in the order
    those views had (the same model as with them): split/cat chains have
    tens of thousands of tiny components, and building the model for the
    synthetic splitcat(100000) took 4.6 s with the views, 2.2 s now.
    """
    order = {c: i for i, c in enumerate(dict.fromkeys(x for c, ds in arcs.items() for d in ds for x in (c, d)))}
    work = _cyclic_sets(list(order), [(c, d) for c, ds in arcs.items() for d in ds])
    out: list[tuple[int, set[int]]] = []
    total = 0
    while work:
        s = work.pop()
        inner = {c: [d for d in arcs[c] if d in s] for c in sorted(s, key=order.__getitem__)}
        total += sum(len(v) for v in inner.values())
        if total > max_arcs:
            return None
        indegree = dict.fromkeys(s, 0)
        for v in inner.values():
            for d in v:
                indegree[d] += 1
        hub = max(sorted(s), key=lambda c: indegree[c] * len(inner[c]))
        out.append((hub, s))
        rest = sorted(s - {hub}, key=order.__getitem__)  # the order networkx's subgraph views had
        work.extend(_cyclic_sets(rest, [(c, d) for c in rest for d in inner[c] if d != hub]))
    return out


def _reach_rows(model: _Model, hub: int, members: set[int], arcs: dict[int, dict[int, list[int]]]) -> int:
    """Forbid every cycle through ``hub`` inside ``members`` (acyclicity, exact); returns the arcs used.

    ``r_c`` (continuous, 0..1) is at least 1 when c reaches the hub in the
    chosen program: ``r_c >= [c picks an arc to hub]`` and ``r_c >= [c picks
    an arc to d] + r_d - 1``; the hub itself may not pick an arc to a class
    that reaches it: ``[hub picks an arc to d] + r_d <= 1``. For integral x
    these are exactly "no cycle through the hub"; in the LP they imply every
    cycle inequality ``sum of the cycle's arcs <= length - 1`` through it at
    once (the lazy cycle-cut loop added them one cycle per re-solve, and
    gained one view unit each time on the demo).
    """
    r = {c: model.column() for c in members if c != hub}
    count = 0
    for c in members:
        for d, nodes in arcs[c].items():
            if d not in members:
                continue
            count += 1
            if c == hub:
                model.row([(n, 1.0) for n in nodes] + [(r[d], 1.0)], -np.inf, 1.0)
            elif d == hub:
                model.row([(r[c], 1.0)] + [(n, -1.0) for n in nodes], 0.0, np.inf)
            else:
                model.row([(r[c], 1.0), (r[d], -1.0)] + [(n, -1.0) for n in nodes], -1.0, np.inf)
    return count


def _exit_cut(model: _Model, cg: CompactGraph, members: list[int] | tuple[int, ...]) -> None:
    """``y_c <= z <= sum of x_n over nodes of S with no child in S``, for every c in S.

    A chosen acyclic set of classes inside S has a sink: some class of S
    picks a node with no child in S. One z column keeps it linear in |S|.
    Without it the LP is satisfied by fractional self-supporting cycles
    (x = cat(slice(x), ..) at 1/2 each): the reach rows alone left the
    split/cat chain of 1,000 unproven at 10 s (proven in 0.4 s with it).
    """
    n_x = cg.n_nodes
    inside = set(members)
    z = model.column()
    exits = [n for c in members for n in cg.class_nodes[c] if inside.isdisjoint(cg.node_children[n])]
    model.row([(z, 1.0)] + [(n, -1.0) for n in exits], -np.inf, 0.0)
    for c in members:
        model.row([(n_x + c, 1.0), (z, -1.0)], -np.inf, 0.0)


def _order_rows(model: _Model, cg: CompactGraph, members: list[int]) -> None:
    """Big-M order rows and exit cuts for one component (the fallback to reach rows).

    A continuous position ``t_c`` per class, ``t_c - t_ch >= 1 - M (1 - x_n)``
    for every arc (M = the component's size), and exit cuts for the
    component and each 2-class cycle in it. Exact but weak: a cycle's arcs
    at 1 - 1/M pass.
    """
    m = float(len(members))
    t = {c: model.column(ub=m - 1) for c in members}
    arcs = _arcs(cg, members, {})
    for c, out in arcs.items():
        for ch, nodes in out.items():
            for n in nodes:
                model.row([(t[c], 1.0), (t[ch], -1.0), (n, -m)], 1.0 - m, np.inf)
    _exit_cut(model, cg, members)
    if len(members) > 2:
        for c, out in arcs.items():
            for d in out:
                if c < d and c in arcs[d]:
                    _exit_cut(model, cg, (c, d))


def _build(cg: CompactGraph, need_rows: bool = True, conflict_rows: bool = True, max_reach_arcs: int = 20_000,
           stats: dict[str, object] | None = None) -> tuple[np.ndarray, np.ndarray, Bounds, LinearConstraint, int]:
    """Objective, integrality, bounds, constraints and the number of x vars.

    ``stats``, if given, receives how acyclicity was modelled: the number of
    hubs with reach rows and of components left to big-M order rows.
    """
    comps, cyclic, labels = cg.components()
    n_x, n_c = cg.n_nodes, cg.n_classes
    model = _Model(n_x + n_c)
    row = model.row

    # Need implications: every acyclic term of c contains d, so y_c <= y_d
    # (and classes every root needs are fixed to 1). Without them the LP pays
    # a class that all alternatives of its user share only fractionally.
    need = _needs(cg)
    for c, d in _need_pairs(cg, need) if need_rows else ():
        if len(cg.class_nodes[c]) == 1 and d in cg.node_children[cg.class_nodes[c][0]]:
            continue  # already implied by x_n <= y_d
        row([(n_x + c, 1.0), (n_x + d, -1.0)], -np.inf, 0.0)
    forced = 0
    for r in cg.roots:
        forced |= need[r] or 0

    # Cycle conflicts: k nodes whose "below" sets chain back to the first
    # class can have at most k - 1 chosen. They cut the cat-of-own-slices and
    # view round trips, and lift the reach rows' arcs (_arcs). Without them
    # dynamic_schema took 22 s with the reach rows instead of 7.6.
    below = _node_needs(cg, need, (comps, cyclic, labels)) if conflict_rows else {}
    for tup in _cycle_conflicts(cg, below):
        row([(n, 1.0) for n in tup], -np.inf, len(tup) - 1.0)

    self_loops: list[int] = []
    for c, nodes in enumerate(cg.class_nodes):
        row([(n, 1.0) for n in nodes] + [(n_x + c, -1.0)], 0.0, 0.0)
    for n, chs in enumerate(cg.node_children):
        c = cg.node_class[n]
        for ch in chs:
            if ch == c:
                self_loops.append(n)  # uses its own class: always a cycle
            else:
                row([(n, 1.0), (n_x + ch, -1.0)], -np.inf, 0.0)

    # Acyclicity, per cyclic component: reach rows for each hub of a feedback
    # vertex set and one exit cut, or big-M order rows where the reach rows
    # would be too many. (Exit cuts for 2-class cycles as well made the proofs
    # slower: dynamic_schema unproven at 10 s.)
    budget = max_reach_arcs
    n_hubs = n_ordered = 0
    for members, is_cyclic in zip(comps, cyclic):
        if not is_cyclic or len(members) < 2:
            continue
        arcs = _arcs(cg, members, below)
        hubs = _hubs(arcs, budget)
        if hubs is None:
            _order_rows(model, cg, members)
            n_ordered += 1
            continue
        n_hubs += len(hubs)
        for hub, s in hubs:
            budget -= _reach_rows(model, hub, s, arcs)
        _exit_cut(model, cg, members)
    if stats is not None:
        stats.update(reach_hubs=n_hubs, order_components=n_ordered)

    n_var = model.n_cols
    objective = np.zeros(n_var)
    objective[:n_x] = cg.node_cost
    integrality = np.zeros(n_var)
    integrality[: n_x + n_c] = 1
    lb = np.zeros(n_var)
    lb[[n_x + r for r in cg.roots]] = 1.0
    lb[[n_x + d for d in _bits(forced)]] = 1.0
    ub = np.concatenate([np.ones(n_x + n_c), np.array(model.extra_ub, dtype=float)])
    ub[self_loops] = 0.0
    ub[[n for n, v in below.items() if v is None]] = 0.0  # no acyclic program can pick it
    a = coo_matrix((model.vals, (model.rows, model.cols)), shape=(len(model.lo), n_var)).tocsr()
    return objective, integrality, Bounds(lb, ub), LinearConstraint(a, model.lo, model.hi), n_x


def _decode(cg: CompactGraph, x: np.ndarray, n_x: int) -> list[int]:
    """Chosen node per compact class (-1 where none) from a solver vector."""
    best = [-1] * cg.n_classes
    for n in np.flatnonzero(x[:n_x] > 0.5).tolist():
        best[cg.node_class[n]] = n
    return best


class IlpExtractor:
    """Optimal extractor for small/medium e-graphs, with greedy as a floor.

    Options: ``time_limit`` (s, default 10), ``mip_rel_gap`` (HiGHS relative
    gap at which to stop; default 1e-6 so "optimal" means optimal for
    launch-count-sized costs), ``presolve`` (True, False or None = auto).

    Auto presolve: HiGHS 1.12 presolve ignores the time limit and goes
    superlinear when one class has many users (a node shared by 50,000
    slices: 54 s in presolve, 2.9 s without it), while chains of cycles need
    it (10,000-node split/cat chain: 2.9 s with, over 20 s without). So it is
    switched off when a class has more than ``presolve_max_users`` users.

    ``need_rows_max_nodes`` (default 20,000): the need-implication rows
    (module doc) are added only up to this many reduced e-nodes. With the
    cycle-conflict rows they pay (ple proven in 6 s with, gap 0.07 without).
    On split_cat_chain(10000) (38,552 reduced nodes) they do not move the LP
    bound and made HiGHS overrun a 10 s limit by 4.5 s instead of 0.6 s,
    hence the cap. Root needs are fixed to 1 regardless.

    ``conflict_rows_max_nodes`` (default 5,000): the cycle-conflict rows
    (module doc) likewise. On the synthetic splitcat(10000) (9,999 reduced
    nodes) they made scipy's HiGHS take 7.9 s instead of 2.3 s; the real
    e-graphs they are for have under 2,200.

    ``give_up_after_s`` (default None: never) and ``give_up_gap`` (0.3): past
    this many seconds, stop once the gap between the best program known (the
    solver's or greedy's) and the bound is still above ``give_up_gap``: a proof
    is then out of reach in the time left. Measured (highspy, 10 s, the
    ``--models`` e-graphs): at 2 s ple's gap is 0.19 and it is proven at 4.3 s;
    dynamic_schema's is 0.42-0.53 and the demo's 0.36, and neither moves below
    0.36 by 10 s. Without highspy (no callback to watch the gap) the time
    limit itself is cut to ``give_up_after_s``.

    ``max_reach_arcs`` (default 20,000): acyclicity by reach rows (module
    doc) while their hubs' sets hold this many class arcs in all; the
    components past it get the big-M order rows. The zoo's e-graphs need at
    most 1,081, the demo 8,247, split_cat_chain(10000) 18,553. The synthetic
    splitcat(100000) would need 66,664: there scipy's HiGHS spent 12 s in one
    run and 156 s in another (the same rows in another order) against a 10 s
    limit, in presolve; with the cap it takes 15.4 s (19.6 s with order rows
    only, as before the reach rows).

    ``highspy_max_nodes`` (default 5,000): up to this many reduced e-nodes
    the MIP goes to highspy when it is installed (it proves ple, scipy's
    bundled HiGHS does not in 10 s); above, to scipy ``milp``: on
    splitcat(10000) highspy 1.16 took 8.7 s against 2.3 s, and with the
    conflict rows as well it overran the 10 s limit (19.7 s, not solved).
    """

    name = "ilp"

    def __init__(self, time_limit: float = 10.0, mip_rel_gap: float = 1e-6,
                 presolve: bool | None = None, presolve_max_users: int = 2000,
                 need_rows_max_nodes: int = 20_000, conflict_rows_max_nodes: int = 5_000,
                 highspy_max_nodes: int = 5_000, give_up_after_s: float | None = None,
                 give_up_gap: float = 0.3, max_reach_arcs: int = 20_000) -> None:
        self.time_limit = time_limit
        self.max_reach_arcs = max_reach_arcs
        self.give_up_after_s = give_up_after_s
        self.give_up_gap = give_up_gap
        self.highspy_max_nodes = highspy_max_nodes
        self.need_rows_max_nodes = need_rows_max_nodes
        self.conflict_rows_max_nodes = conflict_rows_max_nodes
        self.mip_rel_gap = mip_rel_gap
        self.presolve = presolve
        self.presolve_max_users = presolve_max_users

    def extract(self, graph: ExtractionGraph) -> Extraction:
        """Extract all roots together; never costlier than the greedy result."""
        t0 = time.perf_counter()
        cg = compact(graph)
        ext = self.extract_compact(graph, cg, GreedyDagExtractor().extract_compact(cg))
        ext.seconds = time.perf_counter() - t0
        return ext

    def extract_compact(self, graph: ExtractionGraph, cg: CompactGraph, greedy: Extraction) -> Extraction:
        """Solve on a pruned graph; ``greedy`` is the upper bound and fallback."""
        t0 = time.perf_counter()
        info: dict[str, object] = {"classes": cg.n_classes, "nodes": cg.n_nodes, "greedy_cost": greedy.cost}
        # Trivial lower bound: every root pays at least its cheapest node.
        lower = max(min(cg.node_cost[n] for n in cg.class_nodes[r]) for r in cg.roots)
        if greedy.cost <= lower:
            info["stop"] = "greedy meets lower bound"
            return Extraction(greedy.choice, greedy.cost, "greedy", True, 0.0, info=info)

        cg = reduce_for_ilp(cg)
        info.update(ilp_classes=cg.n_classes, ilp_nodes=cg.n_nodes, reduce_s=time.perf_counter() - t0)
        need_rows = cg.n_nodes <= self.need_rows_max_nodes
        conflict_rows = cg.n_nodes <= self.conflict_rows_max_nodes
        objective, integrality, bounds, constraints, n_x = _build(cg, need_rows, conflict_rows, self.max_reach_arcs, info)
        info.update(need_rows=need_rows, conflict_rows=conflict_rows)
        positive = objective[objective > 0]
        unit = float(positive.min()) if positive.size else 1.0
        objective = objective / unit  # HiGHS tolerances are absolute: keep costs O(1) and up
        presolve = self.presolve
        if presolve is None:
            users = np.diff(constraints.A.tocsc().indptr)[n_x: n_x + cg.n_classes]
            presolve = bool(users.max(initial=0) <= self.presolve_max_users + 1)
        remaining = max(0.1, self.time_limit - (time.perf_counter() - t0))
        give_up = None
        if self.give_up_after_s is not None:
            give_up = (max(0.1, self.give_up_after_s - (time.perf_counter() - t0)), self.give_up_gap, greedy.cost / unit)
        res = _solve(objective, integrality, bounds, constraints,
                     {"time_limit": remaining, "mip_rel_gap": self.mip_rel_gap, "presolve": presolve},
                     use_highspy=cg.n_nodes <= self.highspy_max_nodes, give_up=give_up)
        info.update(presolve=presolve, solver=res.solver)
        info.update(stop=res.message, status=int(res.status), build_and_solve_s=time.perf_counter() - t0)
        dual = getattr(res, "mip_dual_bound", None)
        if dual is not None:
            dual = float(dual) * unit  # back to the caller's units
        if res.x is None:
            return _fallback(greedy, info, dual)
        try:
            choice, _ = cg.to_choice(_decode(cg, res.x, n_x))
            cost = dag_cost(graph, choice)  # re-verify: acyclic and complete
        except (ExtractionError, IndexError) as err:  # solver tolerance surprises
            info["decode_error"] = str(err)
            return _fallback(greedy, info, dual)
        if cost > greedy.cost:
            return _fallback(greedy, info, dual)
        optimal = res.status == 0
        gap = 0.0 if optimal else _gap(cost, dual, getattr(res, "mip_gap", None))
        return Extraction(choice, cost, "ilp", optimal, gap, info=info)


def _solve(objective: np.ndarray, integrality: np.ndarray, bounds: Bounds, constraints: LinearConstraint,
           options: dict[str, float | bool], use_highspy: bool = True,
           give_up: tuple[float, float, float] | None = None) -> SimpleNamespace:
    """Solve the MIP with highspy if asked and installed, else scipy ``milp`` (its result's fields).

    ``give_up`` = (seconds, gap, upper): past ``seconds``, stop while the gap of
    the best of the solver's incumbent and ``upper`` to the bound exceeds ``gap``
    (highspy's MIP interrupt callback); scipy, without a callback, stops at
    ``seconds``.

    highspy (HiGHS 1.16) proved ple in 5.6 s where scipy 1.17's bundled HiGHS
    stopped at a 4.4 % gap after 10 s, on the same model; on the synthetic
    splitcat(10000) it is the other way round (8.6 s against 2.5 s).
    """
    try:
        if not use_highspy:
            raise ImportError
        import highspy
    except ImportError:
        if give_up is not None:
            options = {**options, "time_limit": min(float(options["time_limit"]), give_up[0])}
        res = milp(objective, integrality=integrality, bounds=bounds, constraints=constraints,
                   options={**options, "disp": False})
        return SimpleNamespace(x=res.x, status=int(res.status), message=res.message, solver="scipy",
                               mip_dual_bound=getattr(res, "mip_dual_bound", None),
                               mip_gap=getattr(res, "mip_gap", None))
    # The bare core class: highspy.Highs() prints a banner to stdout when created.
    h = getattr(getattr(highspy, "_core", None), "_Highs", highspy.Highs)()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(options["time_limit"]))
    h.setOptionValue("mip_rel_gap", float(options["mip_rel_gap"]))
    h.setOptionValue("presolve", "on" if options["presolve"] else "off")
    # Branch on pseudocosts at once instead of strong-branching every candidate
    # first: most of the proof's LP iterations went there (dynamic_schema 46k of
    # 75k); 5.5-5.7 s instead of 6.3-7.0 s there, 1.8-1.9 s instead of 2.3-2.4 on ple.
    h.setOptionValue("mip_pscost_minreliable", 0)
    a = constraints.A.tocsr()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = a.shape[1], a.shape[0]
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = objective, bounds.lb, bounds.ub
    lp.row_lower_, lp.row_upper_ = constraints.lb, constraints.ub
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
    kinds = (highspy.HighsVarType.kContinuous, highspy.HighsVarType.kInteger)
    lp.integrality_ = [kinds[int(k)] for k in integrality]
    h.passModel(lp)
    if give_up is not None:
        after, max_gap, upper = give_up

        def hopeless(_kind, _message, out, into, _data) -> None:
            best = min(out.mip_primal_bound, upper)
            if out.running_time >= after and best > 0 and (best - out.mip_dual_bound) / best > max_gap:
                into.user_interrupt = True

        h.setCallback(hopeless, None)
        h.startCallback(highspy.cb.HighsCallbackType.kCallbackMipInterrupt)
    h.run()
    status, info = h.getModelStatus(), h.getInfo()
    has_x = info.primal_solution_status == 2  # kSolutionStatusFeasible
    return SimpleNamespace(
        x=np.array(h.getSolution().col_value) if has_x else None,
        status=0 if status == highspy.HighsModelStatus.kOptimal else 1,
        message=h.modelStatusToString(status), solver="highspy",
        mip_dual_bound=info.mip_dual_bound, mip_gap=info.mip_gap)


def _gap(cost: float, dual: float | None, reported: float | None) -> float | None:
    if dual is not None and math.isfinite(dual):
        return max(0.0, (cost - dual) / max(abs(cost), 1e-12)) if cost else 0.0
    return reported


def _fallback(greedy: Extraction, info: dict[str, object], dual: float | None) -> Extraction:
    """Return the greedy program, with the solver's bound if it proved one."""
    gap = _gap(greedy.cost, dual, None)
    optimal = gap is not None and gap <= 1e-9
    return Extraction(greedy.choice, greedy.cost, "greedy", optimal, gap, info=info)
