"""Seeded random FX-graph generator: the input side of the differential fuzzer.

``random_graph(seed)`` builds a ``torch.fx.GraphModule`` directly with
``torch.fx.Graph`` from the ops of optimus-eqsat's term language (split/cat/view
plumbing, linears, norms, pointwise ops) plus, on request, ops the optimizer does
not know (opaque ops, tuple-returning ops) and in-place mutations.

How it stays valid: every emitted node is *evaluated while it is built* on
concrete example tensors (``_Builder.env``), so shapes are never guessed -- a
builder reads the real shape of its operands, and the eager semantics of
in-place ops and views are mirrored exactly.  Builders are small functions, one
per op family, registered in ``BUILDERS``; each tags the families it used so
tests can assert coverage (``GeneratedGraph.families``).

Numerical care (so the differential test is not flaky):
  * operands of ``exp`` are bounded, divisions are by ``abs(y) + 1``,
    ``sqrt``/``log`` take ``abs(x) + 1``;
  * comparison masks, ``sort``/``topk``/``max(dim)`` are only applied to values
    whose concrete elements are separated from thresholds / from each other by
    a margin, so rounding differences cannot flip a decision;
  * values that grow large or non-finite are never reused as operands.

Autograd care (so ``backward`` works in eager): in-place ops only touch fresh
intermediates created inside the in-place motif (never placeholders,
parameters or their views), reads before a mutation only use ops that do not
save their input for backward, and ``relu_`` is always the last mutation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import operator
import random
from collections import Counter
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.passes.shape_prop import ShapeProp

__all__ = [
    "GeneratedGraph",
    "random_graph",
    "random_module",
    "opaque_mix",
    "BUILDERS",
    "ALL_FAMILIES",
    "single_thread",
]


def opaque_mix(x: torch.Tensor, scale: float) -> torch.Tensor:
    """A user function the optimizer cannot know: a leaf for ``symbolic_trace``."""
    # Python-level control flow on a static attribute, so it stays a black box.
    if x.dim() >= 2:
        return x * scale + x.flip(-1) * (1.0 - scale)
    return x * scale + 0.25


torch.fx.wrap("opaque_mix")


@dataclasses.dataclass
class GeneratedGraph:
    """One generated program.

    gm: the graph module (parameters live on it as attributes when params=True).
    example_inputs: one tensor per placeholder, in placeholder order.
    description: human-readable summary (seed, options, families used).
    families: how often each op family tag was emitted.
    """

    gm: fx.GraphModule
    example_inputs: tuple[torch.Tensor, ...]
    description: str
    families: Counter = dataclasses.field(default_factory=Counter)


# ---------------------------------------------------------------------------
# builder state
# ---------------------------------------------------------------------------

_MAX_NUMEL = 1024
_MAX_ABS = 100.0
_DIM_CHOICES = (1, 2, 2, 3, 4, 4, 6, 8)


class _Builder:
    """Graph under construction plus its concrete evaluation."""

    def __init__(self, seed: int, *, opaque: bool, inplace: bool, params: bool) -> None:
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.opaque, self.inplace, self.params = opaque, inplace, params
        self.graph = fx.Graph()
        self.root = torch.nn.Module()
        self.env: dict[fx.Node, Any] = {}  # concrete value of every node
        self.pool: list[fx.Node] = []  # float tensors usable as operands
        self.floats: list[fx.Node] = []  # every float tensor an op produced
        self.effects: set[fx.Node] = set()  # in-place nodes (never sinks)
        self.inputs: list[torch.Tensor] = []
        self.index_input: Optional[fx.Node] = None
        self.last_ph: Optional[fx.Node] = None
        self.n_params = 0
        self.fam: Counter = Counter()

    # -- node emission -----------------------------------------------------
    def _concrete(self, arg: Any) -> Any:
        return fx.node.map_arg(arg, lambda n: self.env[n])

    def emit(self, op: str, target: Any, args: tuple = (), kwargs: Optional[dict] = None) -> fx.Node:
        """Add a node and evaluate it on the concrete values of its inputs."""
        kwargs = kwargs or {}
        node = self.graph.create_node(op, target, args, kwargs)
        a, k = self._concrete(args), self._concrete(kwargs)
        with torch.no_grad():
            if op == "call_function":
                val = target(*a, **k)
            elif op == "call_method":
                val = getattr(a[0], target)(*a[1:], **k)
            else:  # pragma: no cover - only call_* are emitted here
                raise ValueError(op)
        self.env[node] = val
        if isinstance(val, torch.Tensor) and val.is_floating_point():
            self.floats.append(node)
        return node

    def fn(self, target: Callable, *args: Any, **kwargs: Any) -> fx.Node:
        return self.emit("call_function", target, args, kwargs)

    def meth(self, name: str, *args: Any, **kwargs: Any) -> fx.Node:
        return self.emit("call_method", name, args, kwargs)

    def either(self, target: Optional[Callable], name: Optional[str], *args: Any, **kwargs: Any) -> fx.Node:
        """Function or method spelling of the same op, chosen at random."""
        if name is not None and (target is None or self.coin()):
            return self.meth(name, *args, **kwargs)
        assert target is not None
        return self.fn(target, *args, **kwargs)

    def dim_call(self, target: Optional[Callable], name: Optional[str], x: Any, d: int, *pre: Any, **kw: Any) -> fx.Node:
        """Op taking ``dim`` last, positional or as ``dim=`` at random."""
        if self.coin():
            return self.either(target, name, x, *pre, d, **kw)
        return self.either(target, name, x, *pre, dim=d, **kw)

    def getitem(self, x: fx.Node, idx: Any) -> fx.Node:
        return self.fn(operator.getitem, x, idx)

    # -- inputs and parameters ---------------------------------------------
    def _placeholder(self, name: str, value: torch.Tensor) -> fx.Node:
        # Placeholders are kept at the top of the graph, in creation order.
        ctx = (
            self.graph.inserting_after(self.last_ph)
            if self.last_ph is not None
            else self.graph.inserting_before(None)
        )
        with ctx:
            node = self.graph.placeholder(name)
        self.last_ph = node
        self.env[node] = value.clone()
        self.inputs.append(value)
        return node

    def rand(self, shape: Sequence[int], scale: float = 1.0) -> torch.Tensor:
        return torch.randn(tuple(shape), generator=self.gen) * scale

    def param(self, shape: Sequence[int], scale: float = 1.0) -> fx.Node:
        """A weight: get_attr of an nn.Parameter, or a placeholder if params=False."""
        value = self.rand(shape, scale)
        name = f"w{self.n_params}"
        self.n_params += 1
        if not self.params:
            return self._placeholder(name, value)
        self.root.register_parameter(name, torch.nn.Parameter(value))
        node = self.graph.get_attr(name)
        self.env[node] = value.clone()
        return node

    # -- randomness helpers ------------------------------------------------
    def coin(self, p: float = 0.5) -> bool:
        return self.rng.random() < p

    def choice(self, seq: Sequence[Any]) -> Any:
        return seq[self.rng.randrange(len(seq))]

    def tag(self, *families: str) -> None:
        self.fam.update(families)

    def t(self, n: fx.Node) -> torch.Tensor:
        return self.env[n]

    def shape(self, n: fx.Node) -> tuple[int, ...]:
        return tuple(self.env[n].shape)

    def negd(self, d: int, rank: int) -> int:
        """Spell a dim as negative sometimes (normalization must handle both)."""
        return d - rank if self.coin(0.35) else d

    def keep(self, n: fx.Node) -> fx.Node:
        """Make a float tensor available as an operand if it is well-behaved."""
        v = self.env[n]
        if (
            isinstance(v, torch.Tensor)
            and v.is_floating_point()
            and 1 <= v.dim() <= 4
            and 0 < v.numel() <= _MAX_NUMEL
            and bool(torch.isfinite(v).all())
            and float(v.abs().max()) <= _MAX_ABS
        ):
            self.pool.append(n)
        return n

    def pick(self, pred: Callable[[torch.Tensor], bool] = lambda t: True, exclude: Sequence[fx.Node] = ()) -> Optional[fx.Node]:
        """A pool value satisfying ``pred``, biased to recent ones (deep chains)."""
        cands = [n for n in self.pool if n not in exclude and pred(self.env[n])]
        if not cands:
            return None
        weights = [i + 1 for i in range(len(cands))]
        return self.rng.choices(cands, weights=weights, k=1)[0]

    def split_dim(self, x: fx.Node, min_size: int = 2) -> Optional[int]:
        dims = [d for d, s in enumerate(self.shape(x)) if s >= min_size]
        return self.choice(dims) if dims else None

    def composition(self, n: int, max_parts: int = 4) -> list[int]:
        """Random sizes (all >= 1) summing to n."""
        k = self.rng.randint(1, min(n, max_parts))
        cuts = sorted(self.rng.sample(range(1, n), k - 1)) if k > 1 else []
        bounds = [0, *cuts, n]
        return [bounds[i + 1] - bounds[i] for i in range(k)]

    # -- derived operands ----------------------------------------------------
    def cheap_unary(self, x: fx.Node) -> fx.Node:
        """A new value of x's shape (when the pool has no partner)."""
        kind = self.rng.randrange(4)
        if kind == 0:
            n = self.either(torch.tanh, "tanh", x)
        elif kind == 1:
            n = self.either(torch.sigmoid, "sigmoid", x)
        elif kind == 2:
            n = self.fn(operator.mul, x, 0.5)
        else:
            n = self.either(torch.neg, "neg", x)
        return self.keep(n)

    def partner_except(self, x: fx.Node, d: int, exclude: Sequence[fx.Node] = ()) -> fx.Node:
        """A value with x's shape on every dim but d (an extra cat input)."""
        s = self.shape(x)
        r = len(s)

        def ok(t: torch.Tensor) -> bool:
            return t.dim() == r and all(t.shape[i] == s[i] for i in range(r) if i != d)

        p = self.pick(ok, exclude=exclude) if self.coin(0.7) else None
        if p is not None:
            return p
        if s[d] >= 2 and self.coin(0.4):  # a narrower piece of x along d
            length = self.rng.randint(1, s[d] - 1)
            return self.keep(self.either(torch.narrow, "narrow", x, d, 0, length))
        return self.cheap_unary(x)

    def partner_same(self, x: fx.Node, exclude: Sequence[fx.Node] = ()) -> fx.Node:
        s = self.shape(x)
        p = self.pick(lambda t: tuple(t.shape) == s, exclude=(x, *exclude)) if self.coin(0.7) else None
        return p if p is not None else self.cheap_unary(x)

    def partner_broadcast(self, x: fx.Node) -> fx.Node:
        """Same shape, a suffix shape, or a keepdim reduction of x (broadcasts)."""
        s = self.shape(x)
        r = self.rng.random()
        if r < 0.5:
            return self.partner_same(x)
        if r < 0.75 and len(s) >= 2:
            suffix = s[self.rng.randint(1, len(s) - 1):]
            p = self.pick(lambda t: tuple(t.shape) == suffix)
            if p is not None:
                return p
            return self.param(suffix)
        d = self.rng.randrange(len(s))
        return self.keep(self.either(torch.mean, "mean", x, d, keepdim=True))


