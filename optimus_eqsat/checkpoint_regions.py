"""Activation-checkpointed regions, inlined so the optimizer sees (and batches) their ops.

``torch.utils.checkpoint(fn, ..., use_reentrant=False)`` reaches a backend as the
higher-order op ``tag_activation_checkpoint(body, *args)``, whose body is a
GraphModule attribute. Under AOTAutograd the op runs its body with every op tagged
"recompute in the backward" (``node.meta["recompute"]``, one ``ac_graph_id`` per
region), and Inductor's partitioner then recomputes the tagged ops instead of saving
their results. Left as the op, its body is opaque to the optimizer and checkpointed
experts could not batch.

:func:`inline_checkpoints` writes each region's body into the graph itself, every
inlined node carrying the tags the op would have given it (AOTAutograd copies these
meta fields onto the aten nodes it traces from a node, so the partitioner sees the
same regions). The rebuilt program keeps them: a node of an original node's e-class
takes its meta, and a batched node computing only members of regions takes their
tags (rebuild.py), so a batch of checkpointed experts is recomputed in the backward
as the experts were. Recomputation repeats the same ops on the same values (random
ops are never recomputed: Inductor saves their results), so the gradients are
eager's. Regions with a custom selective-checkpointing policy (``context_fn``), with
attributes of their own, or with nested higher-order ops are left as they are.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

import torch
import torch.fx

__all__ = ["REGION_META", "checkpoint_calls", "inline_checkpoints", "region_tags", "with_regions_inlined"]

#: Node meta keys that say "recompute this op in the backward" (AOTAutograd copies them).
REGION_META = ("recompute", "ac_graph_id")

_region_ids = itertools.count(1 << 20)  # above the ids torch hands out for the op's own regions


def _is_checkpoint(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is getattr(
        torch.ops.higher_order, "tag_activation_checkpoint", None
    )


def _body(gm: torch.fx.GraphModule, node: torch.fx.Node) -> torch.fx.GraphModule | None:
    """The region's body when it can be inlined: a GraphModule attribute of plain calls,
    without a custom policy, attributes of its own or its own higher-order ops."""
    if not node.args or not isinstance(node.args[0], torch.fx.Node) or node.args[0].op != "get_attr":
        return None
    body = getattr(gm, str(node.args[0].target), None)
    if not isinstance(body, torch.fx.GraphModule) or "_checkpoint_context_fn" in body.meta:
        return None
    if set(node.kwargs) - {"use_reentrant", "preserve_rng_state", "determinism_check", "debug"}:
        return None  # (kwargs of the checkpointed function itself)
    for n in body.graph.nodes:
        if n.op in ("get_attr", "call_module") or (
            n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator)
        ):
            return None
    return body


def checkpoint_calls(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The checkpoint calls of ``gm`` that :func:`inline_checkpoints` would inline."""
    return [n for n in gm.graph.nodes if _is_checkpoint(n) and _body(gm, n) is not None]


def inline_checkpoints(gm: torch.fx.GraphModule) -> int:
    """Inline, in place, the body of every checkpoint call :func:`checkpoint_calls` names, its
    nodes tagged for recomputation (see the module docstring); the number of regions."""
    from torch.utils.checkpoint import CheckpointPolicy

    calls = checkpoint_calls(gm)
    graph = gm.graph
    for call in calls:
        body = _body(gm, call)
        assert body is not None  # checkpoint_calls keeps only the calls whose body inlines
        region = next(_region_ids)
        placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
        env: dict[torch.fx.Node, Any] = dict(zip(placeholders, call.args[1:]))
        outputs: Any = None
        with graph.inserting_before(call):
            for n in body.graph.nodes:
                if n.op == "placeholder":
                    continue
                if n.op == "output":
                    outputs = torch.fx.node.map_arg(n.args[0], env.__getitem__)
                    continue
                new = graph.node_copy(n, env.__getitem__)
                new.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE
                new.meta["ac_graph_id"] = region
                env[n] = new
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        for user in list(call.users):
            if user.op == "call_function" and user.target is operator.getitem and isinstance(user.args[1], int):
                user.replace_all_uses_with(outputs[user.args[1]])
                graph.erase_node(user)
        if call.users:  # read whole: the tuple of outputs
            with graph.inserting_before(call):
                whole = graph.call_function(tuple, (list(outputs),))
            call.replace_all_uses_with(whole)
        body_attr = call.args[0]
        assert isinstance(body_attr, torch.fx.Node)  # _body: the body's get_attr node
        graph.erase_node(call)
        if not body_attr.users:
            graph.erase_node(body_attr)
    if calls:
        graph.lint()
        gm.recompile()
    return len(calls)


def region_tags(node: torch.fx.Node) -> dict[str, Any]:
    """The region meta of ``node`` ({} outside checkpointed regions)."""
    return {k: node.meta[k] for k in REGION_META if k in node.meta}


def with_regions_inlined(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` itself without checkpoint calls to inline, else a copy with them inlined: the
    ops the original program runs, as the cost model must see them (it prices a checkpoint
    call as one opaque op)."""
    if not checkpoint_calls(gm):
        return gm
    from optimus_eqsat.fx_graphs import copy_module

    inlined = copy_module(gm)
    inline_checkpoints(inlined)
    return inlined
