"""What every acyclic program must contain: the need sets of the exact extractor.

``need(d)`` (:func:`class_needs`) is the set of classes every acyclic term of class
``d`` contains: the greatest fixpoint of
``need(d) = {d} | AND_nodes OR_children need(child)``, with Python ints as
bitsets and None for a class with no acyclic term. Less the class itself, it
is a strict partial order on the classes with terms (:func:`need_pairs`
gives its Hasse pairs).

``below(n)`` (:func:`node_needs`), for a node n of class c with a child in
its own cyclic component, is the need of n's children computed with c banned:
every acyclic program picking n holds those classes under c.

extract/ilp_reduce.py drops the nodes these sets prove cyclic;
extract/ilp_model.py turns them into need rows, cycle conflicts and lifted
reach arcs. Why, and what they bought: docs/ilp.md.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from optimus_eqsat.extract.egraph import CompactGraph


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


def class_needs(cg: CompactGraph) -> list[int | None]:
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


def need_pairs(cg: CompactGraph, need: list[int | None]) -> list[tuple[int, int]]:
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
        for d in set_bits(v):
            cover |= need[d] & ~(1 << d)  # type: ignore[operator]
        pairs.extend((c, d) for d in set_bits(v & ~cover))
    return pairs


def set_bits(mask: int):
    """Indices of the set bits of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _needs_avoiding(
    cg: CompactGraph, members: list[int], banned: int, need: list[int | None], parents_in: list[list[int]]
) -> dict[int, int | None]:
    """``need`` on one component's classes for terms that do not use class ``banned``.

    Same fixpoint as :func:`class_needs`, restricted to ``members`` and to bits of
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


def node_needs(cg: CompactGraph, need: list[int | None], parts=None) -> dict[int, int | None]:
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
