"""No-grad regions of a training graph written as detaches, so their ops can be rewritten.

``with torch.no_grad():`` inside a compiled forward (a frozen teacher's or target network's
pass, a stop-gradient branch) reaches the optimizer as ``_set_grad_enabled(False)`` ...
``_set_grad_enabled(True)`` nodes around the region's ops. The e-graph has no notion of grad
mode: a batch of frozen and training experts would train the frozen ones. But what grad mode
off does to an op is what reading its inputs through ``detach`` does: its result needs no
gradient and none flows back through it. :func:`with_no_grad_regions_detached` writes that
into a copy of the graph (every value made outside a region and read inside it is read
through a ``detach``) and drops the switches; the ops then batch with the rest, and the
batched program gives the region's parameters no gradient (``keep_gradients`` keeps a
parameter read only through a ``detach`` without one).
"""

from __future__ import annotations

import torch
import torch.fx
import torch.utils._pytree as pytree

from optimus_eqsat.checkpoint_regions import inline_checkpoints
from optimus_eqsat.fx_graphs import copy_module
from optimus_eqsat.fxvocab import meta_value
from optimus_eqsat.fxvocab.global_state import is_switch, switch_arg
from optimus_eqsat.fxvocab.symbolic import DeclinedGraph
from optimus_eqsat.keep_gradients import detach_after

__all__ = ["with_no_grad_regions_detached"]

_SWITCH = "_set_grad_enabled"


def with_no_grad_regions_detached(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` (a graph run with grad mode on) whose no-grad regions read every value
    made outside them through a ``detach``, the grad-mode switches dropped: it computes the
    same values and gradients as ``gm``. Checkpointed regions are inlined first (a region may
    sit in one). Raises :class:`DeclinedGraph` where a region reads a value whose kind its meta
    does not say."""
    result = copy_module(gm)
    inline_checkpoints(result)
    graph = result.graph
    grad, made_without_grad = True, set()
    detached: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in list(graph.nodes):
        if is_switch(node, _SWITCH):
            grad = bool(switch_arg(node, 0, "mode", True))
            continue
        if grad or node.op not in ("call_function", "call_method", "call_module"):
            continue
        if node.op == "call_module":  # (its parameters are read inside it)
            raise DeclinedGraph(f"a no-grad region calls a module ({node.name}): left as it is")
        made_without_grad.add(node)
        for source in node.all_input_nodes:
            if source in made_without_grad:
                continue
            value = meta_value(source)
            if value is None:
                raise DeclinedGraph(f"a no-grad region reads {source.name}, whose value the graph's meta does not say")
            if isinstance(value, torch.Tensor):
                if value.is_floating_point() or value.is_complex():
                    if source not in detached:
                        detached[source] = detach_after(graph, source)
                    node.replace_input_with(source, detached[source])
            elif any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(value)):
                # (a ``getitem`` of a tuple made outside: its tensors cannot be detached one by one here)
                raise DeclinedGraph(f"a no-grad region reads {source.name}, a collection of tensors: left as it is")
    if not grad:
        raise DeclinedGraph("grad mode is off at the end of the graph: left as it is")
    for node in [n for n in graph.nodes if is_switch(n, _SWITCH)]:
        graph.erase_node(node)
    result.recompile()
    return result
