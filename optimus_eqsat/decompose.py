"""FX rewrites run before translation, for what the term language would keep opaque.

:func:`before_translation` applies both below to one copy of the graph.

**Private in-place ops.** ``nn.ReLU(inplace=True)`` and friends (``F.relu(x,
inplace=True)``, ``x.relu_()``, ``torch.relu_(x)``) write into their input. The
translator keeps every node that reads or writes mutated memory opaque, in
order, so one in-place activation after each layer of an MLP stops everything
downstream from being optimized. When the written tensor is fresh memory (made by
a non-view op) that nothing else reads (the in-place op is its only user), no one
can observe the write: the out-of-place op is the same program.

**Eval-mode batch norms.** An eval-mode batch norm (running statistics, no update: ``F.batch_norm(...,
training=False)``, what ``nn.BatchNorm1d`` calls under ``model.eval()``) is a
per-channel affine map. Recommendation models put one after every layer of their
MLP experts and towers, so as one opaque op it stops the experts' linears and
activations from batching. Written as the elementwise ops it is::

    scale = rsqrt(running_var + eps) * weight      # parameters only
    y = (x - running_mean) * scale + bias

each op is a node the translator reads and batching groups like any other; in
inference the scale is parameter-only work (built once by the parameter cache,
folded under freezing), and Inductor fuses the rest into one pointwise kernel,
as its own batch-norm decomposition does. Only inputs of rank 2 (batch, channels)
are decomposed: there every statistic broadcasts over the last dim as it is, and
the new nodes' meta is their input's (same shape and dtype).

**Training-mode batch norms.** In training a batch norm normalizes with the batch's
statistics and updates its running ones in place. Written as what it computes::

    var, mean = var_mean(x, dims, correction=0, keepdim=True)    # dims: all but channels
    y = (x - mean) * rsqrt(var + eps) * weight + bias
    running_mean.lerp_(mean.detach(), momentum)                  # as eager updates them:
    running_var.lerp_(var.detach() * n / (n - 1), momentum)      # the unbiased variance

the normalization is pure ops the optimizer batches across experts (the variance and
mean of a stack of members is one reduction), and the updates are in-place writes of
the norms' own statistics, ordered only against other accesses to them (translate.py's
effects), so norms of different experts never wall each other off. The updates of
all norms whose statistics nothing else reads are three foreach ops at the end of the
graph (scale by ``1 - momentum``, add ``momentum`` times the batch mean, and the batch's
unbiased variance), and their ``num_batches_tracked += 1`` one ``torch._foreach_add_``:
Inductor runs each as one kernel, wherever the optimizer computes the statistics.
Norms of inputs of rank 2 (batch, channels) and 3 (batch, channels, length) with a static
channel count, a constant momentum and eps, and statistics and affine parameters of the input's
dtype (or float32 ones of a bf16 or float16 input, as autocast leaves a norm: then computed
in float32 and cast back, as eager's kernel computes) are decomposed when another norm of the
same input shape could batch with them (alone, Inductor's own norm has the cheaper backward).
Under a symbolic batch (or length) ``n / (n - 1)`` is no number: the running variance then
takes the batch's unbiased variance, a second ``var_mean`` of the input (``correction=1``)
that Inductor computes in the same reduction.
"""

from __future__ import annotations

import contextlib
import operator
from collections import defaultdict
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.fx
import torch.nn.functional as F

from optimus_eqsat.checkpoint_regions import checkpoint_calls, inline_checkpoints, region_tags
from optimus_eqsat.dropout_draws import keeps_rng_order, share_dropout_draws, shared_draw_groups
from optimus_eqsat.fx_graphs import copy_module
from optimus_eqsat.fxvocab import ALIASING_OPS, canonical_name
from optimus_eqsat.fxvocab.meta import META_KEYS, meta_value
from optimus_eqsat.fxvocab.mutation import inplace_position, is_mutating, renormed_table, running_stats_written
from optimus_eqsat.normalize import HANDLERS, MODULE_OPS

_SIGNATURE = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
_DEFAULTS = {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5}


