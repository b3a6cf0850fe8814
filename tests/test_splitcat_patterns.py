"""One row per Inductor split/cat Optimus pattern (the coverage table of rewrites/README.md):
the pattern as a torch function, what must remain after optimization, and a
numeric check (forward and gradients) against eager.

The same table is in rewrites/README.md with the rules that cover each row.
"""

from __future__ import annotations

import pytest
import torch

from optimus_eqsat import optimize_graph
from tests.helpers import op_counts, optimize_and_check

SPLITS = {"split", "chunk", "unbind", "narrow", "getitem", "select", "slice"}
CATS = {"cat", "stack"}


def no_split_or_cat(counts) -> bool:
    return not (set(counts) & (SPLITS | CATS))


def p1_normalize(x):  # method/function spellings, negative dims, axis=
    a, b = x.split(6, -1)
    c, d = torch.split(x, [6, 6], dim=1)
    return torch.cat([a, b], axis=-1) + torch.concat((c, d), 1)


def p2_split_size_one(x):
    (only,) = torch.split(x, 12, dim=1)
    return only.relu()


def p3_merge_splits(x):
    a, b = torch.split(x, [4, 8], dim=1)
    c, d = torch.split(b, [4, 4], dim=1)
    return torch.cat([a, c, d], dim=1).tanh()


def p4_split_cat_whole(x):
    return torch.cat(torch.split(x, 3, dim=1), dim=1).sigmoid()


def p4_split_cat_partial(x):
    s = torch.split(x, 3, dim=1)
    return torch.cat([s[1], s[2]], dim=1).exp()


def p4_split_cat_extra_inputs(x, y):
    s = torch.split(x, 3, dim=1)
    return torch.cat([y, s[0], s[1], s[2], s[3], y], dim=1).neg()


def p4_split_cat_other_dim(x):
    return torch.cat(torch.split(x, 4, dim=1), dim=0).abs()


def p5_split_squeeze_stack(x):
    y = x.view(3, 4, 3)
    s = torch.split(y, 1, dim=1)
    return torch.stack([s[i].squeeze(1) for i in range(4)], dim=1).relu()


def p6_unbind_stack_same_dim(x):
    return torch.stack(torch.unbind(x, dim=1), dim=1).relu()


def p6_unbind_stack_other_dim(x):
    return torch.stack(torch.unbind(x, dim=1), dim=0).relu()


def p7_getitem_run_cat(x):
    s = torch.split(x, 2, dim=1)
    return torch.cat([s[1], s[2], s[3]], dim=1).relu()


def p9_long_run(x):
    s = torch.split(x, 1, dim=1)
    return torch.cat([s[i] for i in range(1, 11)], dim=1).relu()


def p10_unbind_cat(x):
    return torch.cat(torch.unbind(x.view(3, 3, 4), dim=1), dim=1).relu()


def p11_split_stack(x):
    return torch.stack(torch.split(x, 4, dim=1), dim=1).relu()


def p11_split_stack_other_dim(x):
    return torch.stack(torch.split(x, 4, dim=1), dim=0).relu()


def p13_split_reshape_stack(x):
    s = torch.split(x, 4, dim=1)
    return torch.stack([s[i].reshape(3, 2, 2) for i in range(3)], dim=1).relu()


def p15_pointwise_then_cat(x):
    s = torch.split(x, 4, dim=1)
    return torch.cat([torch.relu(s[i]) for i in range(3)], dim=1)


def p15_cat_then_pointwise(x, y):
    return torch.relu(torch.cat([x, y], dim=1))


def p18_select_cat(x):
    y = x.view(3, 3, 4)
    return torch.cat([y[:, 0], y[:, 1], y[:, 2]], dim=1).relu()


def p19_unsqueeze_select_cat(x):
    y = x.view(3, 3, 4)
    return torch.cat([y[:, i].unsqueeze(1) for i in range(3)], dim=1).relu()


def nested_cats(x, y):
    return torch.cat([torch.cat([x, y], dim=1), x], dim=1).relu()


def view_chains(x):
    return x.reshape(12, 3).reshape(3, 12).t().t().transpose(0, 1).permute(1, 0).relu()


