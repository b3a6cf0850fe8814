"""Term builders: long lists are chunked, and seeded chunks agree with the shape rules."""

from __future__ import annotations

import itertools

from optimus_eqsat import rewrites
from optimus_eqsat.saturate import EGraphSession, Limits
from optimus_eqsat.terms import MAX_INLINE_LIST, cons_list, vec


def _list_facts(n: int, sizes: list[int] | None) -> tuple[list[str], str]:
    facts: list[str] = []
    ids = itertools.count(1000)
    for i, width in enumerate([1 + i % 3 for i in range(n)]):
        facts += [f"(union (Id {i}) (Leaf {i}))", f"(set (shape (Id {i})) {vec((2, width))})"]
    head = cons_list([f"(Id {i})" for i in range(n)], 1, facts.append, lambda: next(ids), sizes)
    facts.append(f"(union (Id 999) (Cat {head}))")
    return facts, head


def test_seeded_chunks_carry_dim_and_suffix_size():
    n = 3 * MAX_INLINE_LIST + 5
    sizes = [1 + i % 3 for i in range(n)]
    facts, _ = _list_facts(n, sizes)
    seeds = [f for f in facts if f.startswith("(set (lsize")]
    assert len(seeds) == 3  # one per named chunk; the head chunk stays inline
    # named from the end: first the last 5 items, last the suffix after the head chunk
    assert seeds[0].endswith(f" {sum(sizes[3 * MAX_INLINE_LIST:])})")
    assert seeds[-1].endswith(f" {sum(sizes[MAX_INLINE_LIST:])})")
    assert all(f"(set (ldim (LId {k})) 1)" in facts for k in range(1000, 1003))
    assert not any(f.startswith("(set (l") for f in _list_facts(n, None)[0])


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
