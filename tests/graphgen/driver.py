"""Assembling a program: ``random_graph`` and ``random_module``, the generator's entry points.

Inputs (1-3 placeholders of related shapes, maybe an index tensor), the
seeded loop drawing op families from ``BUILDERS``, outputs (every other sink
summed into the first), gradients for every input and parameter, and on
request the graph Dynamo captures and ShapeProp metadata.
"""

from __future__ import annotations

import dataclasses
import operator
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.fx.passes.shape_prop import ShapeProp

from optimus_eqsat.run_support import single_thread

from .builder import _DIM_CHOICES, _NUM_EMB, _Builder
from .families import BUILDERS
from .training import fresh_statistics

#: the global generator's seed while a program is built; a run seeded alike draws the same dropouts
RNG_SEED = 1234


@dataclasses.dataclass
class GeneratedGraph:
    """One generated program.

    gm: the graph module (parameters live on it as attributes when params=True).
    example_inputs: one tensor per placeholder, in placeholder order.
    description: human-readable summary (seed, options, families used).
    families: how often each op family tag was emitted.
    state_inputs: positions of example inputs that are module state a run writes (a Dynamo
        graph's lifted batch-norm buffers): no gradient is taken of them, and their values
        after a step are compared like the module's own buffers.
    """

    gm: fx.GraphModule
    example_inputs: tuple[torch.Tensor, ...]
    description: str
    families: Counter = dataclasses.field(default_factory=Counter)
    state_inputs: tuple[int, ...] = ()


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
    dead_params = [name for name, g in zip(params, grads[len(missing_ph) :]) if g is None]
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


def _dynamo_capture(
    gm: fx.GraphModule, inputs: tuple[torch.Tensor, ...], dynamic_batch: bool = False
) -> tuple[fx.GraphModule, tuple[Any, ...], tuple[int, ...]]:
    """Run the program through torch.compile and keep the graph Dynamo hands
    its backend (torch-level, meta["example_value"] set; params become inputs).

    dynamic_batch: dim 0 of every float input of size >= 2 may be symbolic
    (``maybe_mark_dynamic``: Dynamo keeps it symbolic unless the program
    specializes it); the graph then also takes the symbolic sizes as int inputs.
    Also returns the positions of the inputs that are ``gm``'s buffers (Dynamo lifts them)."""
    import torch._dynamo

    captured: dict[str, Any] = {}

    def backend(g: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable:
        captured.setdefault("gm", g)
        captured.setdefault("inputs", tuple(example_inputs))
        return g.forward

    torch._dynamo.reset()
    args = [t.clone() for t in inputs]
    if dynamic_batch:
        for t in args:
            if t.is_floating_point() and t.dim() >= 1 and t.shape[0] >= 2:
                torch._dynamo.maybe_mark_dynamic(t, 0)
    compiled = torch.compile(gm, backend=backend, fullgraph=True, dynamic=None if dynamic_batch else False)
    compiled(*args)
    torch._dynamo.reset()
    buffers = {id(t) for t in gm.buffers()}
    state = tuple(i for i, t in enumerate(captured["inputs"]) if id(t) in buffers)
    ex = tuple(
        t.detach().clone()
        if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter)
        else int(t.node.hint)
        if isinstance(t, torch.SymInt)
        else t
        for t in captured["inputs"]
    )
    return captured["gm"], ex, state


def _in_dtype(
    gm: fx.GraphModule, inputs: tuple[torch.Tensor, ...], dtype: torch.dtype
) -> tuple[fx.GraphModule, tuple[torch.Tensor, ...]] | None:
    """The program with its float parameters and inputs in ``dtype``; None when eager
    cannot run it forward and backward in that dtype (an op without such a kernel)."""
    low = gm.to(dtype)
    ins = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
    try:
        leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in ins]
        outs = [o for o in low(*leaves) if o.requires_grad]
        if outs:
            torch.autograd.grad(
                sum(o.float().sum() for o in outs),
                [t for t in leaves if t.requires_grad] + list(low.parameters()),
                allow_unused=True,
            )
    except (RuntimeError, NotImplementedError):
        return None
    return low, ins


