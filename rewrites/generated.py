"""Rank-dependent rules, generated for ranks up to MAX_RANK.

egglog 13 has no vector insert or gather primitive, so rules that permute or
insert dims are written out per rank here instead of by hand.
"""

from __future__ import annotations

MAX_RANK = 5  # recommendation and transformer graphs stay at rank <= 4; 5 leaves room


def _vec(items: list[str]) -> str:
    return f"(vec-of {' '.join(items)})" if items else "(vec-empty)"


def _movedim_perm(rank: int, src: int, dst: int) -> list[int]:
    perm = list(range(rank))
    perm.pop(src)
    perm.insert(dst, src)
    return perm


def permute_shape_rules() -> str:
    """shape(Permute(x, p)) = [shape(x)[p[0]], ...] for each rank."""
    rules = []
    for r in range(1, MAX_RANK + 1):
        dims = [f"(vec-get s (vec-get p {i}))" for i in range(r)]
        rules.append(
            f"(rule ((= t (Permute x p)) (= s (shape x)) (= (vec-length p) {r}))"
            f" ((set (shape t) {_vec(dims)})) :ruleset shapes :name \"shape-permute-r{r}\")"
        )
    return "\n".join(rules)


def permute_permute_rules() -> str:
    """permute(permute(x, p), q) = permute(x, p[q]): folds transpose-twice chains."""
    rules = []
    for r in range(2, MAX_RANK + 1):
        composed = [f"(vec-get p (vec-get q {i}))" for i in range(r)]
        rules.append(
            f"(rule ((= t (Permute (Permute x p) q)) (= (vec-length q) {r}))"
            f" ((union t (Permute x {_vec(composed)}))) :ruleset splitcat :name \"permute-permute-r{r}\")"
        )
    return "\n".join(rules)


def select_movedim_rules() -> str:
    """A unit slice along d, reshaped to move (or drop) its unit dim, is a unit slice of movedim(x, d, e).

    Subsumes unbind_stack (6), split_stack_to_cats (11), unbind_stack_to_slices (12)
    and unbind->cat on another dim (10): after this rule the pieces are adjacent
    slices of one permuted tensor, which cat-adjacent-slices merges.
    """
    rules = []
    for r in range(2, MAX_RANK):
        for d in range(r):
            for e in range(r):
                if d == e:
                    continue
                perm = _movedim_perm(r, d, e)
                moved = ["1" if p == d else f"(vec-get sx {p})" for p in perm]
                squeezed = [f"(vec-get sx {p})" for p in range(r) if p != d]
                target = f"(Slice (Permute x {_vec([str(p) for p in perm])}) {e} i (+ i 1))"
                rules.append(
                    f"(rule ((= t (Reshape (Slice x {d} i j) s)) (= j (+ i 1)) (= sx (shape x)) (= (vec-length sx) {r})"
                    f" (= s {_vec(moved)})) ((union t {target}))"
                    f" :ruleset splitcat :name \"select-movedim-r{r}-{d}to{e}\")"
                )
                rules.append(
                    f"(rule ((= t (Reshape (Slice x {d} i j) s)) (= j (+ i 1)) (= sx (shape x)) (= (vec-length sx) {r})"
                    f" (= s {_vec(squeezed)})) ((union t (Reshape {target} s)))"
                    f" :ruleset splitcat :name \"select-movedim-squeezed-r{r}-{d}to{e}\")"
                )
    return "\n".join(rules)
