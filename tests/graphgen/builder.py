"""The generator's state: the FX graph under construction, evaluated as it is built.

``_Builder`` emits nodes and evaluates each one at once on concrete example
tensors (``env``), so the builders read real shapes instead of guessing them,
and the eager semantics of in-place ops and views are mirrored exactly. It
holds the pool of well-behaved operands (finite, bounded, small), the seeded
randomness (``rng`` for choices, ``gen`` for tensors) and the family tags.
Below it: the predicates that keep the differential test stable (separation
margins for comparisons and sorts) and ``Builder``, the type of one op
family's builder.
"""

from __future__ import annotations

import operator
import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

_MAX_NUMEL = 1024
_MAX_ABS = 100.0
_DIM_CHOICES = (1, 2, 2, 3, 4, 4, 6, 8)
_NUM_EMB = 10  # rows of every embedding table (and the bound of the index input)


class _Builder:
    """Graph under construction plus its concrete evaluation."""

    def __init__(
        self, seed: int, *, opaque: bool, inplace: bool, params: bool, dropout_p: float = 0.0, dynamo: bool = False
    ) -> None:
        self.rng = random.Random(seed)
        self.dropout_p = dropout_p  # the probability of every dropout the training builders emit
        self.dynamo = dynamo  # the program is captured by Dynamo afterwards (builders avoid what it cannot capture)
        self.gen = torch.Generator().manual_seed(seed)
        self.opaque, self.inplace, self.params = opaque, inplace, params
        self.graph = fx.Graph()
        self.root = torch.nn.Module()
        self.env: dict[fx.Node, Any] = {}  # concrete value of every node
        self.pool: list[fx.Node] = []  # float tensors usable as operands
        self.floats: list[fx.Node] = []  # every float tensor an op produced
        self.effects: set[fx.Node] = set()  # in-place nodes (never sinks)
        self.inputs: list[torch.Tensor] = []
        self.index_input: fx.Node | None = None
        self.last_ph: fx.Node | None = None
        self.n_params = 0
        self.fam: Counter = Counter()

    # -- node emission -----------------------------------------------------
    def _concrete(self, arg: Any) -> Any:
        return fx.node.map_arg(arg, lambda n: self.env[n])

    def emit(self, op: str, target: Any, args: tuple = (), kwargs: dict | None = None) -> fx.Node:
        """Add a node and evaluate it on the concrete values of its inputs."""
        kwargs = kwargs or {}
        node = self.graph.create_node(op, target, args, kwargs)
        a, k = self._concrete(args), self._concrete(kwargs)
        with torch.no_grad():
            if op == "call_function":
                val = target(*a, **k)
            elif op == "call_method":
                val = getattr(a[0], target)(*a[1:], **k)
            elif op == "call_module":  # a training builder's submodule (its buffers update as it runs)
                val = self.root.get_submodule(target)(*a, **k)
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

    def either(self, target: Callable | None, name: str | None, *args: Any, **kwargs: Any) -> fx.Node:
        """Function or method spelling of the same op, chosen at random."""
        if name is not None and (target is None or self.coin()):
            return self.meth(name, *args, **kwargs)
        assert target is not None
        return self.fn(target, *args, **kwargs)

    def dim_call(self, target: Callable | None, name: str | None, x: Any, d: int, *pre: Any, **kw: Any) -> fx.Node:
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
            self.graph.inserting_after(self.last_ph) if self.last_ph is not None else self.graph.inserting_before(None)
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

    def buffer(self, shape: Sequence[int], kind: str) -> fx.Node:
        """A buffer of the root read by get_attr: a running mean (small values) or variance (positive)."""
        value = 0.5 + self.rand(shape).abs() if kind == "running_var" else self.rand(shape, 0.3)
        name = f"{kind}{self.n_params}"
        self.n_params += 1
        self.root.register_buffer(name, value)
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

    def pick(
        self, pred: Callable[[torch.Tensor], bool] = lambda t: True, exclude: Sequence[fx.Node] = ()
    ) -> fx.Node | None:
        """A pool value satisfying ``pred``, biased to recent ones (deep chains)."""
        cands = [n for n in self.pool if n not in exclude and pred(self.env[n])]
        if not cands:
            return None
        weights = [i + 1 for i in range(len(cands))]
        return self.rng.choices(cands, weights=weights, k=1)[0]

    def split_dim(self, x: fx.Node, min_size: int = 2) -> int | None:
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
            suffix = s[self.rng.randint(1, len(s) - 1) :]
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


Builder = Callable[[_Builder], bool]
