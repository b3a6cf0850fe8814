"""A local search over batch groups, after any extractor.

Batching pays only when *all* members of a group switch to their slice of the
shared batched term at once; one member alone pays the whole batched cost.
Greedy extractors judge members one at a time and so miss it, and the ILP may
stop early on large e-graphs. This pass tries each group as one move: switch
every member, choose the cheapest acyclic way to compute what newly becomes
needed (tree-cost choices), break any cycle the switch closes through the
current choices by re-picking a class on it, and keep the move when the DAG
cost drops.
The moves themselves come from the exported e-graph (:func:`batch_group_moves`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from optimus_eqsat.extract.egraph import CycleError, Extraction, ExtractionError, ExtractionGraph, reachable_choice


@dataclass(frozen=True)
class GroupMove:
    """Switch each member class to the given node index (its slice of the batched term)."""

    name: str
    members: dict[int, int]


def batch_group_moves(
    egraph: Any, groups: Sequence[tuple[int, Sequence[int]]], name_of: Callable[[int], str]
) -> list[GroupMove]:
    """For every batch group: each member's choice of its slice of the batched term.

    ``egraph`` is the exported e-graph (``classes`` of term nodes, ``class_of_id``);
    ``groups`` are (batched term id, member term ids); ``name_of`` names a member
    (the move is named after its first). A group with a member that has no short
    path of views to the batched term gives no move.
    """
    moves = []
    for batched, members in groups:
        target = egraph.class_of_id.get(batched)
        picks: dict[int, int] = {}
        for m in members:
            path = path_to(egraph, egraph.class_of_id[m], target)
            if path is None:
                break
            picks.update(path)
        else:
            moves.append(GroupMove(f"{name_of(members[0])}+{len(members) - 1}", picks))
    return moves


def long_cat_moves(egraph: Any, choice: dict[int, int], lengths: dict[int, int], limit: int) -> list[GroupMove]:
    """For every chosen cat whose list holds more than ``limit`` members (``lengths``: of
    the chosen lists), each other cat node of its class (the same tensor from another
    list: a few views instead of many slices) as a move. Greedy passes value a list by
    its tree cost, which hides what a long list costs as a whole."""
    moves: list[GroupMove] = []
    for c, k in choice.items():
        node = egraph.classes[c][k]
        if node.ctor != "Cat" or lengths.get(node.children[0], 0) <= limit:
            continue
        moves.extend(
            GroupMove(f"cat{c}:{j}", {c: j})
            for j, other in enumerate(egraph.classes[c])
            if j != k and other.ctor == "Cat"
        )
    return moves


def path_to(egraph: Any, start: int, target: int | None, depth: int = 3) -> dict[int, int] | None:
    """Node choices leading from class ``start`` to class ``target`` in at most ``depth`` steps
    (a member's Reshape(Slice(batched)) alternative), or None."""
    if target is None:
        return None
    frontier: list[tuple[int, dict[int, int]]] = [(start, {})]
    for _ in range(depth):
        following: list[tuple[int, dict[int, int]]] = []
        for c, picks in frontier:
            for k, node in enumerate(egraph.classes[c]):
                if node.ctor in ("Id", "LId"):
                    continue
                if target in node.children:
                    return {**picks, c: k}
                following.extend((ch, {**picks, c: k}) for ch in node.children if ch not in picks)
        frontier = following[:64]  # views only: the path is short and narrow
    return None


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


def improve_with_groups(
    graph: ExtractionGraph, extraction: Extraction, moves: list[GroupMove]
) -> tuple[Extraction, list[str]]:
    """Apply every move that lowers the DAG cost, in passes until none does.

    Returns the result and the names of the moves taken.
    """
    choice, cost, taken = dict(extraction.choice), extraction.cost, []
    pending = list(moves)
    fallback: tuple[list[float], dict[int, int]] | None = None  # tree costs and choices, once a move needs them
    for _ in range(MAX_ROUNDS):
        left = []
        for move in pending:
            if not _changes(move, choice):
                left.append(move)
                continue
            if fallback is None:
                fallback = tree_choice(graph)
            trial = _try(graph, fallback, choice, move)
            if trial is not None and trial[1] < cost * (1 - 1e-9):
                choice, cost = trial
                taken.append(move.name)
            else:
                left.append(move)
        if len(left) == len(pending):
            break
        pending = left
    if not taken:
        return extraction, []
    improved = Extraction(
        choice=choice,
        cost=cost,
        extractor=f"{extraction.extractor}+groups",
        optimal=False,
        gap=None,
        seconds=extraction.seconds,
    )
    return improved, taken


def _changes(move: GroupMove, choice: dict[int, int]) -> bool:
    """Whether the move changes the program: some member the roots reach (the only
    classes ``choice`` holds) takes another node. On large graphs the extractor has
    usually made most moves itself, and each trial walks the whole program (0.1 s
    at 2,000 features)."""
    return any(choice.get(c, k) != k for c, k in move.members.items())


MAX_REPAIRS = 16  # cycles a trial may break by re-picking a class on them


def _try(
    graph: ExtractionGraph, fallback: tuple[list[float], dict[int, int]], choice: dict[int, int], move: GroupMove
) -> tuple[dict[int, int], float] | None:
    """The program with the move applied (its reachable choice and DAG cost), or None
    when it closes a cycle even over the tree-cost fallbacks alone.

    A move often closes a cycle through a current choice: the batched term's class also
    holds the stack of the members, which a batched consumer chose while the members were
    still computed alone. Each such cycle is broken by re-picking one class on it that the
    move does not pin: the one whose cheapest other node (by tree cost) adds the least.
    """
    tree_cost, picks = fallback
    base = {**picks, **choice, **move.members}
    banned: set[tuple[int, int]] = set()
    for _ in range(MAX_REPAIRS):
        try:
            reached = reachable_choice(graph, base)
            return reached, _cost_of(graph, reached)
        except CycleError as exc:
            repick = _cheapest_repick(graph, tree_cost, base, exc.cycle, move.members, banned)
        except ExtractionError:
            break
        if repick is None:
            break
        banned.add((repick[0], base[repick[0]]))
        base[repick[0]] = repick[1]
    try:  # over the tree-cost fallbacks alone
        reached = reachable_choice(graph, {**picks, **move.members})
    except ExtractionError:
        return None
    return reached, _cost_of(graph, reached)


def _cheapest_repick(
    graph: ExtractionGraph,
    tree_cost: list[float],
    base: dict[int, int],
    cycle: list[int],
    pinned: dict[int, int],
    banned: set[tuple[int, int]],
) -> tuple[int, int] | None:
    """(class, node) on ``cycle``, not pinned, whose other node costs the least more by tree
    cost than the chosen one; None when no class on the cycle has another finite node."""
    best: tuple[float, int, int] | None = None
    for c in cycle:
        if c in pinned:
            continue
        nodes = graph.classes[c]
        for k, node in enumerate(nodes):
            if k == base[c] or (c, k) in banned or node.cost == math.inf or c in node.children:
                continue
            price = node.cost + math.fsum(tree_cost[ch] for ch in set(node.children))
            if price < math.inf and (best is None or price - tree_cost[c] < best[0]):
                best = (price - tree_cost[c], c, k)
    return None if best is None else (best[1], best[2])


def _cost_of(graph: ExtractionGraph, reached: dict[int, int]) -> float:
    """DAG cost of a choice already restricted to what the roots reach (no second walk)."""
    return math.fsum(graph.classes[c][k].cost for c, k in reached.items())
