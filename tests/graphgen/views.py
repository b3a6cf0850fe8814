"""Builders of the view and split/cat plumbing.

split, chunk, unbind, narrow, slicing, cat, stack, reshape, flatten,
permute, squeeze, expand: one function per op family, returning False when
the pool has no operand it applies to. ``_cat``, ``_stack``, ``_reshape``,
``_reshape_target`` and ``_permute`` (one op in a random spelling) are shared
with the tangles.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx as fx

from .builder import _Builder, _pos


def _take_pieces(b: _Builder, tup: fx.Node, at_least: int = 1) -> list[fx.Node]:
    """getitem some pieces of a tuple node (sometimes with negative indices)."""
    n = len(b.env[tup])
    k = b.rng.randint(min(at_least, n), n)
    idxs = b.rng.sample(range(n), k)
    out = []
    for i in idxs:
        if b.coin(0.3):
            b.tag("getitem:neg")
            i = i - n
        out.append(b.keep(b.getitem(tup, i)))
    return out


def b_split(b: _Builder) -> bool:
    x = b.pick(lambda t: max(t.shape) >= 2)
    if x is None:
        return False
    d = b.split_dim(x)
    r, n = len(b.shape(x)), b.shape(x)[d]
    dd = b.negd(d, r)
    kind = b.choice(["int", "list", "with_sizes"])
    if kind == "int":
        b.tag("split:int")
        node = b.dim_call(torch.split, "split", x, dd, b.rng.randint(1, n))
    elif kind == "list":
        b.tag("split:list")
        node = b.dim_call(torch.split, "split", x, dd, b.composition(n))
    else:
        b.tag("split:with_sizes")
        node = b.dim_call(torch.split_with_sizes, "split_with_sizes", x, dd, b.composition(n))
    _take_pieces(b, node)
    return True


def b_chunk(b: _Builder) -> bool:
    x = b.pick(lambda t: max(t.shape) >= 2)
    if x is None:
        return False
    d = b.split_dim(x)
    b.tag("chunk")
    node = b.dim_call(torch.chunk, "chunk", x, b.negd(d, len(b.shape(x))), b.rng.randint(1, 4))
    _take_pieces(b, node)
    return True


def b_unbind(b: _Builder) -> bool:
    x = b.pick(lambda t: t.dim() >= 2 and max(t.shape) <= 8)
    if x is None:
        return False
    d = b.rng.randrange(len(b.shape(x)))
    b.tag("unbind")
    dd = b.negd(d, len(b.shape(x)))
    node = b.either(torch.unbind, "unbind", x, dd) if b.coin() else b.either(torch.unbind, "unbind", x, dim=dd)
    _take_pieces(b, node)
    return True


def b_narrow(b: _Builder) -> bool:
    x = b.pick(lambda t: max(t.shape) >= 2)
    if x is None:
        return False
    d = b.split_dim(x)
    n = b.shape(x)[d]
    start = b.rng.randrange(n - 1)
    length = b.rng.randint(1, n - start)
    b.tag("narrow")
    b.keep(b.either(torch.narrow, "narrow", x, b.negd(d, len(b.shape(x))), start, length))
    return True


def b_slice(b: _Builder) -> bool:
    """x[..., a:b], x[:, i], x[a:b:2] via operator.getitem with slice objects."""
    x = b.pick(_pos)
    if x is None:
        return False
    s = b.shape(x)
    d = b.rng.randrange(len(s))
    n = s[d]
    kind = b.choice(["slice", "slice", "select", "step"])
    if kind == "select" and len(s) >= 2:
        b.tag("slice:select")
        i = b.rng.randrange(n)
        entry: Any = i - n if b.coin(0.3) else i
    elif kind == "step" and n >= 3:
        b.tag("slice:step")
        entry = slice(b.rng.randrange(n - 1), None, 2)
    else:
        b.tag("slice:range")
        lo = b.rng.randrange(n)
        hi = b.rng.randint(lo + 1, n)
        entry = slice(lo - n if b.coin(0.3) else lo, None if hi == n and b.coin() else hi)
    if d == len(s) - 1 and d > 0 and b.coin():
        idx: Any = (Ellipsis, entry)  # x[..., a:b]
    else:
        idx = tuple([slice(None)] * d + [entry])
        if len(idx) == 1 and b.coin():
            idx = idx[0]
    b.keep(b.getitem(x, idx))
    return True


def _cat(b: _Builder, parts: list[fx.Node], d: int, rank: int) -> fx.Node:
    """torch.cat / torch.concat / torch.concatenate, dim positional or keyword."""
    dd = b.negd(d, rank)
    target = b.choice([torch.cat, torch.cat, torch.concat, torch.concatenate])
    b.tag("cat")
    if target is torch.concatenate:
        return b.fn(target, parts, axis=dd)
    if b.coin():
        return b.fn(target, parts, dd)
    return b.fn(target, parts, dim=dd)


def _stack(b: _Builder, parts: list[fx.Node], d: int, rank: int) -> fx.Node:
    dd = b.negd(d, rank + 1)
    b.tag("stack")
    return b.fn(torch.stack, parts, dd) if b.coin() else b.fn(torch.stack, parts, dim=dd)


def b_cat(b: _Builder) -> bool:
    x = b.pick(_pos)
    if x is None:
        return False
    r = len(b.shape(x))
    d = b.rng.randrange(r)
    parts = [x]
    for _ in range(b.rng.randint(0, 3)):
        parts.append(b.partner_except(x, d, exclude=parts))
    b.rng.shuffle(parts)
    b.keep(_cat(b, parts, d, r))
    return True


def b_stack(b: _Builder) -> bool:
    x = b.pick(lambda t: 1 <= t.dim() <= 3)
    if x is None:
        return False
    r = len(b.shape(x))
    parts = [x] + [b.partner_same(x) for _ in range(b.rng.randint(0, 3))]
    b.keep(_stack(b, parts, b.rng.randint(0, r), r))
    return True


def _reshape_target(b: _Builder, s: tuple[int, ...]) -> list[int] | None:
    """A different shape with the same numel and rank 1-4 (maybe with a -1)."""
    s = list(s)
    opts = []
    if len(s) >= 2:
        opts.append("merge")
    if len(s) <= 3 and any(v >= 4 and v % 2 == 0 for v in s):
        opts.append("split")
    if len(s) <= 3:
        opts.append("unsq")
    if len(s) >= 2:
        opts.append("flat")
    if not opts:
        return None
    kind = b.choice(opts)
    if kind == "merge":
        i = b.rng.randrange(len(s) - 1)
        out = s[:i] + [s[i] * s[i + 1]] + s[i + 2 :]
    elif kind == "split":
        i = b.choice([j for j, v in enumerate(s) if v >= 4 and v % 2 == 0])
        out = s[:i] + [2, s[i] // 2] + s[i + 1 :]
    elif kind == "unsq":
        i = b.rng.randint(0, len(s))
        out = s[:i] + [1] + s[i:]
    else:
        out = [math.prod(s)]
    if b.coin(0.3):
        out[b.rng.randrange(len(out))] = -1
    return out


def _reshape(b: _Builder, x: fx.Node, target: list[int]) -> fx.Node:
    """view when legal on the concrete value, else reshape; varargs or list."""
    t = b.t(x)
    if t.is_contiguous() and b.coin():
        b.tag("view")
        name = "view"
        return b.meth(name, x, *target) if b.coin() else b.meth(name, x, target)
    b.tag("reshape")
    if b.coin():
        return b.fn(torch.reshape, x, tuple(target))
    return b.meth("reshape", x, *target) if b.coin() else b.meth("reshape", x, target)


def b_reshape(b: _Builder) -> bool:
    x = b.pick(_pos)
    if x is None:
        return False
    target = _reshape_target(b, b.shape(x))
    if target is None:
        return False
    b.keep(_reshape(b, x, target))
    return True


def b_flatten(b: _Builder) -> bool:
    x = b.pick(lambda t: t.dim() >= 2)
    if x is None:
        return False
    r = len(b.shape(x))
    if b.coin():
        b.tag("flatten")
        start = b.rng.randrange(r - 1)
        end = b.rng.randint(start + 1, r - 1)
        b.keep(b.either(torch.flatten, "flatten", x, b.negd(start, r), b.negd(end, r)))
        return True
    d = b.split_dim(x, 4)
    if d is None or b.shape(x)[d] % 2 or r >= 4:
        return False
    b.tag("unflatten")
    n = b.shape(x)[d]
    sizes = (2, n // 2) if b.coin() else (-1, 2)
    b.keep(b.either(torch.unflatten, "unflatten", x, b.negd(d, r), sizes))
    return True


def _permute(b: _Builder, x: fx.Node, perm: list[int]) -> fx.Node:
    b.tag("permute")
    r = len(perm)
    perm = [b.negd(p, r) for p in perm]
    k = b.rng.randrange(3)
    if k == 0:
        return b.fn(torch.permute, x, perm)
    return b.meth("permute", x, *perm) if k == 1 else b.meth("permute", x, perm)


def b_permute(b: _Builder) -> bool:
    x = b.pick(lambda t: t.dim() >= 2)
    if x is None:
        return False
    r = len(b.shape(x))
    kind = b.choice(["permute", "transpose", "movedim"])
    if kind == "permute":
        perm = list(range(r))
        b.rng.shuffle(perm)
        b.keep(_permute(b, x, perm))
    elif kind == "transpose":
        b.tag("transpose")
        d0, d1 = b.rng.sample(range(r), 2)
        if r == 2 and b.coin(0.3):
            b.keep(b.either(torch.t, "t", x))
        else:
            b.keep(b.either(torch.transpose, "transpose", x, b.negd(d0, r), b.negd(d1, r)))
    else:
        b.tag("movedim")
        src, dst = b.rng.sample(range(r), 2)
        b.keep(b.either(torch.movedim, "movedim", x, b.negd(src, r), b.negd(dst, r)))
    return True


def b_squeeze(b: _Builder) -> bool:
    if b.coin():
        x = b.pick(lambda t: t.dim() <= 3)
        if x is None:
            return False
        r = len(b.shape(x))
        b.tag("unsqueeze")
        b.keep(b.dim_call(torch.unsqueeze, "unsqueeze", x, b.negd(b.rng.randint(0, r), r + 1)))
        return True
    x = b.pick(lambda t: t.dim() >= 2 and 1 in t.shape)
    if x is None:
        return False
    b.tag("squeeze")
    r = len(b.shape(x))
    ones = [d for d, v in enumerate(b.shape(x)) if v == 1]
    if b.coin(0.2) and len(ones) < r:
        b.keep(b.either(torch.squeeze, "squeeze", x))
    else:
        b.keep(b.dim_call(torch.squeeze, "squeeze", x, b.negd(b.choice(ones), r)))
    return True


def b_expand(b: _Builder) -> bool:
    x = b.pick(lambda t: t.dim() <= 3 and t.numel() <= 128)
    if x is None:
        return False
    s = list(b.shape(x))
    if 1 in s and b.coin():
        target = [b.choice([2, 3, 4]) if v == 1 else (-1 if b.coin() else v) for v in s]
    else:
        target = [b.choice([2, 3])] + [-1 if b.coin() else v for v in s]
    b.tag("expand")
    b.keep(b.meth("expand", x, *target) if b.coin() else b.meth("expand", x, target))
    return True
