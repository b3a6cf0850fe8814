"""Synthetic FX graphs of a given size, built directly (no tracing) so 100,000 nodes is cheap.

Every generator takes the FX node count to aim for (``n_nodes``, met to within
one block) and returns ``(gm, example_inputs)``; the graphs are deterministic
and every node carries ``meta["val"]`` (a fake tensor, all of one fake mode) like a Dynamo graph.
They are the shapes that stress saturation (issue: robustness):

- ``split_cat_chain``: split -> cat round trips between relus;
- ``scalar_chain``: ``x * c``, ``x / c``, ``x + c``, ``x - c`` in a long chain
  (constant folding: ``mul-mul`` and friends);
- ``residual_adds``: scaled residual blocks ``x = x + relu(x) * c``;
- ``repeated_ops``: the same op on the same input many times, summed;
- ``unary_runs``: long runs of one unary op (``neg`` runs cancel pairwise);
- ``view_chain``: reshape / permute / transpose / unsqueeze chains;
- ``swap_halves_chain``: split -> swap the halves -> cat -> scalar multiply (a scalar
  chain through slices of cats), ``swap_view_chain`` (the same with reshapes and
  permutes before the multiply), ``residual_halves_chain`` (residual adds of split halves).

- ``mul_chain``: one unbroken chain of ``x * c`` (no runs of other ops to cut it).

``scalar_chain`` to ``view_chain`` also exist "with split/cat" (``*_splitcat``): a
split -> cat round trip after every block, so chains the round trips cut are joined
once the split/cat rules remove them. ``GENERATORS`` names them all.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

Generated = tuple[torch.fx.GraphModule, tuple]


class GraphBuilder:
    """Appends call_function nodes to an FX graph, with ``meta["val"]`` fake tensors of one
    fake mode, the input's included: the meta Dynamo hands a backend. Each op runs on meta
    tensors (a fake-tensor dispatch per op would make a 100,000-node graph cost half a minute)
    and its results are wrapped as fake tensors of the mode, views sharing their base's storage."""

    def __init__(self, shape: tuple[int, ...], seed: int = 0):
        self.graph = torch.fx.Graph()
        generator = torch.Generator().manual_seed(seed)
        self.example = torch.randn(*shape, generator=generator)
        self.mode = FakeTensorMode()
        self.input = self.graph.placeholder("x")
        self.input.meta["val"] = self.mode.from_tensor(self.example, static_shapes=True)
        self.on_meta: dict[torch.fx.Node, Any] = {self.input: torch.empty_like(self.example, device="meta")}
        self.ops = 0  # call nodes so far

    @property
    def nodes(self) -> int:
        """FX nodes so far: the placeholder, the call nodes and the output to come."""
        return self.ops + 2

    def call(self, target: Callable, *args: Any, **kwargs: Any) -> torch.fx.Node:
        """A call_function node; its meta["val"] is ``target`` run on the operands' values."""
        node = self.graph.call_function(target, args, kwargs)
        meta = lambda a: self.on_meta[a] if isinstance(a, torch.fx.Node) else a  # noqa: E731
        out = target(*torch.fx.node.map_aggregate(args, meta), **torch.fx.node.map_aggregate(kwargs, meta))
        self.on_meta[node] = out
        fake = lambda t: FakeTensor(self.mode, t, self.example.device) if isinstance(t, torch.Tensor) else t  # noqa: E731
        node.meta["val"] = torch.fx.node.map_aggregate(out, fake)
        self.ops += 1
        return node

    def round_trip(self, x: torch.fx.Node, pieces: int = 4, dim: int = -1) -> torch.fx.Node:
        """``cat(split(x))`` along ``dim``: a no-op the split/cat rules remove (pieces + 2 nodes)."""
        width = x.meta["val"].shape[dim] // pieces
        split = self.call(torch.split, x, width, dim=dim)
        items = [self.call(operator.getitem, split, i) for i in range(pieces)]
        return self.call(torch.cat, items, dim=dim)

    def finish(self, *outputs: torch.fx.Node) -> Generated:
        self.graph.output(tuple(outputs))
        return torch.fx.GraphModule(torch.nn.Module(), self.graph), (self.example,)


def _blocks(
    b: GraphBuilder,
    n_nodes: int,
    x: torch.fx.Node,
    block: Callable[[torch.fx.Node, int], torch.fx.Node],
    split_cat: bool,
) -> torch.fx.Node:
    """Append ``block(x, i)`` (and a split/cat round trip after it) until ``n_nodes`` FX nodes."""
    i = 0
    while b.nodes < n_nodes or i == 0:
        x = block(x, i)
        if split_cat:
            x = b.round_trip(x)
        i += 1
    return x


