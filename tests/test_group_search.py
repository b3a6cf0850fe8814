"""The batch-group local search that runs after extraction."""

from __future__ import annotations

import pytest

from optimus_eqsat.extract.egraph import ENode, Extraction, ExtractionGraph, dag_cost
from optimus_eqsat.extract.group_search import GroupMove, improve_with_groups, tree_choice


def batching_graph(n: int = 5, batched_cost: float = 2.0) -> ExtractionGraph:
    """Roots Y_i = {own kernel (cost 1) | slice_i of B (cost 0)}; B = {batched kernel}."""
    leaf = 0
    b = 1
    classes = [[ENode("x", (), 0.0)], [ENode("batched", (leaf,), batched_cost)]]
    for i in range(n):
        classes.append([ENode(f"own{i}", (leaf,), 1.0), ENode(f"slice{i}", (b,), 0.0)])
    return ExtractionGraph(classes, roots=list(range(2, 2 + n)))


def own_kernels(graph: ExtractionGraph) -> Extraction:
    choice = {c: 0 for c in graph.roots} | {0: 0}
    return Extraction(choice, dag_cost(graph, choice), "test")


def test_group_move_switches_all_members_at_once():
    graph = batching_graph()
    move = GroupMove("all", {c: 1 for c in graph.roots})
    improved, taken = improve_with_groups(graph, own_kernels(graph), [move])
    assert taken == ["all"] and improved.cost == pytest.approx(2.0)
    assert dag_cost(graph, improved.choice) == pytest.approx(improved.cost)


def test_group_move_that_does_not_pay_is_declined():
    graph = batching_graph(batched_cost=9.0)
    start = own_kernels(graph)
    improved, taken = improve_with_groups(graph, start, [GroupMove("all", {c: 1 for c in graph.roots})])
    assert taken == [] and improved is start


def test_group_move_breaks_a_cycle_through_the_stack_of_its_members():
    """The batched term's class also holds the stack of the members, which a consumer chose
    while the members ran alone: switching the members closes a cycle through it. The move
    re-picks that class; it does not revert the whole program to tree-cost choices (which
    would lose the shared class ten outputs reuse, and the move with it)."""
    x, b, shared, consumer = 0, 1, 2, 5
    members, reusers = [3, 4], list(range(6, 16))
    classes = [
        [ENode("x", (), 0.0)],
        [ENode("batched", (x,), 1.0), ENode("stack", tuple(members), 0.5)],
        [ENode("shared", (x,), 3.0)],
    ]
    classes += [[ENode(f"own{i}", (x,), 1.0), ENode(f"slice{i}", (b,), 0.0)] for i in range(2)]
    classes += [[ENode("consume", (b,), 1.0)]]
    classes += [[ENode(f"alone{i}", (x,), 1.0), ENode(f"reuse{i}", (shared,), 0.1)] for i in range(10)]
    graph = ExtractionGraph(classes, roots=[*members, consumer, *reusers])
    choice = {x: 0, b: 1, shared: 0, 3: 0, 4: 0, consumer: 0, **{c: 1 for c in reusers}}
    start = Extraction(choice, dag_cost(graph, choice), "test")
    assert start.cost == pytest.approx(7.5)
    improved, taken = improve_with_groups(graph, start, [GroupMove("members", {3: 1, 4: 1})])
    assert taken == ["members"] and improved.choice[b] == 0 and improved.choice[shared] == 0
    assert improved.cost == pytest.approx(6.0) == dag_cost(graph, improved.choice)


def test_tree_choice_is_acyclic_fallback():
    # class 0 = {leaf | slice(cat(0, 1))}: the fallback never picks the cycle
    graph = ExtractionGraph(
        [[ENode("leaf", (), 1.0), ENode("slice", (2,), 0.0)], [ENode("y", (), 1.0)], [ENode("cat", (0, 1), 1.0)]],
        roots=[0, 2],
    )
    best, pick = tree_choice(graph)
    assert pick[0] == 0 and best[2] == pytest.approx(3.0)
    assert dag_cost(graph, pick) == pytest.approx(3.0)


def test_batch_group_moves_follow_views_to_the_batched_term():
    from types import SimpleNamespace

    from optimus_eqsat.extract.group_search import batch_group_moves, path_to

    def term(ctor, *children):
        return SimpleNamespace(ctor=ctor, children=children)

    # class 0: batched term (id 10); members (ids 11, 12) are own ops or Reshape(Slice(batched))
    egraph = SimpleNamespace(
        class_of_id={10: 0, 11: 1, 12: 3},
        classes=[
            [term("Op2")],
            [term("Op2"), term("Reshape", 2)],
            [term("Slice", 0)],
            [term("Op2"), term("Slice", 0)],
            [term("Op2")],
        ],
    )
    assert path_to(egraph, 1, 0) == {1: 1, 2: 0}
    assert path_to(egraph, 4, 0) is None and path_to(egraph, 1, None) is None
    moves = batch_group_moves(egraph, [(10, [11, 12])], lambda i: f"n{i}")
    assert moves == [GroupMove("n11+1", {1: 1, 2: 0, 3: 1})]
    egraph.class_of_id[13] = 4
    assert batch_group_moves(egraph, [(10, [11, 13])], str) == []  # a member without a path: no move
