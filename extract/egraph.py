"""The extractor interface: a plain e-graph, a chosen program, and its DAG cost.

An :class:`ExtractionGraph` is what every extractor reads: e-classes indexed
0..n-1, each a list of e-nodes whose children are e-class indices. It is
deliberately independent of egglog so extractors can be tested on tiny
hand-built graphs, cycles included.

Costs are DAG costs: a chosen e-node is paid once however many users it has.
That is what makes a batched node shared by many slices pay off, and what tree
cost (egglog's built-in extractors) gets wrong.

Everything here iterates; nothing recurses in graph depth (real graphs are
100,000 nodes deep).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "ENode",
    "ExtractionGraph",
    "Extraction",
    "ExtractionError",
    "CycleError",
    "dag_cost",
    "reachable_choice",
    "CompactGraph",
    "compact",
]


class ExtractionError(ValueError):
    """No finite acyclic program exists, or a choice is not a valid program."""


class CycleError(ExtractionError):
    """A choice whose program reads itself; ``cycle`` holds the classes around the loop."""

    def __init__(self, message: str, cycle: list[int]):
        super().__init__(message)
        self.cycle = cycle


@dataclass(frozen=True)
class ENode:
    """One e-node: a label, its child e-classes, and the cost paid once if chosen.

    ``cost`` must be >= 0; ``math.inf`` means "never choose".
    """

    op: str
    children: tuple[int, ...]
    cost: float


@dataclass
class ExtractionGraph:
    """E-classes (index -> e-nodes) and the roots to extract together."""

    classes: list[list[ENode]]
    roots: list[int]

    @property
    def num_nodes(self) -> int:
        """Total number of e-nodes."""
        return sum(len(nodes) for nodes in self.classes)

    def validate(self) -> None:
        """Raise ``ExtractionError`` on bad child/root indices or bad costs."""
        n = len(self.classes)
        for r in self.roots:
            if not 0 <= r < n:
                raise ExtractionError(f"root {r} is not an e-class index (0..{n - 1})")
        for c, nodes in enumerate(self.classes):
            for node in nodes:
                if math.isnan(node.cost) or node.cost < 0:
                    raise ExtractionError(f"e-class {c} node {node.op!r}: cost {node.cost} (must be >= 0)")
                for ch in node.children:
                    if not 0 <= ch < n:
                        raise ExtractionError(f"e-class {c} node {node.op!r}: child {ch} out of range")


@dataclass
class Extraction:
    """A chosen program: one e-node per reachable e-class.

    ``choice`` maps every e-class reachable from the roots (through chosen
    nodes) to the index of its chosen e-node in ``graph.classes[c]``.
    """

    choice: dict[int, int]
    cost: float
    extractor: str
    optimal: bool = False
    gap: float | None = None
    seconds: float = 0.0
    info: dict[str, object] = field(default_factory=dict)  # stop reason, sizes, bounds


def _walk(graph: ExtractionGraph, choice: dict[int, int]) -> list[int]:
    """Classes reachable from the roots through chosen nodes, children before parents.

    Raises ``ExtractionError`` on a missing class, a bad index or a cycle.
    Iterative three-colour DFS (no recursion).
    """
    state: dict[int, int] = {}  # 1 = on stack, 2 = done
    post: list[int] = []
    for root in dict.fromkeys(graph.roots):
        if state.get(root) == 2:
            continue
        stack: list[tuple[int, int]] = [(root, 0)]
        state[root] = 1
        while stack:
            c, i = stack[-1]
            if c not in choice:
                raise ExtractionError(f"choice misses reachable e-class {c}")
            k = choice[c]
            if not 0 <= k < len(graph.classes[c]):
                raise ExtractionError(f"e-class {c}: chosen node {k} out of range")
            children = graph.classes[c][k].children
            if i < len(children):
                stack[-1] = (c, i + 1)
                ch = children[i]
                s = state.get(ch)
                if s == 1:
                    around = [c for c, _ in stack]
                    raise CycleError(f"choice has a cycle through e-class {ch}", around[around.index(ch) :])
                if s is None:
                    state[ch] = 1
                    stack.append((ch, 0))
            else:
                state[c] = 2
                post.append(c)
                stack.pop()
    return post


def dag_cost(graph: ExtractionGraph, choice: dict[int, int]) -> float:
    """DAG cost of ``choice``: each chosen node reachable from the roots, once.

    Raises ``ExtractionError`` if the choice misses a reachable class or is cyclic.
    """
    return math.fsum(graph.classes[c][choice[c]].cost for c in _walk(graph, choice))


def reachable_choice(graph: ExtractionGraph, choice: dict[int, int]) -> dict[int, int]:
    """Restrict ``choice`` to the classes reachable from the roots (validating it)."""
    return {c: choice[c] for c in _walk(graph, choice)}


# ---------------------------------------------------------------- compact form


@dataclass
class CompactGraph:
    """The pruned e-graph the extractors work on, as flat lists.

    Infinite-cost nodes, classes with no finite acyclic term, nodes using
    them, and everything unreachable from the roots are removed. Children are
    deduplicated (a child used twice is paid once in a DAG). Indices are
    compact; ``class_orig`` / ``node_local`` map back to the input graph.
    """

    class_orig: list[int]
    class_nodes: list[list[int]]
    node_class: list[int]
    node_local: list[int]
    node_cost: list[float]
    node_children: list[tuple[int, ...]]
    roots: list[int]

    @property
    def n_classes(self) -> int:
        return len(self.class_orig)

    @property
    def n_nodes(self) -> int:
        return len(self.node_class)

    def to_choice(self, best: list[int] | dict[int, int]) -> tuple[dict[int, int], float]:
        """Map a per-class node choice (compact) to an input-graph choice + its DAG cost.

        Only classes reachable from the roots are kept; ``best`` must be acyclic.
        """
        seen = set(self.roots)
        stack = list(seen)
        choice: dict[int, int] = {}
        costs: list[float] = []
        while stack:
            c = stack.pop()
            n = best[c]
            choice[self.class_orig[c]] = self.node_local[n]
            costs.append(self.node_cost[n])
            for ch in self.node_children[n]:
                if ch not in seen:
                    seen.add(ch)
                    stack.append(ch)
        return choice, math.fsum(costs)

    def components(self) -> tuple[list[list[int]], list[bool], list[int]]:
        """Strongly connected components of the class graph, children first.

        Returns (components, cyclic flags, class -> component label). A
        component is cyclic if it has more than one class or a self-loop; only
        there can a choice close a cycle. SCCs come from scipy (C code);
        the component DAG is ordered with Kahn's algorithm.
        """
        nc = self.n_classes
        src, dst = [], []
        for n, chs in enumerate(self.node_children):
            c = self.node_class[n]
            for ch in chs:
                src.append(c)
                dst.append(ch)
        from scipy.sparse import (
            csr_matrix,  # (imported here: scipy costs 0.5 s at import)
        )
        from scipy.sparse.csgraph import connected_components

        adj = csr_matrix((np.ones(len(src), dtype=np.int8), (src, dst)), shape=(nc, nc))
        ncomp, labels_np = connected_components(adj, directed=True, connection="strong")
        labels = labels_np.tolist()
        members: list[list[int]] = [[] for _ in range(ncomp)]
        for c, k in enumerate(labels):
            members[k].append(c)
        cyclic = [len(m) > 1 for m in members]
        # pending[k] = edges from component k to other components not yet done
        pending = [0] * ncomp
        users: list[list[int]] = [[] for _ in range(ncomp)]
        for s, d in zip(src, dst):
            ks, kd = labels[s], labels[d]
            if ks == kd:
                if s == d:
                    cyclic[ks] = True
            else:
                pending[ks] += 1
                users[kd].append(ks)
        ready = [k for k in range(ncomp) if pending[k] == 0]
        order: list[int] = []
        while ready:
            k = ready.pop()
            order.append(k)
            for u in users[k]:
                pending[u] -= 1
                if pending[u] == 0:
                    ready.append(u)
        assert len(order) == ncomp, "component graph must be acyclic"
        return [members[k] for k in order], [cyclic[k] for k in order], labels


def compact(graph: ExtractionGraph) -> CompactGraph:
    """Prune ``graph`` to what any finite acyclic extraction can use.

    Raises ``ExtractionError`` if a root has no finite acyclic term.
    """
    graph.validate()
    if not graph.roots:
        raise ExtractionError("no roots to extract")
    nc = len(graph.classes)
    # Flatten the finite nodes, children deduplicated.
    n_class: list[int] = []
    n_local: list[int] = []
    n_children: list[tuple[int, ...]] = []
    parents: list[list[int]] = [[] for _ in range(nc)]
    for c, nodes in enumerate(graph.classes):
        for i, node in enumerate(nodes):
            if node.cost == math.inf:
                continue
            n = len(n_class)
            chs = tuple(dict.fromkeys(node.children))
            n_class.append(c)
            n_local.append(i)
            n_children.append(chs)
            for ch in chs:
                parents[ch].append(n)
    # Bottom-up: a class is extractable once one node has all children
    # extractable; this order is itself an acyclic witness.
    pending = [len(chs) for chs in n_children]
    extractable = [False] * nc
    work = list(dict.fromkeys(c for c, n in zip(n_class, pending) if n == 0))
    for c in work:
        extractable[c] = True
    while work:
        c = work.pop()
        for n in parents[c]:
            pending[n] -= 1
            if pending[n] == 0:
                p = n_class[n]
                if not extractable[p]:
                    extractable[p] = True
                    work.append(p)
    for r in graph.roots:
        if not extractable[r]:
            raise ExtractionError(f"root e-class {r} has no finite acyclic term")
    # Usable nodes, grouped by class; then keep what the roots reach.
    usable: list[list[int]] = [[] for _ in range(nc)]
    for n, c in enumerate(n_class):
        if pending[n] == 0:
            usable[c].append(n)
    seen = [False] * nc
    order: list[int] = []
    stack = list(dict.fromkeys(graph.roots))
    for r in stack:
        seen[r] = True
    while stack:
        c = stack.pop()
        order.append(c)
        for n in usable[c]:
            for ch in n_children[n]:
                if not seen[ch]:
                    seen[ch] = True
                    stack.append(ch)
    new_id = {c: i for i, c in enumerate(order)}
    cg = CompactGraph(order, [], [], [], [], [], [new_id[r] for r in dict.fromkeys(graph.roots)])
    for c in order:
        ids = []
        for n in usable[c]:
            ids.append(len(cg.node_class))
            cg.node_class.append(new_id[c])
            cg.node_local.append(n_local[n])
            cg.node_cost.append(float(graph.classes[c][n_local[n]].cost))
            cg.node_children.append(tuple(new_id[ch] for ch in n_children[n]))
        cg.class_nodes.append(ids)
    return cg
