"""Inputs a training graph read keep their place in autograd after optimization.

A rewrite may find an input's values unused (a narrow of a cat that skips one member,
``x - x``) and drop its last reader. Autograd then gives that input no gradient (None)
where the original step gave zeros, and the difference is not cosmetic: an optimizer's
weight decay skips parameters whose gradient is None, and DistributedDataParallel
without ``find_unused_parameters`` fails on a parameter that stopped receiving one.
Each such input is read again by adding an empty sum of it (exactly zero, whatever
its values, NaN included) to an output that depended on it.
"""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from optimus_eqsat.fxvocab.meta import meta_value


def keep_gradient_inputs(original: fx.GraphModule, optimized: fx.GraphModule) -> list[str]:
    """Re-read, in ``optimized``, the floating-point placeholders (matched by position) and
    the parameters (``get_attr`` or module calls, by name) that ``original`` read and
    ``optimized`` no longer does (:mod:`this module <optimus_eqsat.keep_gradients>`);
    returns their names."""
    before = [n for n in original.graph.nodes if n.op == "placeholder"]
    after = [n for n in optimized.graph.nodes if n.op == "placeholder"]
    if len(before) != len(after):
        return []
    outputs = graph_outputs(original)
    kept = []
    for old, new in zip(before, after):
        if not old.users or new.users or not _floating(old):
            continue
        position = _dependent_output(old, outputs)
        if position is not None:
            _add_empty_sum(optimized, new, position)
            kept.append(old.name)
    # the parameters a symbolic_trace graph reads as attributes or through module calls
    still_read = set(_parameter_reads(optimized))
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


def graph_outputs(gm: fx.GraphModule) -> list[fx.Node | None]:
    """The graph's outputs in order (None where an output is not a node)."""
    output = gm.graph.output_node()
    return [a if isinstance(a, fx.Node) else None for a in pytree.tree_leaves(output.args[0])]


def _parameter_reads(gm: fx.GraphModule) -> dict[str, fx.Node]:
    """Parameters that require gradients, read by get_attr or module calls -> the first node
    reading each."""
    reads: dict[str, fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.users:
            p = _parameter(gm, str(node.target))
            if p is not None and p.requires_grad:
                reads.setdefault(str(node.target), node)
        elif node.op == "call_module":
            for name, p in gm.get_submodule(str(node.target)).named_parameters():
                if p.requires_grad:
                    reads.setdefault(f"{node.target}.{name}", node)
    return reads


def _parameter(gm: fx.GraphModule, target: str) -> torch.nn.Parameter | None:
    try:
        return gm.get_parameter(target)
    except AttributeError:
        return None


def _floating(node: fx.Node) -> bool:
    """Whether the placeholder ``node`` holds a floating tensor (by its meta)."""
    value = meta_value(node)
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _dependent_output(node: fx.Node, outputs: list[fx.Node | None]) -> int | None:
    """The position of the first output that depends on ``node`` and may be floating."""
    reached, work = set(), [node]
    while work:
        n = work.pop()
        if n not in reached:
            reached.add(n)
            work.extend(n.users)
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