def random_graph(
    seed: int,
    *,
    n_ops: int = 20,
    opaque: bool = True,
    inplace: bool = False,
    params: bool = True,
    with_meta: bool = False,
    dynamo: bool = False,
    dynamic_batch: bool = False,
    dtype: torch.dtype = torch.float32,
    train: bool = False,
    checkpoint: bool = False,
    dropout_p: float = 0.0,
    state_regions: bool = False,
    gated: bool = False,
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
    dynamic_batch: with dynamo, dim 0 of the float inputs may stay symbolic.
    dtype: the float dtype of parameters and inputs (the program is built and
        checked in float32, then cast; it stays float32, said in the description,
        when eager has no kernel for an op in that dtype).
    train: include training-mode batch norms (which write their running statistics)
        and dropouts (graphgen/training.py).
    checkpoint: include sibling experts in ``torch.utils.checkpoint`` regions (with dynamo,
        ``tag_activation_checkpoint`` regions).
    dropout_p: the probability of every dropout (0: the program is deterministic). The
        global generator is seeded with ``RNG_SEED`` while the program is built, so a run
        after ``torch.manual_seed(RNG_SEED)`` draws what building drew.
    state_regions: include sibling experts inside ``torch.no_grad()`` and ``torch.autocast``
        regions beside plain ones (with dynamo, ``_set_grad_enabled`` / ``_enter_autocast``
        nodes around their ops).
    gated: include gated linear units (linears whose outputs are chunked into a gate and a
        value, ``act(gate) * value``).
    """
    with single_thread(), torch.random.fork_rng():
        torch.manual_seed(RNG_SEED)
        return _random_graph(
            seed,
            n_ops,
            opaque,
            inplace,
            params,
            with_meta,
            dynamo,
            dynamic_batch,
            dtype,
            train,
            checkpoint,
            dropout_p,
            state_regions,
            gated,
        )


def _random_graph(
    seed: int,
    n_ops: int,
    opaque: bool,
    inplace: bool,
    params: bool,
    with_meta: bool,
    dynamo: bool,
    dynamic_batch: bool = False,
    dtype: torch.dtype = torch.float32,
    train: bool = False,
    checkpoint: bool = False,
    dropout_p: float = 0.0,
    state_regions: bool = False,
    gated: bool = False,
) -> GeneratedGraph:
    b = _Builder(seed, opaque=opaque, inplace=inplace, params=params, dropout_p=dropout_p, dynamo=dynamo)
    enabled = {
        "": True,
        "opaque": opaque,
        "inplace": inplace,
        "train": train,
        "checkpoint": checkpoint,
        "state": state_regions,
        "gated": gated,
    }
    _make_inputs(b)
    table = [(fn, w) for _, w, fn, need in BUILDERS if enabled[need]]
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
    if train or checkpoint:
        fresh_statistics(b, gm)
    cast = dtype
    if dtype != torch.float32:
        low = _in_dtype(gm, inputs, dtype)
        if low is None:
            cast = torch.float32
        else:
            gm, inputs = low
    state: tuple[int, ...] = ()
    if dynamo:
        gm, inputs, state = _dynamo_capture(gm, inputs, dynamic_batch)
    if with_meta:
        ShapeProp(gm).propagate(*[t.clone() for t in inputs])
    fams = Counter(b.fam)
    desc = (
        f"random_graph(seed={seed}, n_ops={n_ops}, opaque={opaque}, inplace={inplace}, params={params}, "
        f"with_meta={with_meta}, dynamo={dynamo}, dynamic_batch={dynamic_batch}, dtype={dtype}"
        + (f", train={train}, checkpoint={checkpoint}, dropout_p={dropout_p}" if train or checkpoint else "")
        + (", state_regions=True" if state_regions else "")
        + (", gated=True" if gated else "")
        + (f" (kept {cast}: eager lacks a kernel)" if cast != dtype else "")
        + f"): {len(gm.graph.nodes)} nodes; "
        + ", ".join(f"{k}x{v}" if v > 1 else k for k, v in sorted(fams.items()))
    )
    return GeneratedGraph(gm=gm, example_inputs=inputs, description=desc, families=fams, state_inputs=state)


def random_module(seed: int, **options: Any) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """An eager ``nn.Module`` (the generated GraphModule) and inputs, for backend tests."""
    g = random_graph(seed, **options)
    return g.gm, g.example_inputs