ROWS = [
    # (pattern, inputs, check on the remaining op counts)
    (p1_normalize, [(3, 12)], no_split_or_cat),
    (p2_split_size_one, [(3, 12)], no_split_or_cat),
    (p3_merge_splits, [(3, 12)], no_split_or_cat),
    (p4_split_cat_whole, [(3, 12)], no_split_or_cat),
    (p4_split_cat_partial, [(3, 12)], lambda c: not set(c) & CATS and c["narrow"] == 1),
    (p4_split_cat_extra_inputs, [(3, 12), (3, 2)], lambda c: c["cat"] == 1 and not set(c) & SPLITS),
    (p4_split_cat_other_dim, [(3, 12)], no_split_or_cat),
    (p5_split_squeeze_stack, [(3, 12)], no_split_or_cat),
    (p6_unbind_stack_same_dim, [(3, 12)], no_split_or_cat),
    (p6_unbind_stack_other_dim, [(3, 12)], no_split_or_cat),
    (p7_getitem_run_cat, [(3, 12)], lambda c: not set(c) & CATS and c["narrow"] == 1),
    (p9_long_run, [(3, 12)], lambda c: not set(c) & CATS and c["narrow"] == 1),
    (p10_unbind_cat, [(3, 12)], no_split_or_cat),
    (p11_split_stack, [(3, 12)], no_split_or_cat),
    (p11_split_stack_other_dim, [(3, 12)], no_split_or_cat),
    (p13_split_reshape_stack, [(3, 12)], no_split_or_cat),
    (p15_pointwise_then_cat, [(3, 12)], lambda c: no_split_or_cat(c) and c["relu"] == 1),
    (p15_cat_then_pointwise, [(3, 4), (3, 5)], lambda c: c["cat"] == 1 and c["relu"] == 1),
    (p18_select_cat, [(3, 12)], no_split_or_cat),
    (p19_unsqueeze_select_cat, [(3, 12)], no_split_or_cat),
    (nested_cats, [(3, 4), (3, 5)], lambda c: c["cat"] == 1),
    (view_chains, [(3, 12)], lambda c: c["permute"] + c["transpose"] + c["t"] <= 1 and c["reshape"] + c["view"] == 0),
]


@pytest.mark.parametrize("pattern, shapes, check", ROWS, ids=[r[0].__name__ for r in ROWS])
def test_pattern(pattern, shapes, check):
    inputs = tuple(torch.randn(*s) for s in shapes)
    optimized = optimize_and_check(pattern, *inputs)
    counts = op_counts(optimized)
    assert check(counts), f"{pattern.__name__}: left {dict(counts)}"


def test_reports_rules_fired():
    optimized = optimize_and_check(p4_split_cat_whole, torch.randn(3, 12))
    fired = optimized.meta["optimus_eqsat"].rules_fired
    assert fired.get("cat-run-merge", 0) > 0 and fired.get("slice-full", 0) > 0


# Long runs (cat-run rules in rewrites/generated.py grow runs by doubling spans):
# unequal piece widths, run lengths that are not powers of two, interrupted runs.


def _run_37_unit_pieces(x):
    return torch.cat(torch.split(x, 1, dim=1), dim=1).relu()


def _run_ragged_pieces(x):
    return torch.cat(torch.split(x, [1, 2, 3, 4, 5, 6, 7, 8, 1], dim=1), dim=1).relu()


def _runs_around_another_tensor(x, y):
    s = torch.split(x, 1, dim=1)
    return torch.cat([s[i] for i in range(10)] + [y] + [s[i] for i in range(10, 21)], dim=1).relu()


def _runs_out_of_order(x):
    s = torch.split(x, 1, dim=1)
    return torch.cat([s[i] for i in range(20, 37)] + [s[i] for i in range(13)], dim=1).relu()


@pytest.mark.parametrize(
    "pattern, shapes, most_cat_inputs",
    [
        (_run_37_unit_pieces, [(3, 37)], 0),
        (_run_ragged_pieces, [(3, 37)], 0),
        (_runs_around_another_tensor, [(3, 37), (3, 5)], 3),
        (_runs_out_of_order, [(3, 37)], 2),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_long_runs_merge_into_one_piece_each(pattern, shapes, most_cat_inputs):
    inputs = tuple(torch.randn(*s) for s in shapes)
    optimized = optimize_and_check(pattern, *inputs)
    cats = [n for n in optimized.graph.nodes if n.op == "call_function" and n.target in (torch.cat, torch.concat)]
    assert sum(len(n.args[0]) for n in cats) <= most_cat_inputs, optimized.code
    assert not (set(op_counts(optimized)) & {"split", "chunk", "unbind"}), optimized.code


def test_cat_of_mixed_dtypes_stays_as_written():
    # torch.cat promotes mixed dtypes; moving a unary op into such a cat would change where
    # the promotion happens (found by the rule checker: unary-cat, cat-unary)
    def fn(a, b):
        return torch.relu(torch.cat([a, b], dim=1)) * 2

    a, b = torch.randn(3, 4), torch.randn(3, 4, dtype=torch.float64)
    optimized = optimize_graph(torch.fx.symbolic_trace(fn), (a, b), raise_on_error=True)
    assert "cat of mixed dtypes" in optimized.meta["optimus_eqsat"].opaque_nodes.values()
    torch.testing.assert_close(optimized(a, b), fn(a, b))
