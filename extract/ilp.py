"""Optimal DAG extraction as a 0-1 integer program (scipy ``milp`` / HiGHS).

Variables: ``x_n`` (node n chosen), ``y_c`` (class c needed), and, only for
classes inside cyclic strongly connected components (elsewhere no choice can
close a cycle), a continuous topological position ``t_c`` and one continuous
``z_S`` per cut set S.

    minimize   sum_n cost_n * x_n
    y_r = 1                                  for every root r
    sum_{n in c} x_n = y_c                   a needed class picks one node
    x_n <= y_ch                              a chosen node needs its children
    t_c - t_ch >= 1 - M_k (1 - x_n)          n in c, ch in c's component k, M_k = |k|
    x_n = 0                                  for self-loop nodes (child == own class)
    y_c <= z_S <= sum of x_n, n in S with no child in S
                                             "exit" cuts, S = each cyclic component
                                             and each 2-class cycle (see _build)

The order constraints make every chosen edge inside a component go strictly
down in ``t``, so chosen nodes form a DAG. The greedy result is computed first
as an upper bound and kept whenever the solver does not beat it.

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
order variables live) are recomputed on what remains.

Costs are divided by the smallest positive cost before they reach HiGHS: real
costs are seconds (views 1e-9, kernels 1e-6), below HiGHS's absolute
tolerances, which made it stop at non-optimal points and report them optimal.

Measured on real pipeline e-graphs (benchmarks/bench_extractors.py --models),
a lazy cycle-cut loop (solve without order constraints, add exit cuts for the
cycles of the chosen program, resolve) and a big-M order region grown from the
cycles found were both tried and were slower than the formulation here: zero-
cost-ish view cycles give the relaxation plateaus of equal cost, and each
resolve only removes one of very many equivalent cycles.
"""

from __future__ import annotations

import math
import time
from collections import deque

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from .egraph import CompactGraph, ENode, Extraction, ExtractionError, ExtractionGraph, compact, dag_cost
from .greedy import GreedyDagExtractor

__all__ = ["IlpExtractor", "reduce_for_ilp"]


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
        acc: int | None = None
        for n in cg.class_nodes[c]:
            u = 0
            for ch in cg.node_children[n]:
                v = need[ch] if ch != c else None
                if v is None:
                    break
                u |= v
            else:
                acc = u if acc is None else acc & u
        if acc is None:
            continue
        acc |= 1 << c
        if acc != need[c]:
            need[c] = acc
            for p in parents[c]:
                if not queued[p]:
                    queued[p] = True
                    work.append(p)
    return need


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


def _build(cg: CompactGraph) -> tuple[np.ndarray, np.ndarray, Bounds, LinearConstraint, int]:
    """Objective, integrality, bounds, constraints and the number of x vars."""
    comps, cyclic, labels = cg.components()
    n_x, n_c = cg.n_nodes, cg.n_classes
    cyclic_sets = [m for m, cyc in zip(comps, cyclic) if cyc and len(m) > 1]
    size = {labels[m[0]]: len(m) for m, cyc in zip(comps, cyclic) if cyc}
    t_index = {c: n_x + n_c + i for i, c in enumerate(c for m in cyclic_sets for c in m)}
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(entries: list[tuple[int, float]], lb: float, ub: float) -> None:
        r = len(lo)
        for col, v in entries:
            rows.append(r)
            cols.append(col)
            vals.append(v)
        lo.append(lb)
        hi.append(ub)

    self_loops: list[int] = []
    inner: dict[tuple[int, int], list[int]] = {}  # (class, child) in one component -> nodes
    for c, nodes in enumerate(cg.class_nodes):
        row([(n, 1.0) for n in nodes] + [(n_x + c, -1.0)], 0.0, 0.0)
    for n, chs in enumerate(cg.node_children):
        c = cg.node_class[n]
        for ch in chs:
            if ch == c:
                self_loops.append(n)  # uses its own class: always a cycle
                continue
            row([(n, 1.0), (n_x + ch, -1.0)], -np.inf, 0.0)
            if labels[ch] == labels[c]:
                inner.setdefault((c, ch), []).append(n)
                m = float(size[labels[c]])
                row([(t_index[c], 1.0), (t_index[ch], -1.0), (n, -m)], 1.0 - m, np.inf)

    # Exit cuts: a chosen acyclic set of classes inside S has a sink, i.e. some
    # class of S picks a node with no child in S. Without these the LP is
    # satisfied by fractional self-supporting cycles (x = cat(slice(x), ..)
    # at 1/2 each) and HiGHS cannot close the gap. One z var per set keeps it
    # linear in |S|. Sets: each cyclic component and each 2-class cycle.
    cut_sets = [tuple(m) for m in cyclic_sets]
    cut_sets += [(c, d) for (c, d) in inner if c < d and (d, c) in inner and size[labels[c]] > 2]
    n_var = n_x + n_c + len(t_index) + len(cut_sets)
    for i, members in enumerate(cut_sets):
        z = n_x + n_c + len(t_index) + i
        inside = set(members)
        exits = [n for c in members for n in cg.class_nodes[c] if inside.isdisjoint(cg.node_children[n])]
        row([(z, 1.0)] + [(n, -1.0) for n in exits], -np.inf, 0.0)
        for c in members:
            row([(n_x + c, 1.0), (z, -1.0)], -np.inf, 0.0)

    objective = np.zeros(n_var)
    objective[:n_x] = cg.node_cost
    integrality = np.zeros(n_var)
    integrality[: n_x + n_c] = 1
    lb = np.zeros(n_var)
    lb[[n_x + r for r in cg.roots]] = 1.0
    ub = np.ones(n_var)
    ub[self_loops] = 0.0
    for c, j in t_index.items():
        ub[j] = size[labels[c]] - 1
    a = coo_matrix((vals, (rows, cols)), shape=(len(lo), n_var)).tocsr()
    return objective, integrality, Bounds(lb, ub), LinearConstraint(a, lo, hi), n_x


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
    """

    name = "ilp"

    def __init__(self, time_limit: float = 10.0, mip_rel_gap: float = 1e-6,
                 presolve: bool | None = None, presolve_max_users: int = 2000) -> None:
        self.time_limit = time_limit
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
        objective, integrality, bounds, constraints, n_x = _build(cg)
        positive = objective[objective > 0]
        unit = float(positive.min()) if positive.size else 1.0
        objective = objective / unit  # HiGHS tolerances are absolute: keep costs O(1) and up
        presolve = self.presolve
        if presolve is None:
            users = np.diff(constraints.A.tocsc().indptr)[n_x: n_x + cg.n_classes]
            presolve = bool(users.max(initial=0) <= self.presolve_max_users + 1)
        remaining = max(0.1, self.time_limit - (time.perf_counter() - t0))
        res = milp(
            objective, integrality=integrality, bounds=bounds, constraints=constraints,
            options={"time_limit": remaining, "mip_rel_gap": self.mip_rel_gap, "disp": False,
                     "presolve": presolve},
        )
        info["presolve"] = presolve
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


def _gap(cost: float, dual: float | None, reported: float | None) -> float | None:
    if dual is not None and math.isfinite(dual):
        return max(0.0, (cost - dual) / max(abs(cost), 1e-12)) if cost else 0.0
    return reported


def _fallback(greedy: Extraction, info: dict[str, object], dual: float | None) -> Extraction:
    """Return the greedy program, with the solver's bound if it proved one."""
    gap = _gap(greedy.cost, dual, None)
    optimal = gap is not None and gap <= 1e-9
    return Extraction(greedy.choice, greedy.cost, "greedy", optimal, gap, info=info)
