"""A local search over batch groups, after any extractor.

Batching pays only when *all* members of a group switch to their slice of the
shared batched term at once; one member alone pays the whole batched cost.
Greedy extractors judge members one at a time and so miss it, and the ILP may
stop early on large e-graphs. This pass tries each group as one move: switch
every member, choose the cheapest acyclic way to compute what newly becomes
needed (tree-cost choices), and keep the move when the DAG cost drops.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from .egraph import Extraction, ExtractionError, ExtractionGraph, reachable_choice


@dataclass(frozen=True)
class GroupMove:
    """Switch each member class to the given node index (its slice of the batched term)."""

    name: str
    members: dict[int, int]


def tree_choice(graph: ExtractionGraph) -> tuple[list[float], dict[int, int]]:
    """Per-class tree cost and its node: an acyclic fallback choice for any class.

    Knuth's generalization of Dijkstra: a class is final when popped from the
    heap; a node becomes available once all its child classes are final. Each
    chosen node's children were final before it, so the choice is acyclic.
    O(E log V), where a naive fixpoint re-propagates every small improvement.
    """
    n = len(graph.classes)
    best = [math.inf] * n
    pick: dict[int, int] = {}
    waiting: list[list[int]] = []  # per (class, node): unresolved distinct children
    parents: dict[int, list[tuple[int, int]]] = {}
    heap: list[tuple[float, int, int]] = []
    for c, nodes in enumerate(graph.classes):
        for k, node in enumerate(nodes):
            children = set(node.children)
            if not children:
                if node.cost < math.inf:
                    heapq.heappush(heap, (node.cost, c, k))
                continue
            for child in children:
                parents.setdefault(child, []).append((c, k))
            waiting.append([c, k, len(children)])
    remaining = {(w[0], w[1]): w for w in waiting}
    final = [False] * n
    while heap:
        value, c, k = heapq.heappop(heap)
        if final[c]:
            continue
        final[c], best[c], pick[c] = True, value, k
        for parent, pk in parents.get(c, ()):
            entry = remaining[(parent, pk)]
            entry[2] -= 1
            if entry[2] == 0 and not final[parent]:
                node = graph.classes[parent][pk]
                total = node.cost + sum(best[ch] for ch in set(node.children))
                if total < math.inf:
                    heapq.heappush(heap, (total, parent, pk))
    return best, pick


MAX_ROUNDS = 4  # a move can pay only after the group feeding it moved: a few passes suffice


def improve_with_groups(graph: ExtractionGraph, extraction: Extraction, moves: list[GroupMove]) -> tuple[Extraction, list[str]]:
    """Apply every move that lowers the DAG cost, in passes until none does.

    Returns the result and the names of the moves taken.
    """
    if not moves:
        return extraction, []
    _, fallback = tree_choice(graph)
    choice, cost, taken = dict(extraction.choice), extraction.cost, []
    pending = list(moves)
    for _ in range(MAX_ROUNDS):
        before = len(taken)
        choice, cost, pending = _one_pass(graph, fallback, choice, cost, pending, taken)
        if len(taken) == before:
            break
    if not taken:
        return extraction, []
    improved = Extraction(choice=choice, cost=cost, extractor=f"{extraction.extractor}+groups",
                          optimal=False, gap=None, seconds=extraction.seconds)
    return improved, taken


def _one_pass(graph: ExtractionGraph, fallback: dict[int, int], choice: dict[int, int], cost: float,
              moves: list[GroupMove], taken: list[str]) -> tuple[dict[int, int], float, list[GroupMove]]:
    left = []
    for move in moves:
        trial = {**fallback, **choice, **move.members}
        try:
            reached = reachable_choice(graph, trial)
        except ExtractionError:  # the move closes a cycle through current choices: try with fallbacks only
            trial = {**fallback, **move.members}
            try:
                reached = reachable_choice(graph, trial)
            except ExtractionError:
                left.append(move)
                continue
        trial_cost = _cost_of(graph, reached)
        if trial_cost < cost * (1 - 1e-9):
            choice, cost = reached, trial_cost
            taken.append(move.name)
        else:
            left.append(move)
    return choice, cost, left


def _cost_of(graph: ExtractionGraph, reached: dict[int, int]) -> float:
    """DAG cost of a choice already restricted to what the roots reach (no second walk)."""
    return math.fsum(graph.classes[c][k].cost for c, k in reached.items())
