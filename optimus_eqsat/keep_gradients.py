"""Inputs a training graph read keep their place in autograd after optimization.

A rewrite may find an input's values unused (a narrow of a cat that skips one member,
``x - x``) and drop its last reader. Autograd then gives that input no gradient (None)
where the original step gave zeros, and the difference is not cosmetic: an optimizer's
weight decay skips parameters whose gradient is None, and DistributedDataParallel
without ``find_unused_parameters`` fails on a parameter that stopped receiving one.
Each such input is read again by adding an empty sum of it (exactly zero, whatever
its values, NaN included) to an output that depended on it.

The other way round, a rewrite may give an input a gradient the original step did not: a
layer computed only for its side effect (the shared gate of a multi-task model's last
level, whose batch norm still updates its statistics while its result goes unused) batched
with live layers reads its weights through the batch, and autograd then gives them zeros
where the original left None, so weight decay and optimizer state start touching them.
Such an input is read through a ``detach`` in the optimized graph (:func:`keep_gradient_absences`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from optimus_eqsat.fxvocab import ALIASING_OPS, canonical_name
from optimus_eqsat.fxvocab.meta import META_KEYS, meta_value
from optimus_eqsat.fxvocab.mutation import is_mutating, running_stats_written, written_inputs


def keep_gradient_inputs(
    original: fx.GraphModule, optimized: fx.GraphModule, example_inputs: Sequence[Any] | None = None
) -> list[str]:
    """Re-read, in ``optimized``, the floating-point placeholders (matched by position) and
    the parameters (``get_attr`` or module calls, by name) that ``original`` read and
    ``optimized`` no longer does (:mod:`this module <optimus_eqsat.keep_gradients>`);
    returns their names. A read counts when some output depends on it differentiably (a
    module call whose result nothing uses, kept for its side effects, reads nothing). A
    placeholder's dtype is read from its meta, else from ``example_inputs`` at its position
    (a traced graph may carry no meta)."""
    before = [n for n in original.graph.nodes if n.op == "placeholder"]
    after = [n for n in optimized.graph.nodes if n.op == "placeholder"]
    if len(before) != len(after):
        return []
    outputs = graph_outputs(original)
    live = _feeding_outputs(optimized)
    kept = []
    for k, (old, new) in enumerate(zip(before, after)):
        value = _placeholder_value(old, k, example_inputs)
        if not old.users or new in live or not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            continue
        position = _dependent_output(old, outputs)
        if position is not None:
            _add_empty_sum(optimized, new, position)
            kept.append(old.name)
    # the parameters a symbolic_trace graph reads as attributes or through module calls
    still_read = {name for name, reader in _parameter_readers(optimized) if reader in live}
    for name, reader in _parameter_reads(original).items():
        position = None if name in still_read else _dependent_output(reader, outputs)
        if position is None:
            continue
        target = name
        if _parameter(optimized, name) is None:  # the rebuilt module holds only what it reads
            target = "kept_" + name.replace(".", "_")
            setattr(optimized, target, _parameter(original, name))  # the same Parameter
        with optimized.graph.inserting_before(optimized.graph.output_node()):
            attr = optimized.graph.get_attr(target)
        _add_empty_sum(optimized, attr, position)
        kept.append(name)
    if kept:
        optimized.graph.lint()
        optimized.recompile()
    return kept


def keep_gradient_absences(
    original: fx.GraphModule, optimized: fx.GraphModule, example_inputs: Sequence[Any] | None = None
) -> list[str]:
    """Read through a ``detach``, in ``optimized``, each input requiring a gradient (placeholders
    matched by position, parameters read by ``get_attr``) that no output of ``original``
    depends on and some output of ``optimized`` does (:mod:`this module
    <optimus_eqsat.keep_gradients>`); returns their names. Nothing is changed when ``original``
    writes a tensor in place that other nodes read (the dependence could then hide in the
    write). Placeholders without meta are read from ``example_inputs``, as above."""
    if not _writes_are_local(original):
        return []
    live_before, live_after = _feeding_outputs(original), _feeding_outputs(optimized)
    before = [n for n in original.graph.nodes if n.op == "placeholder"]
    after = [n for n in optimized.graph.nodes if n.op == "placeholder"]
    cut = []
    if len(before) == len(after):
        cut += [
            new
            for k, (old, new) in enumerate(zip(before, after))
            if old not in live_before and _requires_grad(_placeholder_value(old, k, example_inputs))
        ]
    readers = _parameter_readers(original)
    dead_parameters = {name for name, _ in readers} - {name for name, reader in readers if reader in live_before}
    cut += [
        n
        for n in optimized.graph.nodes
        if n.op == "get_attr" and str(n.target) in dead_parameters and _requires_grad_attr(optimized, n)
    ]
    cut = [n for n in cut if n in live_after and n.users]
    for node in cut:
        _detach_uses(optimized, node)
    if cut:
        optimized.graph.lint()
        optimized.recompile()
    return [str(n.target) if n.op == "get_attr" else n.name for n in cut]


def _writes_are_local(gm: fx.GraphModule) -> bool:
    """Whether every in-place write in ``gm`` is a norm's statistics update, or a write that
    nothing else reads, to a computed tensor that aliases nothing (``relu(x, inplace=True)``
    on a linear's output) or to an integer input (a batch norm's ``num_batches_tracked``):
    then the graph's edges show every dependence."""
    for node in gm.graph.nodes:
        if not is_mutating(gm, node) or running_stats_written(node):
            continue
        for written in written_inputs(gm, node):
            if any(user is not node for user in written.users):
                return False
            if written.op in ("placeholder", "get_attr"):
                value = meta_value(written)
                if not isinstance(value, torch.Tensor) or value.is_floating_point():
                    return False
            elif canonical_name(written) in ALIASING_OPS | _MAY_RETURN_INPUT:
                return False
    return True


