"""Batching candidates: which translated nodes could join a batch, and how they may group.

A candidate is an FX node translated to one op term over whole FX values
(``Unary/Binary/Scalar/Op1-Op3`` of ``Id`` operands). Candidates of one fusion
key are split greedily into groups whose members do not depend on each other
(one pass in graph order), so a group never builds a cycle through its own
members; groups are then built in dependency order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar, cast

from optimus_eqsat.term import Binary, Id, Op1, Op2, Op3, Scalar, Term, Unary
from optimus_eqsat.translate import Translation

_OP_TERMS = (Unary, Binary, Scalar, Op1, Op2, Op3)
_Key = TypeVar("_Key", bound=Hashable)  # a fusion key


@dataclass(frozen=True)
class Candidate:
    """One FX node that could join a batch: its op term's constructor, key and operand ids."""

    node: int
    ctor: str
    key: str
    operands: tuple[int, ...]
    scalar: float | None = None  # the Scalar constructor's constant

    @property
    def scalar_key(self) -> str:
        """The constant as egglog reads it ("" for other constructors): members batch only
        when equal as written (0.0 and -0.0 are not one constant)."""
        return "" if self.scalar is None else repr(float(self.scalar))


def parse_candidate(i: int, term: Term) -> Candidate | None:
    """The candidate of node ``i`` unioned with ``term``, or None when it is not an op of whole values."""
    if not isinstance(term, _OP_TERMS):
        return None
    children = (
        [term.x]
        if isinstance(term, (Unary, Scalar, Op1))
        else [term.a, term.b]
        if isinstance(term, (Binary, Op2))
        else [term.a, term.b, term.c]
    )
    if not all(isinstance(ch, Id) for ch in children):
        return None
    return Candidate(
        i, term.ctor, term.op, tuple(cast(Id, ch).i for ch in children), term.c if isinstance(term, Scalar) else None
    )


def independent_groups(t: Translation, keyed: Mapping[_Key, list[Candidate]]) -> dict[_Key, list[list[Candidate]]]:
    """Split each key's candidates into groups with no dependency inside a group.

    The groups are those of the greedy rule "in graph order, a candidate joins the first
    group none of whose members it depends on", computed without comparing it with
    every group: that first group is one past the last group holding an ancestor of it
    (every group up to that one holds an ancestor: the greedy rule put that ancestor
    there because each earlier group held an ancestor of it; no later group holds
    one). So a candidate's group is 1 + the highest group among its same-key
    ancestors (through data and through the order of effects on one memory,
    ``Translation.effect_deps``), found in one pass in graph order (topological) carrying, per node, the
    highest group per key among the candidates it depends on. Linear in the graph for
    a bounded number of keys, where testing candidates pairwise would be quadratic on
    chains (over a minute on a 30,000-node chain of unary ops).
    """
    keys_of: dict[int, list[_Key]] = defaultdict(list)
    for key, members in keyed.items():
        for c in members:
            keys_of[c.node].append(key)
    by_node = {c.node: c for members in keyed.values() for c in members}
    index = t.index
    empty: dict[_Key, int] = {}
    highest: list[dict[_Key, int]] = []  # per node: key -> highest group of a candidate it depends on or is
    groups: dict[_Key, list[list[Candidate]]] = {key: [] for key in keyed}
    effect_deps = t.effect_deps
    for i, node in enumerate(t.gm.graph.nodes):
        inputs = [highest[index[a]] for a in node.all_input_nodes]
        inputs += [highest[d] for d in effect_deps.get(i, ())]  # an effect waits for those before it
        if not inputs:
            below = empty
        elif all(h is inputs[0] for h in inputs):
            below = inputs[0]  # shared, never mutated
        else:
            below = dict(inputs[0])
            for h in inputs[1:]:
                for key, g in h.items():
                    if g > below.get(key, -1):
                        below[key] = g
        if i in keys_of:
            below = dict(below)
            for key in keys_of[i]:
                g = below.get(key, -1) + 1
                if g == len(groups[key]):
                    groups[key].append([])
                groups[key][g].append(by_node[i])
                below[key] = g
        highest.append(below)
    return groups


def build_order(groups: list[list[Candidate]]) -> list[int]:
    """Indices of ``groups`` with every group after the groups whose members it reads,
    so its operand stacks can be views of their batched terms (views.py).

    Groups can read each other both ways (then the order inside that strongly
    connected set is by last member); ties go to the group whose last member comes first.
    """
    import networkx as nx  # (here: a compile the persistent cache answers never batches)

    owners: dict[int, list[int]] = defaultdict(list)
    for g, group in enumerate(groups):
        for c in group:
            owners[c.node].append(g)
    reads = nx.DiGraph()
    reads.add_nodes_from(range(len(groups)))
    reads.add_edges_from(
        (h, g) for g, group in enumerate(groups) for c in group for o in c.operands for h in owners.get(o, ()) if h != g
    )
    last = [group[-1].node for group in groups]
    dag = nx.condensation(reads)
    members = nx.get_node_attributes(dag, "members")
    order: list[int] = []
    for scc in nx.lexicographical_topological_sort(dag, key=lambda s: min(last[g] for g in members[s])):
        order.extend(sorted(members[scc], key=lambda g: last[g]))
    return order


def shapes_known(t: Translation, c: Candidate) -> bool:
    """Whether the shapes of a candidate and of all its operands are known."""
    return c.node in t.shapes and all(o in t.shapes for o in c.operands)