def _bound(node: torch.fx.Node) -> dict[str, Any] | None:
    """``F.batch_norm``'s arguments by name, or None for any other node."""
    if node.op != "call_function" or node.target is not F.batch_norm or len(node.args) > len(_SIGNATURE):
        return None
    args = {**_DEFAULTS, **dict(zip(_SIGNATURE, node.args)), **node.kwargs}
    return args if set(args) <= set(_SIGNATURE) else None


def _training_decomposable(node: torch.fx.Node) -> dict[str, Any] | None:
    """The arguments of a training-mode batch norm of a rank-2 or rank-3 tensor of static
    shape (more than one value per channel) with constant momentum and eps, whose running
    statistics (if any) and affine parameters are tensors of one channel each in its dtype;
    or None."""
    args = _bound(node)
    if args is None or args["training"] is not True:
        return None
    if not isinstance(args["eps"], (int, float)) or not isinstance(args["momentum"], (int, float)):
        return None
    out = _shape_dtype(node)
    if out is None or len(out[0]) not in (2, 3) or not isinstance(out[0][1], int):
        return None
    shape, dtype = out
    if not all(isinstance(d, (int, torch.SymInt)) for d in shape):
        return None
    # Eager raises on one value per channel. (A symbolic size is never 0 or 1: Dynamo
    # specializes those, so a symbolic count is at least 2; comparing it would add a guard.)
    count = _per_channel_count(shape)
    if count is not None and count < 2:
        return None
    stats = (args["running_mean"], args["running_var"])
    if (stats[0] is None) != (stats[1] is None):
        return None
    found = {
        _shape_dtype(value) if isinstance(value, torch.fx.Node) else None
        for name in ("running_mean", "running_var", "weight", "bias")
        if (value := args[name]) is not None
    }
    # one channel each, in the input's dtype, or float32 for a bf16/fp16 input (autocast's mix)
    mixed = dtype in (torch.bfloat16, torch.float16) and found <= {((shape[1],), torch.float32)}
    if not (found <= {((shape[1],), dtype)} or mixed):
        return None
    return args


def _static(shape: tuple) -> bool:
    """Whether every size of ``shape`` is a plain int."""
    return all(isinstance(d, int) for d in shape)


def _shape_key(node: torch.fx.Node) -> tuple:
    """``node``'s (shape, dtype) as a dict key: a symbolic size by its expression (a SymInt is
    not hashable; two sizes of one symbol print alike)."""
    shape, dtype = cast("tuple[tuple, torch.dtype]", _shape_dtype(node))
    return tuple(d if isinstance(d, int) else str(d) for d in shape), dtype


def _statistics_dtype(node: torch.fx.Node, args: dict[str, Any]) -> torch.dtype:
    """The dtype a training norm computes its statistics in: its parameters' (float32 for a
    bf16 input under autocast, as eager's kernel computes), else its input's."""
    for name in ("running_mean", "running_var", "weight", "bias"):
        if isinstance(args[name], torch.fx.Node):
            return cast("tuple[tuple, torch.dtype]", _shape_dtype(args[name]))[1]
    return cast("tuple[tuple, torch.dtype]", _shape_dtype(node))[1]


