"""The exact extractor's integer program over a reduced compact e-graph (:func:`build_model`).

Columns: ``x_n`` (node n chosen) for every node, then ``y_c`` (class c
needed) for every class, both 0-1, then continuous helper columns for
acyclicity, only in cyclic strongly connected components (elsewhere no choice
can close a cycle). Rows, in the order they are made:

    minimize   sum_n cost_n * x_n
    y_c <= y_d                               need rows: d in need(c), Hasse pairs only
    sum of k conflicting x_n <= k - 1        cycle conflicts (pairs, triples)
    sum_{n in c} x_n = y_c                   a needed class picks one node
    x_n <= y_ch                              a chosen node needs its children
    acyclicity, per cyclic component K       reach rows and an exit cut, or big-M order rows
    bounds: y_r = 1 for every root r and every class a root needs; x_n = 0 for
            self-loop nodes and nodes with no acyclic program below them

Need rows (extract/ilp_needs.py): every acyclic term of c contains d, so
``y_c <= y_d``, only over the Hasse pairs of that order and not where c has a
single node with child d (already implied). Valid for every acyclic program,
so optimality is unchanged; they stop the LP from paying a class that every
alternative of its user shares at the weight of one alternative.

Cycle conflicts (:func:`_cycle_conflicts`): nodes n (class c), m (class d)
with d in below(n) and c in below(m) cannot both be chosen
(``x_n + x_m <= 1``); likewise triples n -> m1 -> m2 -> n (``sum <= 2``).
Each row only forbids programs with a cycle. They cut the
``X = cat([slice(X), ..])`` round trips whose list class has alternatives
(plain need misses them) and the view round trips through lists.

Reach rows (:func:`_hubs`, :func:`_reach_rows`). A feedback vertex set of K's
class graph is picked hub by hub; each hub X gets, for the strongly connected
set S it was cut from, a column ``r_c`` per class of S ("c reaches X") with

    r_c >= [c picks an arc to X]
    r_c >= [c picks an arc to d] + r_d - 1       d in S
    [X picks an arc to d] + r_d <= 1             X may not reach itself

where ``[c picks an arc to d]`` is the sum of x over c's nodes with child d
(or with d in their ``below`` set: :func:`_arcs`). Every cycle meets a hub,
and lies inside the set of the first one it meets, so for integral x these
rows are exactly acyclicity; in the LP they imply every cycle inequality
(sum of a cycle's arcs <= its length - 1) through the hub at once. One exit
cut per component (:func:`_exit_cut`: some class of K picks a node with no
child in K) completes them. Where the reach rows would exceed
``max_reach_arcs`` arcs in all, the big-M order rows
``t_c - t_ch >= 1 - M (1 - x_n)`` (M = |K|) are the fallback
(:func:`_order_rows`); they are weaker: a cycle's arcs at 1 - 1/M pass.

The order of rows and columns is part of the behaviour (HiGHS's path, and
its time, depend on it): keep it when refactoring. What each part bought,
what was tried instead, and how to check a change: docs/ilp.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from scipy.optimize import Bounds, LinearConstraint

from optimus_eqsat.extract.egraph import CompactGraph
from optimus_eqsat.extract.ilp_needs import class_needs, need_pairs, node_needs, set_bits


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


def _cycle_conflicts(cg: CompactGraph, below: dict[int, int | None], max_rows: int = 50_000) -> list[tuple[int, ...]]:
    """Node pairs and triples that can never all be chosen (they close a cycle).

    Nodes n (class c) and m (class d) conflict when d is below n and c is
    below m (``below`` of :func:`node_needs`): c would be under itself.
    Triples n -> m1 -> m2 -> n likewise, where no pair of them conflicts
    already. At most ``max_rows`` are returned (each one is valid alone).
    """
    usable = {n: v for n, v in below.items() if v is not None}

    def above(n: int, c: int) -> bool:  # class c is below node n
        return n in usable and (usable[n] >> c) & 1 == 1

    pairs: set[tuple[int, int]] = set()
    for n, v in usable.items():
        c = cg.node_class[n]
        for d in set_bits(v):
            if d > c:
                pairs.update((n, m) for m in cg.class_nodes[d] if above(m, c))
    out: list[tuple[int, ...]] = sorted(pairs)

    def free(a: int, b: int) -> bool:
        return (min(a, b), max(a, b)) not in pairs and (max(a, b), min(a, b)) not in pairs

    for n, v in usable.items():
        c = cg.node_class[n]
        for d1 in set_bits(v):  # the smallest class of the cycle is c: each triple once
            if d1 <= c:
                continue
            for m1 in cg.class_nodes[d1]:
                if m1 not in usable or not free(n, m1):
                    continue
                for d2 in set_bits(usable[m1] & ~v):  # d2 in v: (n, m2) would be a pair
                    if d2 <= c:
                        continue
                    for m2 in cg.class_nodes[d2]:
                        if above(m2, c) and free(m1, m2) and free(n, m2):
                            out.append((n, m1, m2))
                            if len(out) >= max_rows:
                                return out
    return out


def _arcs(cg: CompactGraph, members: list[int], below: dict[int, int | None]) -> dict[int, dict[int, list[int]]]:
    """Class arcs inside one component: ``arcs[c][d]`` = the nodes of c that put d under c.

    A node counts for (c, d) when d is its child or, for an arc that some
    node of c has directly, when d is in ``below(n)`` (every acyclic program
    picking n holds d under c): lifting the arc to those nodes strengthens
    the reach rows without adding arcs (faster proofs: docs/ilp.md).
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
            for d in set_bits(v):
                if d != c and d in arcs[c] and d not in cg.node_children[n]:
                    arcs[c][d].append(n)
    return arcs