def _pos(t: torch.Tensor) -> bool:
    return t.dim() >= 1


def _sep(values: torch.Tensor, margin: float) -> bool:
    return bool(values.numel() == 0 or values.min() > margin)


def _margin(t: torch.Tensor) -> float:
    return 1e-3 * max(1.0, float(t.abs().max()))


def _sorted_ok(t: torch.Tensor, d: int) -> bool:
    """Elements along d are pairwise separated (sort/topk/max ties are unstable)."""
    if t.shape[d] < 2:
        return True
    s = t.sort(dim=d).values
    return _sep(s.diff(dim=d), _margin(t))


# ---------------------------------------------------------------------------
# builders: one small function per op family; return False when not applicable
# ---------------------------------------------------------------------------

Builder = Callable[[_Builder], bool]


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


def _reshape_target(b: _Builder, s: tuple[int, ...]) -> Optional[list[int]]:
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
        out = s[:i] + [s[i] * s[i + 1]] + s[i + 2:]
    elif kind == "split":
        i = b.choice([j for j, v in enumerate(s) if v >= 4 and v % 2 == 0])
        out = s[:i] + [2, s[i] // 2] + s[i + 1:]
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


def _linear(b: _Builder, x: fx.Node, n_out: int, bias: bool, weight: Optional[fx.Node] = None) -> fx.Node:
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


def _unary(b: _Builder, x: fx.Node, name: Optional[str] = None) -> fx.Node:
    name = name or b.choice(sorted(_UNARY))
    b.tag(f"unary:{name}")
    return _UNARY[name](b, x)


def b_unary(b: _Builder) -> bool:
    x = b.pick(_pos)
    if x is None:
        return False
    b.keep(_unary(b, x))
    return True


def _mask(b: _Builder, x: fx.Node) -> Optional[fx.Node]:
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


_BINARY: dict[str, Callable[[_Builder, fx.Node, fx.Node], Optional[fx.Node]]] = {
    "add": lambda b, x, y: b.choice(
        [lambda: b.fn(operator.add, x, y), lambda: b.either(torch.add, "add", x, y), lambda: b.fn(torch.add, x, y, alpha=0.5)]
    )(),
    "sub": lambda b, x, y: b.fn(operator.sub, x, y) if b.coin() else b.either(torch.sub, "sub", x, y),
    "mul": lambda b, x, y: b.fn(operator.mul, x, y) if b.coin() else b.either(torch.mul, "mul", x, y),
    "div": lambda b, x, y: (lambda den: b.fn(operator.truediv, x, den) if b.coin() else b.either(torch.div, "div", x, den))(
        b.fn(operator.add, b.either(torch.abs, "abs", y), 1.0)
    ),
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


# -- split/cat tangles (the patterns Optimus' split_cat passes target) -----


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
        idxs = idxs[lo:b.rng.randint(lo + 1, count)]
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
    node = b.dim_call(torch.split, "split", x, b.negd(d, r), s[d] // m) if b.coin() else b.either(torch.chunk, "chunk", x, m, b.negd(d, r))
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


# -- opaque ops ---------------------------------------------------------------


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
        before = b.choice([lambda: b.fn(operator.add, base, 1.0), lambda: b.meth("neg", base), lambda: b.meth("sum", base, -1)])()
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
            node = b.meth("mul_", target, b.choice([2.0, -1.0, 0.5])) if b.coin(0.6) else b.meth("mul_", target, b.partner_same(target, exclude=(base,)))
        elif op == "copy_":
            node = b.meth("copy_", target, b.cheap_unary(x) if b.shape(x) == b.shape(target) else b.partner_same(target, exclude=(base,)))
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


# (name, weight, builder, needs) -- needs is "" / "opaque" / "inplace"
BUILDERS: list[tuple[str, float, Builder, str]] = [
    ("split", 3, b_split, ""),
    ("chunk", 1, b_chunk, ""),
    ("unbind", 1, b_unbind, ""),
    ("narrow", 1, b_narrow, ""),
    ("slice", 2, b_slice, ""),
    ("cat", 2, b_cat, ""),
    ("stack", 1, b_stack, ""),
    ("reshape", 2, b_reshape, ""),
    ("flatten", 1, b_flatten, ""),
    ("permute", 2, b_permute, ""),
    ("squeeze", 1.5, b_squeeze, ""),
    ("expand", 0.7, b_expand, ""),
    ("linear", 2, b_linear, ""),
    ("matmul", 1.5, b_matmul, ""),
    ("embedding", 1, b_embedding, ""),
    ("layer_norm", 1, b_layer_norm, ""),
    ("softmax", 1, b_softmax, ""),
    ("reduce", 1, b_reduce, ""),
    ("unary", 3, b_unary, ""),
    ("binary", 3, b_binary, ""),
    ("scalar", 2, b_scalar, ""),
    ("split_cat", 3, b_split_cat, ""),
    ("unbind_stack", 1.5, b_unbind_stack, ""),
    ("split_squeeze_stack", 1, b_split_squeeze_stack, ""),
    ("getitem_run_cat", 1.5, b_getitem_run_cat, ""),
    ("select_cat", 1, b_select_cat, ""),
    ("nested_cat", 1, b_nested_cat, ""),
    ("pointwise_pieces_cat", 1.5, b_pointwise_pieces_cat, ""),
    ("reshape_chain", 1, b_reshape_chain, ""),
    ("permute_twice", 1, b_permute_twice, ""),
    ("batch_linears", 1.5, b_batch_linears, ""),
    ("shared_linears", 1, b_shared_linears, ""),
    ("batch_layer_norms", 0.7, b_batch_layer_norms, ""),
    ("feature_classes", 0.7, b_feature_classes, ""),
    ("opaque", 2, b_opaque, "opaque"),
    ("inplace", 5, b_inplace, "inplace"),
]

_NUM_EMB = 10

#: every family tag some seed must produce (test_graphgen asserts coverage)
ALL_FAMILIES: tuple[str, ...] = tuple(
    ["split:int", "split:list", "split:with_sizes", "getitem:neg", "chunk", "unbind", "narrow"]
    + ["slice:select", "slice:step", "slice:range", "cat", "stack", "view", "reshape", "flatten", "unflatten"]
    + ["permute", "transpose", "movedim", "squeeze", "unsqueeze", "expand"]
    + ["linear", "linear:nobias", "matmul", "mm", "bmm", "addmm", "gram", "embedding", "layer_norm", "softmax"]
    + ["sum", "mean"]
    + [f"unary:{n}" for n in _UNARY]
    + [f"binary:{n}" for n in _BINARY]
    + ["identity:x*1", "identity:x+0", "identity:x-0", "identity:x/1", "identity:negneg"]
    + ["scalar:mul", "scalar:add", "scalar:rsub", "scalar:div", "scalar:pow"]
    + [
        "tangle:split_cat_whole",
        "tangle:split_cat_shuffled",
        "tangle:split_cat_partial",
        "tangle:split_cat_other_dim",
        "tangle:unbind_stack",
        "tangle:unbind_stack_other_dim",
        "tangle:unbind_cat",
        "tangle:split_squeeze_stack",
        "tangle:getitem_run_cat",
        "tangle:select_cat",
        "tangle:nested_cat",
        "tangle:pointwise_pieces_cat",
        "tangle:reshape_chain",
        "tangle:permute_twice",
        "tangle:batch_linears",
        "tangle:shared_linears",
        "tangle:batch_layer_norms",
        "tangle:feature_classes",
    ]
    + [f"opaque:{k}" for k in ("cumsum", "flip", "roll", "sort", "wrapped", "topk", "max_dim")]
    + [f"inplace:{k}" for k in ("add_", "mul_", "copy_", "relu_")]
    + [f"inplace:view_{k}" for k in ("self", "slice", "narrow", "select", "transpose")]
)


# ---------------------------------------------------------------------------
# assembling a graph
# ---------------------------------------------------------------------------


def _make_inputs(b: _Builder) -> None:
    """1-3 placeholders; related shapes so ops find partners; maybe a long index."""
    rank = b.rng.randint(1, 4)
    base = [b.choice(_DIM_CHOICES) for _ in range(rank)]
    if max(base) == 1:
        base[-1] = 4
    n_inputs = b.rng.randint(1, 3)
    want_index = n_inputs >= 2 and b.coin(0.35)
    for i in range(n_inputs):
        if want_index and i == n_inputs - 1:
            shape = [b.rng.randint(1, 6) for _ in range(b.rng.randint(1, 2))]
            idx = torch.randint(0, _NUM_EMB, shape, generator=b.gen)
            b.index_input = b._placeholder("idx", idx)
            continue
        if i == 0 or b.coin(0.5):
            shape = list(base)
        elif b.coin(0.5):
            shape = list(base)
            j = b.rng.randrange(len(shape))
            shape[j] = b.choice(_DIM_CHOICES[1:])
        else:
            shape = [b.choice(_DIM_CHOICES) for _ in range(b.rng.randint(1, 4))]
        node = b._placeholder(f"x{i}", b.rand(shape))
        b.pool.append(node)


def _finish(b: _Builder) -> None:
    """Output 1-3 sinks; every other sink is summed into the first output."""
    sinks = [n for n in b.floats if not n.users and n not in b.effects]
    if not sinks:
        sinks = [b.pool[-1]]
    n_out = min(len(sinks), b.rng.randint(1, 3))
    outs = sinks[-n_out:]
    rest = sinks[:-n_out]
    if rest:
        acc = None
        for s in rest:
            term = b.either(torch.sum, "sum", s)
            acc = term if acc is None else b.fn(operator.add, acc, term)
        outs[0] = b.fn(operator.add, outs[0], acc)
    b.graph.output(tuple(outs))


def _ensure_grads(gm: fx.GraphModule, inputs: Sequence[torch.Tensor]) -> None:
    """Every float input and parameter gets a gradient: add ``+ p.sum()`` terms
    for those that reach the outputs only through non-differentiable paths."""
    ins = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    params = dict(gm.named_parameters())
    outs = [o for o in gm(*ins) if o.requires_grad]
    leaves = [t for t in ins if t.requires_grad] + list(params.values())
    grads = torch.autograd.grad(sum(o.sum() for o in outs), leaves, allow_unused=True) if outs else [None] * len(leaves)
    missing_ph = [i for i, t in enumerate(ins) if t.requires_grad]
    ph_nodes = [n for n in gm.graph.nodes if n.op == "placeholder"]
    dead = [ph_nodes[i] for i, g in zip(missing_ph, grads) if g is None]
    dead_params = [name for name, g in zip(params, grads[len(missing_ph):]) if g is None]
    if not dead and not dead_params:
        return
    g = gm.graph
    out_node = next(n for n in g.nodes if n.op == "output")
    outs_n = list(out_node.args[0])
    with g.inserting_before(out_node):
        acc = outs_n[0]
        for n in dead:
            acc = g.call_function(operator.add, (acc, g.call_method("sum", (n,))))
        for name in dead_params:
            acc = g.call_function(operator.add, (acc, g.call_function(torch.sum, (g.get_attr(name),))))
    outs_n[0] = acc
    out_node.args = (tuple(outs_n),)
    gm.recompile()


def _dynamo_capture(gm: fx.GraphModule, inputs: tuple[torch.Tensor, ...]) -> tuple[fx.GraphModule, tuple[torch.Tensor, ...]]:
    """Run the program through torch.compile and keep the graph Dynamo hands
    its backend (torch-level, meta["example_value"] set; params become inputs)."""
    import torch._dynamo

    captured: dict[str, Any] = {}

    def backend(g: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable:
        captured.setdefault("gm", g)
        captured.setdefault("inputs", tuple(example_inputs))
        return g.forward

    torch._dynamo.reset()
    compiled = torch.compile(gm, backend=backend, fullgraph=True, dynamic=False)
    compiled(*[t.clone() for t in inputs])
    torch._dynamo.reset()
    ex = tuple(t.detach().clone() if not isinstance(t, torch.nn.Parameter) else t for t in captured["inputs"])
    return captured["gm"], ex


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Run torch ops on one intra-op thread.

    The tensors here are tiny; with a busy 2-core machine, intra-op thread
    hand-offs made a 4x8 layer_norm take ~1 ms instead of ~4 us.
    """
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def random_graph(
    seed: int,
    *,
    n_ops: int = 20,
    opaque: bool = True,
    inplace: bool = False,
    params: bool = True,
    with_meta: bool = False,
    dynamo: bool = False,
) -> GeneratedGraph:
    """Build a random, valid FX program from ``seed`` (deterministic per arguments).

    n_ops: number of op-family builders applied (tangles emit several nodes).
    opaque: include ops the optimizer does not know (cumsum, flip, roll, sort,
        topk, max(dim), a torch.fx.wrap'd python function).
    inplace: include in-place motifs (add_, mul_, copy_, relu_, via views).
    params: weights are get_attr parameters (True) or placeholders (False).
    with_meta: run ShapeProp so every node has meta["tensor_meta"].
    dynamo: return instead the graph torch.compile's Dynamo captures from the
        eager module (placeholders then include the parameters).
    """
    with single_thread():
        return _random_graph(seed, n_ops, opaque, inplace, params, with_meta, dynamo)


def _random_graph(seed: int, n_ops: int, opaque: bool, inplace: bool, params: bool, with_meta: bool, dynamo: bool) -> GeneratedGraph:
    b = _Builder(seed, opaque=opaque, inplace=inplace, params=params)
    _make_inputs(b)
    table = [(fn, w) for _, w, fn, need in BUILDERS if not need or (need == "opaque" and opaque) or (need == "inplace" and inplace)]
    fns, weights = [f for f, _ in table], [w for _, w in table]
    built, attempts = 0, 0
    while built < n_ops and attempts < n_ops * 20:
        attempts += 1
        if b.rng.choices(fns, weights=weights, k=1)[0](b):
            built += 1
    _finish(b)
    b.graph.lint()
    gm = fx.GraphModule(b.root, b.graph, class_name="GeneratedProgram")
    inputs = tuple(b.inputs)
    _ensure_grads(gm, inputs)
    if dynamo:
        gm, inputs = _dynamo_capture(gm, inputs)
    if with_meta:
        ShapeProp(gm).propagate(*[t.clone() for t in inputs])
    fams = Counter(b.fam)
    desc = (
        f"random_graph(seed={seed}, n_ops={n_ops}, opaque={opaque}, inplace={inplace}, params={params}, "
        f"with_meta={with_meta}, dynamo={dynamo}): {len(gm.graph.nodes)} nodes; "
        + ", ".join(f"{k}x{v}" if v > 1 else k for k, v in sorted(fams.items()))
    )
    return GeneratedGraph(gm=gm, example_inputs=inputs, description=desc, families=fams)


def random_module(seed: int, **options: Any) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """An eager ``nn.Module`` (the generated GraphModule) and inputs, for backend tests."""
    g = random_graph(seed, **options)
    return g.gm, g.example_inputs
