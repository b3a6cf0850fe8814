"""Batching candidates: which translated nodes could join a batch, and how they may group.

A candidate is an FX node translated to one op term over whole FX values
(``Unary/Binary/Scalar/Op1-Op3`` of ``Id`` operands). Candidates of one fusion
key are split greedily into groups whose members do not depend on each other
(a bitset of candidate ancestors per node), so a group never builds a cycle
through its own members; groups are then built in dependency order.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import networkx as nx

from ...term import Binary, Id, Op1, Op2, Op3, Scalar, Term, Unary
from ...translate import Translation

_OP_TERMS = (Unary, Binary, Scalar, Op1, Op2, Op3)


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
    children = [term.x] if isinstance(term, (Unary, Scalar, Op1)) else \
        [term.a, term.b] if isinstance(term, (Binary, Op2)) else [term.a, term.b, term.c]
    if not all(isinstance(ch, Id) for ch in children):
        return None
    return Candidate(i, term.ctor, term.op, tuple(ch.i for ch in children),
                     term.c if isinstance(term, Scalar) else None)


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
    so its operand stacks can be views of their batched terms (views.py).

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


def shapes_known(t: Translation, c: Candidate) -> bool:
    """Whether the shapes of a candidate and of all its operands are known."""
    return c.node in t.shapes and all(o in t.shapes for o in c.operands)