def _cyclic_sets(nodes: list[int], edges: list[tuple[int, int]]) -> list[set[int]]:
    """The strongly connected sets of more than one class of the graph (``nodes`` in this order)."""
    import networkx as nx  # (here: a compile the persistent cache answers never extracts)

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
    set rather than networkx subgraph views (split/cat chains have tens of
    thousands of tiny components), with the nodes in the order those views
    had, so the model is the one the views gave.
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
    once, where a lazy cycle-cut loop would add them one cycle per re-solve.
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
    (x = cat(slice(x), ..) at 1/2 each), which the reach rows alone allow.
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


def build_model(
    cg: CompactGraph,
    need_rows: bool = True,
    conflict_rows: bool = True,
    max_reach_arcs: int = 20_000,
    stats: dict[str, object] | None = None,
) -> tuple[np.ndarray, np.ndarray, Bounds, LinearConstraint, int]:
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
    need = class_needs(cg)
    for c, d in need_pairs(cg, need) if need_rows else ():
        if len(cg.class_nodes[c]) == 1 and d in cg.node_children[cg.class_nodes[c][0]]:
            continue  # already implied by x_n <= y_d
        row([(n_x + c, 1.0), (n_x + d, -1.0)], -np.inf, 0.0)
    forced = 0
    for r in cg.roots:
        forced |= need[r] or 0

    # Cycle conflicts: k nodes whose "below" sets chain back to the first
    # class can have at most k - 1 chosen. They cut the cat-of-own-slices and
    # view round trips, and lift the reach rows' arcs (_arcs).
    below = node_needs(cg, need, (comps, cyclic, labels)) if conflict_rows else {}
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
    # slower: docs/ilp.md.)
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
    lb[[n_x + d for d in set_bits(forced)]] = 1.0
    ub = np.concatenate([np.ones(n_x + n_c), np.array(model.extra_ub, dtype=float)])
    ub[self_loops] = 0.0
    ub[[n for n, v in below.items() if v is None]] = 0.0  # no acyclic program can pick it
    from scipy.optimize import (  # (imported where used: scipy is slow to import)
        Bounds,
        LinearConstraint,
    )
    from scipy.sparse import coo_matrix

    a = coo_matrix((model.vals, (model.rows, model.cols)), shape=(len(model.lo), n_var)).tocsr()
    return objective, integrality, Bounds(lb, ub), LinearConstraint(a, model.lo, model.hi), n_x


def decode_choice(cg: CompactGraph, x: np.ndarray, n_x: int) -> list[int]:
    """Chosen node per compact class (-1 where none) from a solver vector."""
    best = [-1] * cg.n_classes
    for n in np.flatnonzero(x[:n_x] > 0.5).tolist():
        best[cg.node_class[n]] = n
    return best