# Ops that return their input itself when there is nothing to convert (``x.float()`` on a float
# tensor): a write to their result is a write to the input.
_MAY_RETURN_INPUT = frozenset(
    {"to", "type", "type_as", "float", "double", "half", "bfloat16", "int", "long", "cpu", "cuda", "view_as"}
)


def _feeding_outputs(gm: fx.GraphModule) -> set[fx.Node]:
    """The nodes some output of ``gm`` depends on differentiably (itself included): a
    ``detach`` passes no gradient to what it reads."""
    reached: set[fx.Node] = set()
    work = list(gm.graph.output_node().all_input_nodes)
    while work:
        node = work.pop()
        if node not in reached:
            reached.add(node)
            if not _detaches(node):
                work.extend(node.all_input_nodes)
    return reached


def _detaches(node: fx.Node) -> bool:
    return node.op in ("call_function", "call_method") and canonical_name(node) == "detach"


def _parameter_readers(gm: fx.GraphModule) -> list[tuple[str, fx.Node]]:
    """(parameter name, node) for every node reading a parameter that requires a gradient."""
    reads = []
    for node in gm.graph.nodes:
        if node.op == "get_attr" and _requires_grad_attr(gm, node):
            reads.append((str(node.target), node))
        elif node.op == "call_module":
            module = gm.get_submodule(str(node.target))
            reads += [(f"{node.target}.{name}", node) for name, p in module.named_parameters() if p.requires_grad]
    return reads


def _requires_grad(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.requires_grad


def _placeholder_value(node: fx.Node, position: int, example_inputs: Sequence[Any] | None) -> Any:
    """The value placeholder ``node`` (the ``position``-th) stands for: its meta, else the
    example input there (None when neither is known)."""
    value = meta_value(node)
    if value is None and example_inputs is not None and position < len(example_inputs):
        value = example_inputs[position]
    return value


def _requires_grad_attr(gm: fx.GraphModule, node: fx.Node) -> bool:
    p = _parameter(gm, str(node.target))
    return p is not None and p.requires_grad


def _detach_uses(gm: fx.GraphModule, node: fx.Node) -> None:
    """Every reader of ``node`` reads ``node.detach()`` instead."""
    detached = detach_after(gm.graph, node)
    node.replace_all_uses_with(detached, delete_user_cb=lambda user: user is not detached)


def detach_after(graph: fx.Graph, node: fx.Node) -> fx.Node:
    """A new ``node.detach()`` just after ``node``, with its meta (no reader yet)."""
    with graph.inserting_after(node):
        detached = graph.call_method("detach", (node,))
    for key in META_KEYS:
        value = node.meta.get(key)
        if value is not None:
            detached.meta[key] = value.detach() if isinstance(value, torch.Tensor) else value
    return detached


def graph_outputs(gm: fx.GraphModule) -> list[fx.Node | None]:
    """The graph's outputs in order (None where an output is not a node)."""
    output = gm.graph.output_node()
    return [a if isinstance(a, fx.Node) else None for a in pytree.tree_leaves(output.args[0])]


def _parameter_reads(gm: fx.GraphModule) -> dict[str, fx.Node]:
    """Parameters that require gradients, read by get_attr (with users) or module calls -> the
    first node reading each."""
    reads: dict[str, fx.Node] = {}
    for name, node in _parameter_readers(gm):
        if node.op != "get_attr" or node.users:
            reads.setdefault(name, node)
    return reads


def _parameter(gm: fx.GraphModule, target: str) -> torch.nn.Parameter | None:
    try:
        return gm.get_parameter(target)
    except AttributeError:
        return None


def _dependent_output(node: fx.Node, outputs: list[fx.Node | None]) -> int | None:
    """The position of the first output that depends on ``node`` differentiably (through no
    ``detach``) and may be floating."""
    reached, work = set(), [node]
    while work:
        n = work.pop()
        if n not in reached:
            reached.add(n)
            work.extend(user for user in n.users if not _detaches(user))
    for k, out in enumerate(outputs):
        if out is not None and out in reached and _floating_output(out):
            return k
    return None


def _floating_output(node: fx.Node) -> bool:
    value = meta_value(node)
    return not isinstance(value, torch.Tensor) or value.is_floating_point()


def _add_empty_sum(gm: fx.GraphModule, value: fx.Node, position: int) -> None:
    """Output ``position`` of ``gm`` plus an empty sum of ``value``: exactly zero."""
    graph = gm.graph
    output = graph.output_node()
    target = graph_outputs(gm)[position]
    if target is None:
        return
    with graph.inserting_before(output):
        empty = graph.call_function(torch.narrow, (graph.call_method("reshape", (value, -1)), 0, 0, 0))
        zero = graph.call_method("type_as", (graph.call_method("sum", (empty,)), target))
        kept = graph.call_function(torch.add, (target, zero))
    kept.meta = dict(target.meta)
    output.replace_input_with(target, kept)
