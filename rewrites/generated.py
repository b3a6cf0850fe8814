"""Rank-dependent rules, generated for ranks up to MAX_RANK.

egglog 13 has no vector insert or gather primitive, so rules that permute or
insert dims are written out per rank here instead of by hand.
"""

from __future__ import annotations

from optimus_eqsat.term import NON_SLICE_TENSOR_CTORS

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
            f' ((set (shape t) {_vec(dims)})) :ruleset shapes :name "shape-permute-r{r}")'
        )
    return "\n".join(rules)


def permute_permute_rules() -> str:
    """permute(permute(x, p), q) = permute(x, p[q]): folds transpose-twice chains."""
    rules = []
    for r in range(2, MAX_RANK + 1):
        composed = [f"(vec-get p (vec-get q {i}))" for i in range(r)]
        rules.append(
            f"(rule ((= t (Permute (Permute x p) q)) (= (vec-length q) {r}))"
            f' ((union t (Permute x {_vec(composed)}))) :ruleset splitcat :name "permute-permute-r{r}")'
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
                # Only inside a cat list on dim e: that is where the moved piece can merge.
                query = (
                    f"(= l (TCons t rest)) (= {e} (ldim rest)) (= t (Reshape (Slice x {d} i j) s))"
                    f" (= j (+ i 1)) (= sx (shape x)) (= (vec-length sx) {r})"
                )
                rules.append(
                    f"(rule ({query} (= s {_vec(moved)})) ((union t {target}))"
                    f' :ruleset splitcat :name "select-movedim-r{r}-{d}to{e}")'
                )
                rules.append(
                    f"(rule ({query} (= s {_vec(squeezed)})) ((union t (Reshape {target} s)))"
                    f' :ruleset splitcat :name "select-movedim-squeezed-r{r}-{d}to{e}")'
                )
    return "\n".join(rules)


def slice_as_select_rules() -> str:
    """A k-wide piece x[a:a+k] along d (k | a, k | n) is select a/k of x unflattened to (n/k, k).

    Subsumes split_cat (4) with cat dim != split dim, split_stack_to_cats (11)
    and split->stack on another dim: once pieces are selects, select-movedim and
    flat-slice turn the cat or stack into a view of one reshaped tensor. Only
    fires where that can pay: under a reshape, or in a cat list on another dim.
    """
    rules = []
    for r in range(1, MAX_RANK):
        for d in range(r):
            unflat = [f"(vec-get sx {j})" for j in range(d)] + ["(/ n k)", "k"]
            unflat += [f"(vec-get sx {j})" for j in range(d + 1, r)]
            target = f"(Reshape (Slice (Reshape x {_vec(unflat)}) {d} (/ a k) (+ (/ a k) 1)) st)"
            common = (
                f"(= t (Slice x {d} a b)) (= sx (shape x)) (= (vec-length sx) {r}) (= k (- b a)) (> k 0)"
                f" (= n (vec-get sx {d})) (>= n 0) (= 0 (% a k)) (= 0 (% n k)) (= st (shape t))"
            )  # n >= 0: not symbolic
            # Under a reshape only wider pieces: a unit piece already is a select, and
            # re-selecting it would add a unit dim per iteration.
            contexts = {"cat": f"(= l (TCons t rest)) (!= {d} (ldim rest))", "reshape": "(= u (Reshape t s2))"}
            for where, context in contexts.items():
                wide = " (> k 1)" if where == "reshape" else ""
                rules.append(
                    f"(rule ({context} {common}{wide}) ((union t {target}))"
                    f' :ruleset splitcat :name "slice-as-select-{where}-r{r}-{d}")'
                )
    return "\n".join(rules)


def slice_cat_member_rules() -> str:
    """A piece of a cat inside one member (not itself a piece) is a piece of that member.

    split_cat (4) with extra inputs, shuffled or partial. Written per member
    constructor so a member that is a Slice takes only the composing rule.
    """
    rules = []
    for ctor in NON_SLICE_TENSOR_CTORS:  # every constructor a tensor can have other than Slice
        rules.append(
            f"(rule ((memberpiece t h d a b) (= h {ctor.pattern()})) ((union t (Slice h d a b)))"
            f' :ruleset splitcat :name "slice-cat-member-{ctor.name}")'
        )
    return "\n".join(rules)


def reshape_trailing_rules() -> str:
    """A reshape of a piece that keeps the dims up to the cut regroups only trailing dims:
    reshape(x[.., a:b, ..], s) == reshape(x, s with x's size at the cut)[.., a:b, ..].

    Subsumes move_reshape_out_of_split_stack (13): pieces reshaped before a stack
    become pieces of one reshaped tensor, which the cat rules then merge. Valid
    because the reshape is: equal leading dims make the trailing sizes' products equal.
    Not for an empty piece (b == a: its reshape says nothing of x's trailing dims; the
    rule checker found the counterexample).
    """
    rules = []
    for d in range(MAX_RANK - 1):
        for r in range(d + 1, MAX_RANK + 1):
            lead = " ".join(f"(= (vec-get s {j}) (vec-get sx {j}))" for j in range(d))
            rules.append(
                f"(rule ((= t (Reshape (Slice x {d} a b) s)) (= (vec-length s) {r}) (= sx (shape x))"
                f" (< {d} (vec-length sx)) {lead} (= (vec-get s {d}) (- b a)) (> b a))"  # an empty piece need not
                f" ((union t (Slice (Reshape x (vec-set s {d} (vec-get sx {d}))) {d} a b)))"
                f' :ruleset splitcat :name "reshape-trailing-r{r}-{d}")'
            )
    return "\n".join(rules)
