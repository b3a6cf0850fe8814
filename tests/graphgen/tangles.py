"""Builders of multi-node motifs: split/cat tangles and batching candidates.

The tangles are the patterns Optimus' split_cat passes target (split -> cat,
unbind -> stack, runs of getitems, selects, nested cats, the same pointwise op
on every piece, reshape chains, double permutes); the batching candidates are
linears on pieces of one tensor, linears sharing an input, gated linear units,
layer norms of equal shape, and features of two widths sliced from one tensor.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F

from .builder import _DIM_CHOICES, _Builder, _pos
from .compute import _linear, _unary
from .views import _cat, _permute, _reshape, _reshape_target, _stack


def b_split_cat(b: _Builder) -> bool:
    """split -> some getitems -> cat, shuffled/partial, extra inputs, maybe other dim."""
    x = b.pick(lambda t: max(t.shape) >= 2)
    if x is None:
        return False
    d = b.split_dim(x)
    s = b.shape(x)
    r, n = len(s), s[d]
    other = r >= 2 and b.coin(0.3)
    if other:  # equal sections so pieces can be concatenated along another dim
        divs = [k for k in range(1, n) if n % k == 0] or [n]
        sizes: Any = b.choice(divs)
    else:
        sizes = b.composition(n)
    node = b.dim_call(torch.split, "split", x, b.negd(d, r), sizes)
    count = len(b.env[node])
    idxs = list(range(count))
    mode = b.choice(["whole", "shuffled", "partial"])
    if mode == "shuffled":
        b.rng.shuffle(idxs)
    elif mode == "partial" and count > 1:
        lo = b.rng.randrange(count)
        idxs = idxs[lo : b.rng.randint(lo + 1, count)]
    pieces = [b.getitem(node, i) for i in idxs]
    cd = b.choice([e for e in range(r) if e != d]) if other else d
    if b.coin(0.4):  # extra inputs around the pieces
        extra = b.partner_except(pieces[0], cd)
        pieces.insert(b.rng.randint(0, len(pieces)), extra)
    b.tag("tangle:split_cat_other_dim" if other else f"tangle:split_cat_{mode}")
    b.keep(_cat(b, pieces, cd, r))
    return True


def b_unbind_stack(b: _Builder) -> bool:
    x = b.pick(lambda t: 2 <= t.dim() <= 4 and max(t.shape) <= 8)
    if x is None:
        return False
    r = len(b.shape(x))
    d = b.rng.randrange(r)
    node = b.fn(torch.unbind, x, b.negd(d, r)) if b.coin() else b.meth("unbind", x, dim=b.negd(d, r))
    n = len(b.env[node])
    idxs = list(range(n))
    if b.coin(0.3):
        b.rng.shuffle(idxs)
    pieces = [b.getitem(node, i) for i in idxs]
    if b.coin(0.7):
        sd = d if b.coin() else b.rng.randint(0, r - 1)
        b.tag("tangle:unbind_stack" if sd == d else "tangle:unbind_stack_other_dim")
        b.keep(_stack(b, pieces, sd, r - 1))
    else:
        b.tag("tangle:unbind_cat")
        b.keep(_cat(b, pieces, b.rng.randrange(r - 1), r - 1))
    return True


def b_split_squeeze_stack(b: _Builder) -> bool:
    x = b.pick(lambda t: 2 <= t.dim() <= 4 and 2 <= max(t.shape) <= 8)
    if x is None:
        return False
    d = b.split_dim(x)
    r = len(b.shape(x))
    node = b.dim_call(torch.split, "split", x, b.negd(d, r), 1)
    n = len(b.env[node])
    pieces = [b.dim_call(torch.squeeze, "squeeze", b.getitem(node, i), b.negd(d, r)) for i in range(n)]
    b.tag("tangle:split_squeeze_stack")
    b.keep(_stack(b, pieces, d if b.coin(0.7) else b.rng.randint(0, r - 1), r - 1))
    return True


def b_getitem_run_cat(b: _Builder) -> bool:
    """Consecutive getitems of one split, concatenated (merge_getitem_cat, mutate_cat)."""
    x = b.pick(lambda t: max(t.shape) >= 3)
    if x is None:
        return False
    d = b.split_dim(x, 3)
    r, n = len(b.shape(x)), b.shape(x)[d]
    node = b.dim_call(torch.split, "split", x, b.negd(d, r), b.composition(n, 5))
    count = len(b.env[node])
    lo = b.rng.randrange(count)
    hi = b.rng.randint(lo + 1, count)
    run = [b.getitem(node, i) for i in range(lo, hi)]
    b.tag("tangle:getitem_run_cat")
    b.keep(_cat(b, run, d, r))
    for i in b.rng.sample(range(count), b.rng.randint(0, count)):  # other users of the split
        if not lo <= i < hi:
            b.keep(b.getitem(node, i))
    return True


def b_select_cat(b: _Builder) -> bool:
    """cat of unsqueezed selects x[:, i] (or stack of selects): a view of x."""
    x = b.pick(lambda t: 2 <= t.dim() <= 4 and max(t.shape) <= 8)
    if x is None:
        return False
    r = len(b.shape(x))
    d = b.rng.randrange(r)
    n = b.shape(x)[d]
    idxs = list(range(n)) if b.coin(0.7) else sorted(b.rng.sample(range(n), b.rng.randint(1, n)))
    sels = []
    for i in idxs:
        if b.coin():
            sels.append(b.getitem(x, tuple([slice(None)] * d + [i])))
        else:
            sels.append(b.either(torch.select, "select", x, b.negd(d, r), i))
    b.tag("tangle:select_cat")
    if b.coin():
        b.keep(_stack(b, sels, d, r - 1))
    else:
        ups = [b.dim_call(torch.unsqueeze, "unsqueeze", s, d) for s in sels]
        b.keep(_cat(b, ups, d, r))
    return True


def b_nested_cat(b: _Builder) -> bool:
    x = b.pick(_pos)
    if x is None:
        return False
    r = len(b.shape(x))
    d = b.rng.randrange(r)
    inner = _cat(b, [x, b.partner_except(x, d)], d, r)
    d2 = d if b.coin(0.6) else b.rng.randrange(r)
    outer_parts = [inner, b.partner_except(inner, d2)]
    b.rng.shuffle(outer_parts)
    b.tag("tangle:nested_cat")
    b.keep(_cat(b, outer_parts, d2, r))
    return True


def b_pointwise_pieces_cat(b: _Builder) -> bool:
    """split, the same pointwise op on each piece, cat back (sink_cat_after_pointwise)."""
    x = b.pick(lambda t: max(t.shape) >= 2)
    if x is None:
        return False
    d = b.split_dim(x)
    r, n = len(b.shape(x)), b.shape(x)[d]
    node = b.dim_call(torch.split, "split", x, b.negd(d, r), b.composition(n))
    name = b.choice(["relu", "tanh", "sigmoid", "neg", "abs", "clamp", "nan_to_num"])
    outs = [_unary(b, b.getitem(node, i), name) for i in range(len(b.env[node]))]
    b.tag("tangle:pointwise_pieces_cat")
    if b.coin(0.8):
        b.keep(_cat(b, outs, d, r))
    else:
        for o in outs:
            b.keep(o)
    return True


def b_reshape_chain(b: _Builder) -> bool:
    x = b.pick(_pos)
    if x is None:
        return False
    cur = x
    for _ in range(b.rng.randint(2, 3)):
        target = _reshape_target(b, b.shape(cur))
        if target is None:
            break
        cur = _reshape(b, cur, target)
    if b.coin(0.3):  # back to the original shape
        cur = _reshape(b, cur, list(b.shape(x)))
    b.tag("tangle:reshape_chain")
    b.keep(cur)
    return True


def b_permute_twice(b: _Builder) -> bool:
    x = b.pick(lambda t: t.dim() >= 2)
    if x is None:
        return False
    r = len(b.shape(x))
    p1 = list(range(r))
    b.rng.shuffle(p1)
    y = _permute(b, x, p1)
    if b.coin():
        p2 = [p1.index(i) for i in range(r)]  # the inverse: identity overall
    else:
        p2 = list(range(r))
        b.rng.shuffle(p2)
    b.tag("tangle:permute_twice")
    b.keep(_permute(b, y, p2))
    return True


def b_batch_linears(b: _Builder) -> bool:
    """Same-shaped linears on pieces of one tensor (batch_linear candidates)."""
    x = b.pick(lambda t: t.dim() >= 2 and any(v % 2 == 0 for v in t.shape))
    if x is None:
        return False
    s = b.shape(x)
    r = len(s)
    d = b.choice([i for i, v in enumerate(s) if v % 2 == 0])
    m = b.choice([k for k in (2, 3, 4) if s[d] % k == 0] or [2])
    node = (
        b.dim_call(torch.split, "split", x, b.negd(d, r), s[d] // m)
        if b.coin()
        else b.either(torch.chunk, "chunk", x, m, b.negd(d, r))
    )
    bias, n_out = b.coin(0.7), b.choice(_DIM_CHOICES[1:])
    outs = [_linear(b, b.getitem(node, i), n_out, bias) for i in range(len(b.env[node]))]
    b.tag("tangle:batch_linears")
    if b.coin():
        b.keep(_cat(b, outs, r - 1, r) if b.coin() else _stack(b, outs, 0, r))
    else:
        for o in outs:
            b.keep(b.either(torch.relu, "relu", o) if b.coin() else o)
    return True


def b_shared_linears(b: _Builder) -> bool:
    """Several linears reading one input (batch_linear_lhs candidates)."""
    x = b.pick(_pos)
    if x is None:
        return False
    outs = [_linear(b, x, b.choice(_DIM_CHOICES[1:]), b.coin(0.7)) for _ in range(b.rng.randint(2, 4))]
    b.tag("tangle:shared_linears")
    if b.coin():
        b.keep(_cat(b, outs, len(b.shape(x)) - 1, len(b.shape(x))))
    else:
        for o in outs:
            b.keep(o)
    return True


def b_gated_units(b: _Builder) -> bool:
    """Gated linear units: linears (reading one input, or each its own of one shape) whose
    outputs are chunked in halves, ``act(gate) * value``, kept apart, summed or concatenated
    (batch views: one chunk of each member, the columns of a linear on concatenated weights)."""
    x = b.pick(_pos)
    if x is None:
        return False
    shared = b.coin()
    n, half = b.rng.randint(2, 4), b.choice(_DIM_CHOICES[1:])
    inputs = [x] * n if shared else [x] + [b.partner_same(x) for _ in range(n - 1)]
    b.tag("tangle:gated_units")
    act, name = b.choice([(F.silu, "silu"), (torch.sigmoid, "sigmoid"), (torch.tanh, "tanh")])
    d = len(b.shape(x)) - 1
    outs = []
    for xi in inputs:
        y = _linear(b, xi, 2 * half, b.coin(0.7))
        if b.coin():
            halves = b.fn(torch.chunk, y, 2, -1)
            gate, value = (b.fn(operator.getitem, halves, k) for k in (0, 1))
        else:
            gate, value = (b.fn(torch.narrow, y, d, k * half, half) for k in (0, 1))
        outs.append(b.fn(operator.mul, b.either(act, name, gate) if name != "silu" else b.fn(act, gate), value))
    mode = b.choice(["apart", "sum", "cat"])
    if mode == "apart":
        for o in outs:
            b.keep(o)
    elif mode == "sum":
        total = outs[0]
        for o in outs[1:]:
            total = b.fn(operator.add, total, o)
        b.keep(total)
    else:
        b.keep(_cat(b, outs, d, d + 1))
    return True


def b_batch_layer_norms(b: _Builder) -> bool:
    """Equal-shaped layer norms / activations on several values (batching)."""
    x = b.pick(lambda t: t.shape[-1] >= 2)
    if x is None:
        return False
    s = b.shape(x)
    xs = [x] + [b.partner_same(x) for _ in range(b.rng.randint(1, 3))]
    ns = [s[-1]]
    b.tag("tangle:batch_layer_norms")
    for xi in xs:
        y = b.fn(F.layer_norm, xi, ns, b.param(ns, 0.5), b.param(ns, 0.1))
        b.keep(b.either(torch.tanh, "tanh", y) if b.coin(0.4) else y)
    return True


def b_feature_classes(b: _Builder) -> bool:
    """Features of two widths in turn, sliced from one tensor: each normalized, projected
    and activated by its class's function, concatenated (or stacked) in feature order
    (batch views: evenly spaced slices, members interleaved from two groups)."""
    x = b.pick(lambda t: t.dim() >= 2 and t.shape[-1] >= 6)
    if x is None:
        return False
    s = b.shape(x)
    r, size = len(s), s[-1]
    cycle = (2, b.choice([2, 3]))
    widths: list[int] = []
    while sum(widths) + cycle[len(widths) % 2] <= size:
        widths.append(cycle[len(widths) % 2])
    if sum(widths) < size:
        widths.append(size - sum(widths))
    pieces = b.dim_call(torch.split, "split", x, -1, widths)
    n_out = b.choice(_DIM_CHOICES[1:])
    outs = []
    for i, w in enumerate(widths):
        y = b.fn(F.layer_norm, b.getitem(pieces, i), [w], b.param([w], 0.5), b.param([w], 0.1))
        y = _linear(b, y, n_out, True)
        outs.append(b.either(torch.relu, "relu", y) if i % 2 == 0 else b.either(torch.tanh, "tanh", y))
    b.tag("tangle:feature_classes")
    b.keep(_cat(b, outs, r - 1, r) if b.coin(0.7) else _stack(b, outs, 0, r))
    return True


def b_scalar_chain(b: _Builder) -> bool:
    """A chain of tensor-scalar ops, as in scaled residuals (``x * c`` per layer), sometimes
    split into pieces scaled apart and concatenated again (what blew saturation up once)."""
    x = b.pick(_pos)
    if x is None:
        return False
    ops = [
        lambda y: b.fn(operator.mul, y, b.choice([0.5, 2.0, -1.25, 0.75])),
        lambda y: b.fn(operator.truediv, y, b.choice([2.0, 4.0, 0.5])),
        lambda y: b.fn(operator.add, y, b.choice([0.5, -1.0])),
        lambda y: b.fn(operator.sub, y, 0.25),
        lambda y: b.fn(operator.mul, b.choice([3.0, 0.25]), y),
    ]
    y = x
    for _ in range(b.rng.randint(3, 8)):
        y = b.choice(ops)(y)
    d = b.split_dim(y)
    if d is not None and b.coin(0.4):
        sizes = b.composition(b.shape(y)[d])
        pieces = b.dim_call(torch.split, "split", y, d, sizes)
        scaled = [b.choice(ops)(b.getitem(pieces, i)) for i in range(len(sizes))]
        y = _cat(b, scaled, d, len(b.shape(y)))
        b.tag("tangle:scalar_chain_split_cat")
    b.tag("tangle:scalar_chain")
    b.keep(y)
    return True


def b_residual(b: _Builder) -> bool:
    """Residual blocks ``h = h + c * f(h)`` (f: a square linear or an activation), nested."""
    x = b.pick(_pos)
    if x is None:
        return False
    h = x
    for _ in range(b.rng.randint(1, 3)):
        width = b.shape(h)[-1]
        f = _linear(b, h, width, b.coin(0.7)) if b.coin(0.6) else _unary(b, h)
        if b.coin(0.5):
            f = b.fn(operator.mul, f, b.choice([0.5, 0.1]))
        h = b.fn(operator.add, h, f)
    b.tag("tangle:residual")
    b.keep(h)
    return True