def split_cat_chain(n_nodes: int, pieces: int = 4, width: int = 8, batch: int = 2) -> Generated:
    """A chain of blocks ``x = relu(cat(split(x)))`` (a split, its getitems, a cat and a relu).

    Every block is a split->cat round trip the optimizer removes, so the result
    is a chain of relus. Each node carries ``meta["val"]`` like a Dynamo graph.
    """
    b = GraphBuilder((batch, pieces * width))
    x = b.input
    for _ in range(max(1, n_nodes // (pieces + 3))):
        x = b.call(torch.relu, b.round_trip(x, pieces, dim=1))
    return b.finish(x)


# Constants near 1 (and small shifts) keep a chain of 100,000 ops finite, and a
# folded chain (constants combined in f64) within float32 tolerance of eager.
_SCALE = (1.5, 0.75, 1.25, 0.8)
_SHIFT = (0.25, 0.5, 0.125)
_SCALAR_OPS = (operator.mul, operator.truediv, operator.add, operator.sub)


def scalar_chain(n_nodes: int, split_cat: bool = False, run: int = 8, width: int = 16, batch: int = 2) -> Generated:
    """``x = x*c1*c2*...`` in runs of ``run`` muls, then a run of divs, of adds, of subs, and so on;
    the runs meet one another (mul-div, add-sub folding) and, with ``split_cat``, the next
    block's chain once the round trip between them is removed."""
    b = GraphBuilder((batch, width))

    def block(x: torch.fx.Node, i: int) -> torch.fx.Node:
        op = _SCALAR_OPS[i % len(_SCALAR_OPS)]
        constants = _SCALE if op in (operator.mul, operator.truediv) else _SHIFT
        for j in range(run):
            x = b.call(op, x, constants[(i + j) % len(constants)])
        return x

    return b.finish(_blocks(b, n_nodes, b.input, block, split_cat))


def residual_adds(n_nodes: int, split_cat: bool = False, width: int = 16, batch: int = 2) -> Generated:
    """Scaled residual blocks ``x = x + relu(x) * c`` (a relu, a mul, an add each); c is 0.25
    and -0.2 in turn, so positive entries are scaled by 1.25 * 0.8 == 1 every two blocks."""
    b = GraphBuilder((batch, width))

    def block(x: torch.fx.Node, i: int) -> torch.fx.Node:
        return b.call(operator.add, x, b.call(operator.mul, b.call(torch.relu, x), (0.25, -0.2)[i % 2]))

    return b.finish(_blocks(b, n_nodes, b.input, block, split_cat))


def repeated_ops(n_nodes: int, split_cat: bool = False, copies: int = 6, width: int = 16, batch: int = 2) -> Generated:
    """Blocks that apply one op ``copies`` times to the same input and sum the copies
    (``x = neg(x) + neg(x) + ...``, then ``x*c`` copies, ``sin`` copies, ...) and scale the
    sum back: the e-graph shares the copies; the sums meet the factoring rules."""
    b = GraphBuilder((batch, width))
    ops: list[Callable[[torch.fx.Node], torch.fx.Node]] = [
        lambda x: b.call(torch.neg, x),
        lambda x: b.call(operator.mul, x, 1.25),
        lambda x: b.call(torch.sin, x),
        lambda x: b.call(operator.mul, x, 0.8),
        lambda x: b.call(torch.tanh, x),
    ]

    def block(x: torch.fx.Node, i: int) -> torch.fx.Node:
        op = ops[i % len(ops)]
        total = op(x)
        for _ in range(copies - 1):
            total = b.call(operator.add, total, op(x))
        return b.call(operator.mul, total, 1.0 / copies)

    return b.finish(_blocks(b, n_nodes, b.input, block, split_cat))


def unary_runs(n_nodes: int, split_cat: bool = False, run: int = 8, width: int = 16, batch: int = 2) -> Generated:
    """Runs of ``run`` equal unary ops: neg (pairs cancel by neg-neg), relu, abs, tanh in turn."""
    b = GraphBuilder((batch, width))
    ops = (torch.neg, torch.relu, torch.neg, torch.abs, torch.neg, torch.tanh)

    def block(x: torch.fx.Node, i: int) -> torch.fx.Node:
        for _ in range(run):
            x = b.call(ops[i % len(ops)], x)
        return x

    return b.finish(_blocks(b, n_nodes, b.input, block, split_cat))


def view_chain(n_nodes: int, split_cat: bool = False, width: int = 16, batch: int = 2) -> Generated:
    """Blocks of views that end where they began: reshape (batch, width) -> (batch, 4, width/4),
    permute, transpose back, unsqueeze, reshape back; a relu between blocks (6 nodes each)."""
    b = GraphBuilder((batch, width))

    def block(x: torch.fx.Node, i: int) -> torch.fx.Node:
        y = b.call(torch.reshape, x, (batch, 4, width // 4))
        y = b.call(torch.permute, y, (0, 2, 1))
        y = b.call(torch.transpose, y, 1, 2)
        y = b.call(torch.unsqueeze, y, 0)
        y = b.call(torch.reshape, y, (batch, width))
        return b.call(torch.relu, y) if i % 2 else y

    return b.finish(_blocks(b, n_nodes, b.input, block, split_cat))


# Scale factors whose running products never repeat (a chain keeps a distinct folded
# constant per position, as real chains do) and stay near 1 over 100,000 nodes.
_DRIFT = (1.01, 0.99)


def mul_chain(n_nodes: int, width: int = 16, batch: int = 2) -> Generated:
    """``x = x * c`` ``n_nodes - 2`` times (c is 1.01 and 0.99 in turn): folds to one multiply."""
    b = GraphBuilder((batch, width))
    x = b.input
    while b.nodes < n_nodes or x is b.input:
        x = b.call(operator.mul, x, _DRIFT[b.ops % 2])
    return b.finish(x)


def _halves(b: GraphBuilder, x: torch.fx.Node) -> list[torch.fx.Node]:
    """``split(x, width // 2, dim=-1)`` and its two getitems (3 nodes)."""
    split = b.call(torch.split, x, x.meta["val"].shape[-1] // 2, dim=-1)
    return [b.call(operator.getitem, split, k) for k in range(2)]


def swap_halves_chain(n_nodes: int, width: int = 16, batch: int = 2) -> Generated:
    """Blocks ``x = cat([x1, x0]) * c`` with ``x0, x1 = split(x)`` (5 nodes each; c is 1.01 and
    0.99 in turn).

    The scalar chain runs through slices of cats: once the pieces are pushed through the
    cats, each half is a chain of multiplies reaching back through every block. Issue 29's
    shape: its chain analysis lowered every position's root once per position below it
    (quadratic: 12,500 nodes took 219 s)."""
    b = GraphBuilder((batch, width))
    x, i = b.input, 0
    while b.nodes < n_nodes or i == 0:
        x0, x1 = _halves(b, x)
        x = b.call(operator.mul, b.call(torch.cat, [x1, x0], dim=-1), _DRIFT[i % 2])
        i += 1
    return b.finish(x)


def swap_view_chain(n_nodes: int, width: int = 16, batch: int = 2) -> Generated:
    """``swap_halves_chain`` with views between the cat and the multiply: the swapped halves
    are reshaped to (batch, 2, width/2), transposed, permuted back and flattened (9 nodes)."""
    b = GraphBuilder((batch, width))
    x, i = b.input, 0
    while b.nodes < n_nodes or i == 0:
        x0, x1 = _halves(b, x)
        y = b.call(torch.reshape, b.call(torch.cat, [x1, x0], dim=-1), (batch, 2, width // 2))
        y = b.call(torch.permute, b.call(torch.transpose, y, 1, 2), (0, 2, 1))
        x = b.call(operator.mul, b.call(torch.reshape, y, (batch, width)), _DRIFT[i % 2])
        i += 1
    return b.finish(x)


def residual_halves_chain(n_nodes: int, width: int = 16, batch: int = 2) -> Generated:
    """Residual adds of split halves: ``m = x1 * 0.5; x = cat([m, x0 + m])`` with
    ``x0, x1 = split(x)`` (6 nodes). Each half mixes both halves of the block before
    (averages: the values stay bounded), so chains of multiplies and adds cross."""
    b = GraphBuilder((batch, width))
    x, i = b.input, 0
    while b.nodes < n_nodes or i == 0:
        x0, x1 = _halves(b, x)
        m = b.call(operator.mul, x1, 0.5)
        x = b.call(torch.cat, [m, b.call(operator.add, x0, m)], dim=-1)
        i += 1
    return b.finish(x)


def _with_split_cat(generator: Callable[..., Generated]) -> Callable[[int], Generated]:
    def generate(n_nodes: int) -> Generated:
        return generator(n_nodes, split_cat=True)

    generate.__name__ = f"{generator.__name__}_splitcat"
    generate.__doc__ = f"{generator.__name__} with a split/cat round trip after every block."
    return generate


_CHAINS = (scalar_chain, residual_adds, repeated_ops, unary_runs, view_chain)

# Every generator by name: n_nodes -> (gm, example inputs).
GENERATORS: dict[str, Callable[[int], Generated]] = {
    "split_cat_chain": split_cat_chain,
    "mul_chain": mul_chain,
    "swap_halves_chain": swap_halves_chain,
    "swap_view_chain": swap_view_chain,
    "residual_halves_chain": residual_halves_chain,
    **{g.__name__: g for g in _CHAINS},
    **{f"{g.__name__}_splitcat": _with_split_cat(g) for g in _CHAINS},
}
