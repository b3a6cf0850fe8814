"""Term builders: long lists are chunked, and seeded chunks agree with the shape rules."""

from __future__ import annotations

import itertools

from optimus_eqsat import rewrites
from optimus_eqsat.saturate import EGraphSession, Limits
from optimus_eqsat.term import (
    MAX_INLINE_LIST,
    Cat,
    Fact,
    Id,
    KnownShape,
    Leaf,
    LId,
    ListFacts,
    ListTerm,
    Union,
    cons_list,
)


def _list_facts(n: int, sizes: list[int] | None) -> tuple[list[Fact], ListTerm]:
    facts: list[Fact] = []
    ids = itertools.count(1000)
    for i, width in enumerate([1 + i % 3 for i in range(n)]):
        facts += [Union(Id(i), Leaf(i)), KnownShape(Id(i), (2, width))]
    head = cons_list([Id(i) for i in range(n)], 1, facts.append, lambda: next(ids), sizes)
    facts.append(Union(Id(999), Cat(head)))
    return facts, head


def test_seeded_chunks_carry_dim_and_suffix_size():
    n = 3 * MAX_INLINE_LIST + 5
    sizes = [1 + i % 3 for i in range(n)]
    facts, _ = _list_facts(n, sizes)
    seeds = [f for f in facts if isinstance(f, ListFacts)]
    assert len(seeds) == 3  # one per named chunk; the head chunk stays inline
    # named from the end: first the last 5 items, last the suffix after the head chunk
    assert seeds[0].size == sum(sizes[3 * MAX_INLINE_LIST :])
    assert seeds[-1].size == sum(sizes[MAX_INLINE_LIST:])
    assert [(f.name, f.dim) for f in seeds] == [(LId(k), 1) for k in range(1000, 1003)]
    assert seeds[0].render() == f"(set (ldim (LId 1000)) 1)\n(set (lsize (LId 1000)) {seeds[0].size})"
    assert not any(isinstance(f, ListFacts) for f in _list_facts(n, None)[0])


def test_seeded_sizes_agree_with_the_shape_rules():
    # lsize and ldim have no merge: a seed that disagrees with what the shape rules
    # derive makes egglog fail, so loading and settling checks every seed.
    n = 5 * MAX_INLINE_LIST + 3
    sizes = [1 + i % 3 for i in range(n)]
    facts, _ = _list_facts(n, sizes)
    session = EGraphSession([rewrites.builtin_rulesets()["splitcat"]])
    session.load(facts, fx_nodes=n)
    session.saturate(Limits(max_iterations=2))
    (out,) = session._run("(extract (shape (Id 999)))")
    assert str(out).strip() == f"(vec-of 2 {sum(sizes)})"
