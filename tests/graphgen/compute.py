"""Builders of compute ops: linears, matmuls, embedding, norms, reductions, pointwise ops.

Numerical care: the operand of ``exp`` is bounded, divisions are by
``abs(y) + 1``, ``sqrt``/``log`` take ``abs(x) + 1``, and ``where`` masks are
only made where every element clears the threshold by a margin. ``_linear``
and ``_unary`` (one op in a random spelling) are shared with the tangles and
the in-place motif; ``_UNARY`` and ``_BINARY`` name the pointwise families.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import torch
import torch.fx as fx
import torch.nn.functional as F

from .builder import _DIM_CHOICES, _NUM_EMB, _Builder, _margin, _pos, _sep


def _linear(b: _Builder, x: fx.Node, n_out: int, bias: bool, weight: fx.Node | None = None) -> fx.Node:
    k = b.shape(x)[-1]
    w = weight if weight is not None else b.param((n_out, k), 1.0 / math.sqrt(k))
    bb = b.param((n_out,), 0.1) if bias else None
    b.tag("linear" if bias else "linear:nobias")
    kind = b.rng.randrange(3)
    if kind == 0:
        return b.fn(F.linear, x, w, bb)
    if kind == 1:
        return b.fn(F.linear, x, w, bias=bb) if bias else b.fn(F.linear, x, w)
    return b.fn(torch._C._nn.linear, x, w, bb)


def b_linear(b: _Builder) -> bool:
    x = b.pick(_pos)
    if x is None:
        return False
    b.keep(_linear(b, x, b.choice(_DIM_CHOICES[1:]), b.coin(0.7)))
    return True


def b_matmul(b: _Builder) -> bool:
    kind = b.choice(["matmul", "mm", "bmm", "addmm", "gram"])
    if kind in ("mm", "addmm"):
        x = b.pick(lambda t: t.dim() == 2)
    elif kind == "bmm":
        x = b.pick(lambda t: t.dim() == 3)
    else:
        x = b.pick(lambda t: t.dim() >= 2)
    if x is None:
        return False
    s = b.shape(x)
    k, n = s[-1], b.choice(_DIM_CHOICES[1:])
    scale = 1.0 / math.sqrt(k)
    b.tag(kind)
    if kind == "matmul":
        w = b.param((k, n), scale)
        c = b.rng.randrange(3)
        node = b.fn(operator.matmul, x, w) if c == 0 else b.either(torch.matmul, "matmul", x, w)
    elif kind == "gram":  # x @ x^T: both operands are activations
        node = b.fn(operator.matmul, x, b.either(torch.transpose, "transpose", x, -1, -2))
        node = b.fn(operator.mul, node, scale)
    elif kind == "mm":
        node = b.either(torch.mm, "mm", x, b.param((k, n), scale))
    elif kind == "bmm":
        node = b.either(torch.bmm, "bmm", x, b.param((s[0], k, n), scale))
    else:
        bias, w = b.param((n,), 0.1), b.param((k, n), scale)
        node = b.fn(torch.addmm, bias, x, w) if b.coin() else b.fn(torch.addmm, bias, x, w, beta=0.5, alpha=2.0)
    b.keep(node)
    return True


def b_embedding(b: _Builder) -> bool:
    if b.index_input is None:
        return False
    b.tag("embedding")
    w = b.param((_NUM_EMB, b.choice(_DIM_CHOICES[1:])))
    b.keep(b.fn(F.embedding, b.index_input, w))
    return True


def b_layer_norm(b: _Builder) -> bool:
    x = b.pick(lambda t: t.shape[-1] >= 2)
    if x is None:
        return False
    s = b.shape(x)
    k = b.rng.randint(1, min(2, len(s)))
    ns = list(s[-k:])
    b.tag("layer_norm")
    if b.coin(0.7):
        w, bb = b.param(ns, 0.5), b.param(ns, 0.1)
        b.keep(b.fn(F.layer_norm, x, ns, w, bb, 1e-5) if b.coin() else b.fn(F.layer_norm, x, ns, weight=w, bias=bb))
    else:
        b.keep(b.fn(F.layer_norm, x, ns, eps=1e-5))
    return True


def b_softmax(b: _Builder) -> bool:
    x = b.pick(_pos)
    if x is None:
        return False
    r = len(b.shape(x))
    d = b.negd(b.rng.randrange(r), r)
    b.tag("softmax")
    c = b.rng.randrange(3)
    if c == 0:
        b.keep(b.fn(torch.softmax, x, d))
    elif c == 1:
        b.keep(b.meth("softmax", x, d) if b.coin() else b.meth("softmax", x, dim=d))
    else:
        b.keep(b.fn(F.softmax, x, dim=d))
    return True


def b_reduce(b: _Builder) -> bool:
    x = b.pick(_pos)
    if x is None:
        return False
    r = len(b.shape(x))
    name = b.choice(["sum", "mean"])
    b.tag(name)
    target = torch.sum if name == "sum" else torch.mean
    keepdim = b.coin()
    if b.coin(0.2) and r >= 2:
        dims = sorted(b.rng.sample(range(r), 2))
        node = b.either(target, name, x, [b.negd(d, r) for d in dims], keepdim=keepdim)
    else:
        d = b.negd(b.rng.randrange(r), r)
        if b.coin():
            node = b.either(target, name, x, d, keepdim)
        else:
            node = b.either(target, name, x, dim=d, keepdim=keepdim)
    b.keep(node)
    return True


def _exp_operand(b: _Builder, x: fx.Node) -> fx.Node:
    # Keep exp's input bounded so outputs stay comparable in float32.
    if float(b.t(x).abs().max()) > 3.0:
        return b.either(torch.tanh, "tanh", x)
    return x


_UNARY: dict[str, Callable[[_Builder, fx.Node], fx.Node]] = {
    "relu": lambda b, x: b.choice([lambda: b.fn(torch.relu, x), lambda: b.fn(F.relu, x), lambda: b.meth("relu", x)])(),
    "tanh": lambda b, x: b.either(torch.tanh, "tanh", x),
    "sigmoid": lambda b, x: b.either(torch.sigmoid, "sigmoid", x),
    "gelu": lambda b, x: b.fn(F.gelu, x) if b.coin() else b.fn(F.gelu, x, approximate="tanh"),
    "silu": lambda b, x: b.fn(F.silu, x),
    "exp": lambda b, x: b.either(torch.exp, "exp", _exp_operand(b, x)),
    "neg": lambda b, x: b.choice([lambda: b.fn(operator.neg, x), lambda: b.either(torch.neg, "neg", x)])(),
    "abs": lambda b, x: b.either(torch.abs, "abs", x),
    "clamp": lambda b, x: b.choice(
        [
            lambda: b.fn(torch.clamp, x, min=-0.5, max=0.5),
            lambda: b.meth("clamp", x, -1.0, 1.0),
            lambda: b.meth("clamp", x, min=0.0),
        ]
    )(),
    "nan_to_num": lambda b, x: b.either(torch.nan_to_num, "nan_to_num", x),
    "detach": lambda b, x: b.either(torch.detach, "detach", x),
    "contiguous": lambda b, x: b.meth("contiguous", x),
    "sqrt": lambda b, x: b.either(torch.sqrt, "sqrt", b.fn(operator.add, b.either(torch.abs, "abs", x), 1.0)),
    "log": lambda b, x: b.either(torch.log, "log", b.fn(operator.add, b.meth("abs", x), 1.0)),
}


def _unary(b: _Builder, x: fx.Node, name: str | None = None) -> fx.Node:
    name = name or b.choice(sorted(_UNARY))
    b.tag(f"unary:{name}")
    return _UNARY[name](b, x)


def b_unary(b: _Builder) -> bool:
    x = b.pick(_pos)
    if x is None:
        return False
    b.keep(_unary(b, x))
    return True


def _mask(b: _Builder, x: fx.Node) -> fx.Node | None:
    """x > thr (some spelling) with every element clear of thr by a margin."""
    t = b.t(x)
    for thr in (0.0, 0.1, -0.1, 0.3, -0.3, 0.05):
        if _sep((t - thr).abs().flatten(), _margin(t)):
            c = b.rng.randrange(3)
            if c == 0:
                return b.fn(operator.gt, x, thr)
            if c == 1:
                return b.either(torch.gt, "gt", x, thr)
            return b.fn(operator.lt, x, thr)
    return None


_BINARY: dict[str, Callable[[_Builder, fx.Node, fx.Node], fx.Node | None]] = {
    "add": lambda b, x, y: b.choice(
        [
            lambda: b.fn(operator.add, x, y),
            lambda: b.either(torch.add, "add", x, y),
            lambda: b.fn(torch.add, x, y, alpha=0.5),
        ]
    )(),
    "sub": lambda b, x, y: b.fn(operator.sub, x, y) if b.coin() else b.either(torch.sub, "sub", x, y),
    "mul": lambda b, x, y: b.fn(operator.mul, x, y) if b.coin() else b.either(torch.mul, "mul", x, y),
    "div": lambda b, x, y: (
        lambda den: b.fn(operator.truediv, x, den) if b.coin() else b.either(torch.div, "div", x, den)
    )(b.fn(operator.add, b.either(torch.abs, "abs", y), 1.0)),
    "maximum": lambda b, x, y: b.either(torch.maximum, "maximum", x, y),
    "minimum": lambda b, x, y: b.either(torch.minimum, "minimum", x, y),
    "where": lambda b, x, y: (lambda m: None if m is None else b.fn(torch.where, m, x, y))(_mask(b, x)),
}


def b_binary(b: _Builder) -> bool:
    x = b.pick(_pos)
    if x is None:
        return False
    name = b.choice(sorted(_BINARY))
    y = b.partner_broadcast(x)
    if b.coin():
        x, y = y, x
    node = _BINARY[name](b, x, y)
    if node is None:
        return False
    b.tag(f"binary:{name}")
    b.keep(node)
    return True


def b_scalar(b: _Builder) -> bool:
    """Tensor-scalar arithmetic, and identities the optimizer should remove."""
    x = b.pick(_pos)
    if x is None:
        return False
    ident = {
        "x*1": lambda: b.fn(operator.mul, x, 1) if b.coin() else b.meth("mul", x, 1.0),
        "x+0": lambda: b.fn(operator.add, x, 0) if b.coin() else b.fn(operator.add, 0.0, x),
        "x-0": lambda: b.fn(operator.sub, x, 0.0),
        "x/1": lambda: b.fn(operator.truediv, x, 1.0),
        "negneg": lambda: b.fn(operator.neg, b.either(torch.neg, "neg", x)),
    }
    scal = {
        "mul": lambda: b.fn(operator.mul, b.choice([2.0, -0.5, 3]), x) if b.coin() else b.fn(operator.mul, x, 0.25),
        "add": lambda: b.fn(operator.add, x, 1.5) if b.coin() else b.either(torch.add, "add", x, -2.0),
        "rsub": lambda: b.fn(operator.sub, 1.0, x),
        "div": lambda: b.fn(operator.truediv, x, 4.0),
        "pow": lambda: b.fn(operator.pow, b.either(torch.tanh, "tanh", x), 2),
    }
    if b.coin(0.4):
        name = b.choice(sorted(ident))
        b.tag(f"identity:{name}")
        b.keep(ident[name]())
    else:
        name = b.choice(sorted(scal))
        b.tag(f"scalar:{name}")
        b.keep(scal[name]())
    return True