def _batchable_training_norms(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """The training-mode norms worth decomposing: those with another of the same input shape
    and dtype to batch with. Decomposed, a norm pays only when batched: alone, Inductor's own
    batch norm (one reduction kernel for its backward) beats the autograd of its parts."""
    groups: dict[tuple, list[torch.fx.Node]] = defaultdict(list)
    for node in gm.graph.nodes:
        if _training_decomposable(node) is not None:
            groups[_shape_key(node)].append(node)  # (known for such a norm)
    return {n for members in groups.values() if len(members) >= 2 for n in members}


def _per_channel_count(shape: tuple) -> int | None:
    """Values a batch norm's statistics of one channel are computed over; None where a size is
    symbolic (the batch's variance is then computed unbiased, not scaled by ``n / (n - 1)``)."""
    if not _static(shape):
        return None
    count = shape[0]
    for size in shape[2:]:
        count *= size
    return count


def _decomposable(node: torch.fx.Node) -> dict[str, Any] | None:
    """The arguments of an eval-mode batch norm of a rank-2 tensor whose statistics and
    affine parameters are tensors of its dtype, or None."""
    args = _bound(node)
    if args is None or args["training"] is not False or not isinstance(args["eps"], (int, float)):
        return None
    out = _shape_dtype(node)
    if out is None or len(out[0]) != 2:
        return None
    for name in ("running_mean", "running_var", "weight", "bias"):
        value = args[name]
        if value is None and name in ("weight", "bias"):
            continue
        stat = _shape_dtype(value) if isinstance(value, torch.fx.Node) else None
        if stat != (out[0][1:], out[1]):
            return None
    return args


def _shape_dtype(node: torch.fx.Node) -> tuple[tuple, torch.dtype] | None:
    """(shape, dtype) of the tensor node meta says ``node`` holds, or None."""
    value = meta_value(node)
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    return (tuple(shape), dtype) if shape is not None and isinstance(dtype, torch.dtype) else None


def _like(new: torch.fx.Node, source: torch.fx.Node) -> torch.fx.Node:
    """``new`` with ``source``'s tensor meta (same shape and dtype) and checkpointed region."""
    for key in META_KEYS:
        if key in source.meta:
            new.meta[key] = source.meta[key]
    new.meta.update(region_tags(source))
    return new


def before_translation(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` itself when no rewrite applies, else a new GraphModule (sharing ``gm``'s
    parameters and submodules) with private in-place ops made out-of-place, batch norms
    decomposed (see the module docstring), dropouts of one shape sharing their random
    draws (:mod:`.dropout_draws`) and checkpointed regions inlined with their recompute
    tags (:mod:`.checkpoint_regions`). ``gm`` is never changed."""
    if checkpoint_calls(gm):
        gm = copy_module(gm)
        inline_checkpoints(gm)
        return _decomposed(gm, copy=False)
    return _decomposed(gm, copy=True)


def _decomposed(gm: torch.fx.GraphModule, copy: bool) -> torch.fx.GraphModule:
    """:func:`before_translation` after checkpointed regions are inlined; on a copy of ``gm``
    when ``copy`` (``gm`` itself when nothing applies)."""
    nodes = list(gm.graph.nodes)
    share_draws = not keeps_rng_order() and bool(shared_draw_groups(gm))
    if (
        not share_draws
        and not _batchable_training_norms(gm)
        and not any(_private_inplace(gm, n) is not None or _decomposable(n) for n in nodes)
    ):
        return gm
    out = copy_module(gm) if copy else gm
    if share_draws:
        share_dropout_draws(out)
    for node in list(out.graph.nodes):
        rewrite = _private_inplace(out, node)
        if rewrite is not None:
            rewrite()
    updates: dict[tuple, list[tuple[torch.fx.Node, ...]]] = defaultdict(list)
    batchable = _batchable_training_norms(out)
    for node in list(out.graph.nodes):
        args = _decomposable(node)
        if args is not None:
            _decompose_batch_norm(out.graph, node, args)
        elif node in batchable:
            args = cast("dict[str, Any]", _training_decomposable(node))  # (a batchable norm is one)
            own = _own_statistics(node, args)
            key = (  # (a batchable norm's shape and dtype are known)
                float(args["momentum"]),
                _per_channel_count(cast("tuple[tuple, torch.dtype]", _shape_dtype(node))[0]),
                _statistics_dtype(node, args),
            )
            batch_stats = _decompose_training_batch_norm(out.graph, node, args)
            if batch_stats is None:
                continue
            stats = (args["running_mean"], args["running_var"])
            if own:  # with every other norm's, at the end
                updates[key].append((*stats, *batch_stats))
            else:  # where the norm was: others read or write these statistics
                _update_statistics_here(out.graph, key, stats, batch_stats)
    _update_statistics(out.graph, updates)
    for members in _counter_increments(out).values():
        _increment_together(out.graph, members)
    out.graph.lint()
    out.recompile()
    return out


def _private_inplace(gm: torch.fx.GraphModule, node: torch.fx.Node) -> Callable[[], object] | None:
    """A function making ``node`` out-of-place, when it writes into a fresh tensor that only it
    reads and its out-of-place form is known; else None."""
    if (
        node.op not in ("call_function", "call_method", "call_module")
        or not node.args
        or node.kwargs.get("out") is not None
    ):
        return None
    x = node.args[0]
    if not isinstance(x, torch.fx.Node) or len(x.users) != 1 or x.op in ("placeholder", "get_attr", "output"):
        return None
    if not _fresh(gm, x) or not is_mutating(gm, node):
        return None
    target = node.target
    if node.op == "call_function" and target in _AUGMENTED:  # ``y += b`` (deepctr's PredictionLayer)
        return (lambda: setattr(node, "target", _AUGMENTED[target])) if _same_result(node) else None
    if node.op == "call_module":  # symbolic_trace keeps nn.ReLU(inplace=True) a module call
        if type(gm.get_submodule(str(target))) is not torch.nn.ReLU or len(node.args) != 1 or node.kwargs:
            return None

        def as_function() -> None:
            node.op = "call_function"
            node.target = torch.relu

        return as_function
    # A trailing underscore's twin is the out-of-place op only where the translator knows that
    # op (not requires_grad_ -> the requires_grad attribute, resize_ -> a deprecated alias).
    if node.op == "call_method":
        plain = str(target)[:-1]
        if not str(target).endswith("_") or plain not in HANDLERS or not hasattr(torch.Tensor, plain):
            return None
        return lambda: setattr(node, "target", plain)
    position = inplace_position(target) if getattr(target, "__module__", "") == F.__name__ else None
    if node.kwargs.get("inplace") is True:
        return lambda: node.update_kwarg("inplace", False)
    if position is not None and len(node.args) > position and node.args[position] is True:
        return lambda: node.update_arg(position, False)
    name = getattr(target, "__name__", "")
    for namespace in (torch, F):
        if (
            name.endswith("_")
            and name[:-1] in HANDLERS
            and getattr(namespace, name, None) is target
            and callable(getattr(namespace, name[:-1], None))
        ):
            plain_fn = getattr(namespace, name[:-1])
            return lambda: setattr(node, "target", plain_fn)
    return None


# Augmented assignments and the op each is when its target is private.
_AUGMENTED = {
    operator.iadd: operator.add,
    operator.isub: operator.sub,
    operator.imul: operator.mul,
    operator.itruediv: operator.truediv,
}


def _same_result(node: torch.fx.Node) -> bool:
    """Whether ``a op= b`` (``node``) gives what ``a op b`` gives: the out-of-place op would
    promote the dtype or broadcast the shape where the in-place one keeps ``a``'s (known
    from meta; unknown: no)."""
    a, b = meta_value(cast(torch.fx.Node, node.args[0])), node.args[1]  # (_private_inplace: a node)
    b = meta_value(b) if isinstance(b, torch.fx.Node) else b
    if not isinstance(a, torch.Tensor) or not isinstance(b, (torch.Tensor, int, float, bool)):
        return False
    if isinstance(b, torch.Tensor) and torch.broadcast_shapes(a.shape, b.shape) != a.shape:
        return False
    return torch.result_type(a, b) == a.dtype


# Conversions return their input itself when there is nothing to convert.
_MAY_RETURN_INPUT = frozenset({"to", "type", "type_as", "float", "half", "bfloat16", "double", "int", "long", "bool"})


def _fresh(gm: torch.fx.GraphModule, x: torch.fx.Node) -> bool:
    """Whether ``x`` is a tensor of its own memory: made by a known op that is no view, no
    conversion that may return its input, and no in-place write into its input. A training
    batch norm (which updates its running statistics) and an embedding with ``max_norm``
    (which renormalizes its table) write side memory, not their result: theirs is fresh."""
    if x.op == "call_module":
        name = MODULE_OPS.get(type(gm.get_submodule(str(x.target))), (None,))[0]
    else:
        name = canonical_name(x)
    writes_side_memory_only = bool(running_stats_written(x)) or renormed_table(gm, x) is not None
    return (
        name is not None
        and name not in ALIASING_OPS | _MAY_RETURN_INPUT
        and (writes_side_memory_only or not is_mutating(gm, x))
    )


def _decompose_batch_norm(graph: torch.fx.Graph, node: torch.fx.Node, args: dict[str, Any]) -> None:
    x, mean, var = args["input"], args["running_mean"], args["running_var"]
    with graph.inserting_before(node):
        scale = _like(
            graph.call_function(torch.rsqrt, (_like(graph.call_function(torch.add, (var, float(args["eps"]))), var),)),
            var,
        )
        if args["weight"] is not None:
            scale = _like(graph.call_function(torch.mul, (scale, args["weight"])), var)
        centered = _like(graph.call_function(torch.sub, (x, mean)), node)
        y = _like(graph.call_function(torch.mul, (centered, scale)), node)
        if args["bias"] is not None:
            y = _like(graph.call_function(torch.add, (y, args["bias"])), node)
    node.replace_all_uses_with(y)
    graph.erase_node(node)


def _decompose_training_batch_norm(
    graph: torch.fx.Graph, node: torch.fx.Node, args: dict[str, Any]
) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """Replace a training-mode batch norm by its normalization; the updates of its running
    statistics it leaves to the caller: the batch's (mean, biased variance) per channel,
    outside autograd (None without running statistics)."""
    x = args["input"]
    shape, dtype = cast("tuple[tuple, torch.dtype]", _shape_dtype(node))  # (_training_decomposable: known)
    compute = _statistics_dtype(node, args)
    channels = shape[1]
    dims = [0, *range(2, len(shape))]
    stat_shape = (1, channels, *[1] * (len(shape) - 2))

    def call(target: Any, *operands: Any, method: bool = False, **kwargs: Any) -> torch.fx.Node:
        new = (graph.call_method if method else graph.call_function)(target, operands, kwargs)
        new.meta.update(region_tags(node))
        return _computed(new)

    with graph.inserting_before(node):
        if compute != dtype:  # (a bf16 input of float32 statistics: computed in float32, as eager does)
            x = call("to", x, compute, method=True)
        moments = call(torch.var_mean, x, dims, correction=0, keepdim=True)
        var, mean = call(operator.getitem, moments, 0), call(operator.getitem, moments, 1)
        # (with a symbolic size, n / (n - 1) is no number: the running variance takes the
        # unbiased one directly, a second reduction of x that Inductor computes with the first)
        update_var = var
        if not _static(shape):
            update_var = call(operator.getitem, call(torch.var_mean, x, dims, correction=1, keepdim=True), 0)
        y = call(torch.mul, call(torch.sub, x, mean), call(torch.rsqrt, call(torch.add, var, float(args["eps"]))))
        # (a (C,) parameter broadcasts over (batch, C) as it is: batching then stacks the
        # parameters themselves, one copy of graph inputs, not reshaped views of them)
        for name, op in (("weight", torch.mul), ("bias", torch.add)):
            if args[name] is not None:
                param = args[name] if len(shape) == 2 else call("reshape", args[name], stat_shape, method=True)
                y = call(op, y, param)
        if compute != dtype:
            y = call("to", y, dtype, method=True)
        batch_stats = None
        if args["running_mean"] is not None:
            batch_stats = cast(
                "tuple[torch.fx.Node, torch.fx.Node]",
                tuple(
                    call("reshape", call("detach", stat, method=True), channels, method=True)
                    for stat in (mean, update_var)
                ),
            )
    for key in META_KEYS:  # the norm's own meta is the result's
        if key in node.meta:
            y.meta[key] = node.meta[key]
    node.replace_all_uses_with(y)
    graph.erase_node(node)
    return batch_stats


def _update_statistics(graph: torch.fx.Graph, updates: dict[tuple, list[tuple[torch.fx.Node, ...]]]) -> None:
    """The running statistics' updates of every norm whose statistics nothing else reads, per
    (momentum, values per channel, dtype), after every norm: ``stat *= 1 - momentum``, then
    ``mean += momentum * batch_mean`` and ``var += momentum * n / (n - 1) * batch_var``, as
    three foreach ops over all of them (Inductor runs them as one kernel, wherever the
    optimizer computes the statistics: one batched reduction or one per norm; no op per
    norm that batching would have to stack). Each statistic is read or written by its norm
    alone (:func:`_own_statistics`), so moving its write past the other norms changes
    nothing anyone reads."""
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    for (momentum, count, _), norms in updates.items():
        means, variances = [n[0] for n in norms], [n[1] for n in norms]
        with graph.inserting_before(output):
            graph.call_function(torch._foreach_mul_, ([*means, *variances], 1.0 - momentum))
            graph.call_function(torch._foreach_add_, (means, [n[2] for n in norms]), {"alpha": momentum})
            graph.call_function(
                torch._foreach_add_, (variances, [n[3] for n in norms]), {"alpha": _unbiased(momentum, count)}
            )


def _update_statistics_here(
    graph: torch.fx.Graph, key: tuple, stats: tuple[torch.fx.Node, ...], batch_stats: tuple[torch.fx.Node, ...]
) -> None:
    """One norm's updates, right after its batch statistics (others read or write its running
    statistics, so the writes keep their place)."""
    momentum, count, _ = key
    with graph.inserting_before(batch_stats[1].next):
        graph.call_method("lerp_", (stats[0], batch_stats[0], momentum))
        unbiased = (
            batch_stats[1] if count is None else graph.call_function(torch.mul, (batch_stats[1], count / (count - 1)))
        )
        graph.call_method("lerp_", (stats[1], unbiased, momentum))


def _unbiased(momentum: float, count: int | None) -> float:
    """The weight of a batch's biased variance in a running-variance update: ``momentum`` times
    Bessel's ``n / (n - 1)``; ``momentum`` where the variance is unbiased already (None)."""
    return momentum if count is None else momentum * count / (count - 1)


def _own_statistics(node: torch.fx.Node, args: dict[str, Any]) -> bool:
    """Whether the norm is the only reader and writer of its running statistics."""
    return all(
        isinstance(s, torch.fx.Node) and set(s.users) == {node} for s in (args["running_mean"], args["running_var"])
    )


def _counter_increments(gm: torch.fx.GraphModule) -> dict[Any, list[torch.fx.Node]]:
    """``buffer.add_(c)`` nodes (a norm's ``num_batches_tracked += 1``) on graph inputs that
    nothing else reads, whose result nothing reads, grouped by ``c``: groups of two or more."""
    groups: dict[Any, list[torch.fx.Node]] = defaultdict(list)
    for node in gm.graph.nodes:
        if node.op != "call_method" or node.target != "add_" or len(node.args) != 2 or node.kwargs or node.users:
            continue
        buffer, step = node.args
        if (
            isinstance(buffer, torch.fx.Node)
            and buffer.op in ("placeholder", "get_attr")
            and set(buffer.users) == {node}
            and isinstance(step, (int, float))
            and not isinstance(step, bool)
        ):
            groups[(type(step), step)].append(node)
    return {k: v for k, v in groups.items() if len(v) >= 2}


def _increment_together(graph: torch.fx.Graph, members: list[torch.fx.Node]) -> None:
    """One ``torch._foreach_add_`` in place of the members' ``add_`` (one kernel for all)."""
    with graph.inserting_before(members[0]):
        graph.call_function(torch._foreach_add_, ([m.args[0] for m in members], members[0].args[1]))
    for m in members:
        graph.erase_node(m)


def _computed(node: torch.fx.Node) -> torch.fx.Node:
    """``node`` with the meta its arguments' meta imply: its op run on their fake values (in
    their fake mode), or on meta-device tensors of their shapes where they hold real ones.
    Nothing is set where an argument has no such meta (the translator then runs the graph)."""
    from torch._subclasses.fake_tensor import FakeTensor

    for key in ("val", "example_value"):
        values: list[Any] = []
        known = True

        def value_of(a: torch.fx.Node) -> Any:  # (called at once, within this iteration)
            nonlocal known
            v = a.meta.get(key)  # noqa: B023
            known = known and isinstance(v, (torch.Tensor, tuple))
            return v

        args = torch.fx.node.map_arg(node.args, value_of)
        kwargs = torch.fx.node.map_arg(node.kwargs, value_of)
        if not known:
            continue
        torch.fx.node.map_arg((node.args, node.kwargs), lambda a: values.append(a.meta[key]))  # noqa: B023
        leaves = torch.utils._pytree.tree_leaves(values)
        mode = next((v.fake_mode for v in leaves if isinstance(v, FakeTensor)), None)
        if mode is None:

            def to_meta(v: Any) -> Any:
                if isinstance(v, torch.Tensor):
                    return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
                return v

            args, kwargs = torch.utils._pytree.tree_map(to_meta, (args, kwargs))
        fn: Callable[..., Any] = (
            getattr(torch.Tensor, cast(str, node.target))
            if node.op == "call_method"
            else cast("Callable[..., Any]", node.target)
        )
        with mode if mode is not None else contextlib.nullcontext(), torch.no_grad():
            node.meta[key] = fn(*args, **kwargs)
    return node
