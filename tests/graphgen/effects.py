"""Builders of what the optimizer must leave as it is: opaque ops and in-place mutations.

Opaque ops: cumsum, flip, roll, sort, topk, max(dim) and the fx.wrap'd
``opaque_mix``. The in-place motif: a fresh value, reads that do not save it
for backward, mutations (maybe through a view), then reads; ``relu_`` is
always the last mutation (it saves its output).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from . import opaque_mix  # defined in the package's __init__, before this module is imported
from .builder import _Builder, _pos, _sorted_ok
from .compute import _unary


def b_opaque(b: _Builder) -> bool:
    x = b.pick(_pos)
    if x is None:
        return False
    r = len(b.shape(x))
    d = b.rng.randrange(r)
    kind = b.choice(["cumsum", "flip", "roll", "sort", "wrapped", "topk", "max_dim"])
    if kind in ("sort", "topk", "max_dim") and not _sorted_ok(b.t(x), d):
        kind = b.choice(["cumsum", "flip", "roll", "wrapped"])
    b.tag(f"opaque:{kind}")
    dd = b.negd(d, r)
    if kind == "cumsum":
        node = b.dim_call(torch.cumsum, "cumsum", x, dd)
    elif kind == "flip":
        node = b.fn(torch.flip, x, [dd]) if b.coin() else b.meth("flip", x, dd)
    elif kind == "roll":
        node = b.fn(torch.roll, x, 1, dd) if b.coin() else b.meth("roll", x, shifts=-1, dims=dd)
    elif kind == "wrapped":
        node = b.fn(opaque_mix, x, 0.75)
    elif kind == "sort":
        res = b.fn(torch.sort, x, dd) if b.coin() else b.meth("sort", x, dim=dd, descending=True)
        node = b.getitem(res, 0) if b.coin() else b.fn(getattr, res, "values")
    elif kind == "topk":
        k = b.rng.randint(1, b.shape(x)[d])
        res = b.fn(torch.topk, x, k, dd) if b.coin() else b.meth("topk", x, k, dim=dd)
        node = b.getitem(res, 0)
    else:
        kd = b.coin()
        res = b.fn(torch.max, x, dd, kd) if b.coin() else b.meth("max", x, dim=dd, keepdim=kd)
        node = b.getitem(res, 0) if b.coin() else b.fn(getattr, res, "values")
    b.keep(node)
    return True


# -- in-place motif -------------------------------------------------------------


def _view_of(b: _Builder, base: fx.Node) -> tuple[fx.Node, str]:
    """A view of base to mutate through (or base itself)."""
    s = b.shape(base)
    r = len(s)
    opts = ["self"]
    if max(s) >= 2:
        opts += ["slice", "narrow"]
    if r >= 2:
        opts += ["select", "transpose"]
    kind = b.choice(opts)
    if kind == "self":
        return base, kind
    if kind == "slice":
        d = b.split_dim(base)
        idx = tuple([slice(None)] * d + [slice(1, None)])
        return b.getitem(base, idx), kind
    if kind == "narrow":
        d = b.split_dim(base)
        return b.either(torch.narrow, "narrow", base, d, 0, s[d] - 1), kind
    if kind == "select":
        return b.either(torch.select, "select", base, 0, s[0] - 1), kind
    return b.meth("transpose", base, 0, 1), kind


def b_inplace(b: _Builder) -> bool:
    """fresh value -> non-saving reads -> mutations (maybe via a view) -> reads."""
    x = b.pick(lambda t: t.dim() >= 1 and t.numel() >= 2)
    if x is None:
        return False
    how = b.choice(["clone", "add", "x*1", "x+0"])
    # x*1 / x+0 are fresh tensors in eager: removing them would alias x.
    if how == "clone":
        base = b.meth("clone", x) if b.coin() else b.fn(torch.clone, x)
    elif how == "add":
        base = b.fn(operator.add, x, b.partner_same(x))
    elif how == "x*1":
        base = b.fn(operator.mul, x, 1.0)
    else:
        base = b.fn(operator.add, x, 0)
    if b.coin(0.6):  # read before the mutation; add/neg/sum do not save base
        before = b.choice(
            [lambda: b.fn(operator.add, base, 1.0), lambda: b.meth("neg", base), lambda: b.meth("sum", base, -1)]
        )()
        b.keep(before)
    target, vkind = _view_of(b, base)
    b.tag(f"inplace:view_{vkind}")
    ops = b.rng.sample(["add_", "mul_", "copy_", "relu_"], b.rng.randint(1, 3))
    if "relu_" in ops:  # relu_ saves its output: nothing may mutate after it
        ops.remove("relu_")
        ops.append("relu_")
    for op in ops:
        b.tag(f"inplace:{op}")
        if op == "add_":
            other = b.partner_same(target, exclude=(base,)) if b.coin() else 0.5
            node = b.meth("add_", target, other)
        elif op == "mul_":
            node = (
                b.meth("mul_", target, b.choice([2.0, -1.0, 0.5]))
                if b.coin(0.6)
                else b.meth("mul_", target, b.partner_same(target, exclude=(base,)))
            )
        elif op == "copy_":
            node = b.meth(
                "copy_",
                target,
                b.cheap_unary(x) if b.shape(x) == b.shape(target) else b.partner_same(target, exclude=(base,)),
            )
        else:
            node = b.meth("relu_", target) if b.coin() else b.fn(torch.relu_, target)
        b.effects.add(node)
    # Reads after the mutation. An explicit one always: base's only users so
    # far are the view and the in-place ops, so it is no sink by itself.
    after = _unary(b, base, b.choice(["tanh", "neg", "abs", "sigmoid"])) if b.coin() else b.fn(operator.mul, base, 1.5)
    b.keep(after)
    b.keep(base)  # and later ops may read the mutated value too
    if target is not base and b.coin():
        b.keep(b.fn(operator.add, target, 1.0) if b.coin() else target)
    return True
