"""Fold parameter-only computations into constants, as Inductor's freezing does.

For inference with ``torch._inductor.config.freezing = True``, Inductor treats
parameters as constants and constant-folds every computation that reads only
parameters (and other constants): a ``torch.cat`` that stacks the weights of
batched linears then costs nothing per call. Our optimizer's batched programs
(and Inductor's own batch fusions) stack parameters, so a launch count that
ignores freezing overstates the cost of both for frozen inference.

:func:`fold_parameters` computes those subgraphs once and returns a graph in
which they are ``get_attr`` constants, so any launch predictor
(``extract.fx_cost.predict_kernels``) sees what a frozen compile runs.

    >>> folded = fold_parameters(gm, example_inputs)
    >>> predicted_launches(folded)
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from optimus_eqsat.fxvocab import RANDOM_OPS, fetch_attr
from optimus_eqsat.fxvocab.mutation import is_mutating

__all__ = ["fold_parameters", "outermost", "parameter_placeholders", "parameter_values"]

# Ops whose output is not a pure function of their inputs (matched as words of
# the target's name, so "rand" also stands for "randint"): never folded.
_IMPURE = RANDOM_OPS | {"dropout"}


def parameter_placeholders(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> set[fx.Node]:
    """Placeholders whose example input is an ``nn.Parameter`` (Dynamo lifts parameters to inputs)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return {n for n, v in zip(placeholders, example_inputs) if isinstance(v, torch.nn.Parameter)}


def _impure(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether computing ``node`` could draw random numbers or write memory (``step += 1``
    on an optimizer's state, through ``operator.iadd``, is a write too)."""
    name = getattr(node.target, "__name__", str(node.target))
    return (
        node.op in ("call_module", "output", "placeholder")
        or is_mutating(gm, node)
        or any(word in name for word in _IMPURE)
        or name.endswith("_")
        and not name.endswith("__")
    )


def parameter_values(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> dict[fx.Node, Any]:
    """Every node of ``gm`` computed from parameters alone, with its value on ``example_inputs``.

    Parameters are the placeholders whose example input is an ``nn.Parameter``
    and the module's own ``get_attr`` tensors; a call is included when it is pure
    (no randomness, no mutation) and all its inputs are included. Values are
    computed without gradients; the graph is untouched.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values: dict[fx.Node, Any] = {}
    for node, value in zip(placeholders, example_inputs):
        if isinstance(value, torch.nn.Parameter):
            values[node] = value.detach()
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            if isinstance(node.target, str):
                values[node] = fetch_attr(gm, node.target)
            continue
        if node.op != "call_function" and node.op != "call_method" or _impure(gm, node):
            continue
        inputs = node.all_input_nodes
        if not inputs or not all(a in values for a in inputs):
            continue
        args = fx.node.map_arg(node.args, values.__getitem__)
        kwargs = fx.node.map_arg(node.kwargs, values.__getitem__)
        with torch.no_grad():
            if node.op == "call_function":
                values[node] = node.target(*args, **kwargs)
            else:
                values[node] = getattr(args[0], node.target)(*args[1:], **kwargs)
    return values


def outermost(values: dict[fx.Node, Any]) -> list[fx.Node]:
    """The computed tensors of ``values`` (:func:`parameter_values`) read by a node outside it,
    in graph order: what the rest of the graph needs of the parameter-only work."""
    return [
        node
        for node, value in values.items()
        if node.op not in ("placeholder", "get_attr")
        and isinstance(value, torch.Tensor)
        and not all(u in values for u in node.users)
    ]


def fold_parameters(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    select: Callable[[fx.GraphModule, Sequence[Any], dict], set] | None = None,
) -> fx.GraphModule:
    """A copy of ``gm`` with every node computed from parameters alone replaced by a constant.

    Only the outermost folded values (:func:`outermost`) become constants; the rest
    is dead code and removed. ``select(graph, example_inputs, values)``, when given,
    picks the nodes that may be folded (e.g. what a cache keeps: ``parameter_cache``).
    The input graph is untouched.
    """
    out = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    values = parameter_values(out, example_inputs)
    if select is not None:
        chosen = select(out, example_inputs, values)
        values = {n: v for n, v in values.items() if n in chosen}
    for count, node in enumerate(outermost(values)):
        name = f"_frozen_{count}"
        out.register_buffer(name, values[node].contiguous())
        with out.graph.inserting_before(node):
            const = out.graph.get_attr(name)
        const.meta = dict(node.meta)
        node.replace_all_uses_with(const)
    out.graph.eliminate_dead_code()
    out.recompile()
    return out
