"""Exact reductions of a compact e-graph before the ILP is built (:func:`reduce_for_ilp`).

Drops e-nodes that no optimal acyclic program needs, so "optimal" stays
optimal:

* *necessarily cyclic* nodes: a node of class ``c`` with a child ``d`` where
  ``c`` is in ``need(d)`` (extract/ilp_needs.py) can never be in an acyclic
  program (self-loops included). On real e-graphs these are the
  ``x = slice(cat(x, ..))`` round trips;
* *dominated* nodes: a node is dropped when another node of its class costs no
  more and uses a subset of its children (it can replace it in any program
  without adding an edge, so no cycle either);

then classes left without a finite acyclic term and everything the roots no
longer reach are removed (the graph is compacted again; its indices still
point into the input graph), for up to ``rounds`` rounds. The model's strongly
connected components are computed on what remains. What else was tried here:
docs/ilp.md.
"""

from __future__ import annotations

from optimus_eqsat.extract.egraph import CompactGraph, ENode, ExtractionGraph, compact
from optimus_eqsat.extract.ilp_needs import class_needs

__all__ = ["reduce_for_ilp"]


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
        need = class_needs(cg)
        keep = [True] * cg.n_nodes
        for n, chs in enumerate(cg.node_children):
            c = cg.node_class[n]
            if any((needs := need[ch]) is None or (needs >> c) & 1 for ch in chs):
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
