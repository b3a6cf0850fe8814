"""Dropouts that share one random draw, so the optimizer can batch them.

What the optimizer promises about random ops: the same distribution and independent
draws, not eager's numbers. Inductor itself does not reproduce eager's random stream
unless ``torch._inductor.config.fallback_random`` is set; under that config nothing
here applies and random ops keep their order among themselves (translate.py), so
eager's stream is kept.

A dropout in training is ``x * (rand_like(x) > p) / (1 - p)`` (Inductor's own
decomposition). Its random draw is not a function of its input, so the e-graph cannot
batch it as it batches pure ops: two e-nodes of one class drawing their own numbers
would make the program's value depend on which one extraction picks. Instead, before
translation, dropouts of one probability, shape and dtype that could run side by side
(none depends on another through data: same depth, see :func:`_levels`) take their
masks from one draw::

    draw = torch.rand(n, *shape)                 # one draw per group, no inputs
    y_k = x_k * (draw[k] > p) * (1 / (1 - p))    # member k: pure ops of x_k and a view

Each member's mask is then a view of the shared draw, a value like any other: the
members' ops batch as elementwise ops, and the stack of all the draw's rows is the draw
itself. Members draw disjoint elements of one uniform tensor: independent, with
probability ``1 - p`` of being kept, as eager's. Groups of one, dynamic shapes and
dropouts without tensor meta are left as they are.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from optimus_eqsat.checkpoint_regions import region_tags
from optimus_eqsat.fxvocab.meta import meta_value

__all__ = ["keeps_rng_order", "share_dropout_draws", "shared_draw_groups"]


def keeps_rng_order() -> bool:
    """Whether random ops keep eager's order: Inductor reproduces eager's random stream only
    under its ``fallback_random`` config."""
    from torch._inductor import config

    return bool(config.fallback_random)


def _dropout(node: torch.fx.Node) -> tuple[float, tuple[int, ...], torch.dtype, torch.device] | None:
    """(p, shape, dtype, device) of a functional dropout in training of a static-shaped
    floating tensor, not in place, with 0 < p < 1; None for any other node."""
    if node.op != "call_function" or node.target is not F.dropout:
        return None
    names = ("input", "p", "training", "inplace")
    args = {"p": 0.5, "training": True, "inplace": False, **dict(zip(names, node.args)), **node.kwargs}
    p = args["p"]
    if set(args) - set(names) or args["training"] is not True or args["inplace"] is not False:
        return None
    if not isinstance(p, float) or not 0 < p < 1 or not isinstance(args["input"], torch.fx.Node):
        return None
    value = meta_value(node)
    if (
        not isinstance(value, torch.Tensor)
        or not value.is_floating_point()
        or not all(isinstance(s, int) for s in value.shape)
    ):
        return None
    return p, tuple(value.shape), value.dtype, value.device


def _levels(nodes: list[torch.fx.Node], keys: dict[torch.fx.Node, Any]) -> dict[torch.fx.Node, int]:
    """Per keyed node, 1 + the highest level among the nodes of its key it depends on (0
    when none): nodes of one key and level never read each other."""
    carried: dict[torch.fx.Node, dict[Any, int]] = {}
    levels: dict[torch.fx.Node, int] = {}
    empty: dict[Any, int] = {}
    for node in nodes:
        inputs = [carried[a] for a in node.all_input_nodes if a in carried]
        below = inputs[0] if len(inputs) == 1 else empty
        if len(inputs) > 1:
            below = {}
            for seen in inputs:
                for key, level in seen.items():
                    below[key] = max(level, below.get(key, -1))
        if node in keys:
            key = keys[node]
            levels[node] = below.get(key, -1) + 1
            below = {**below, key: levels[node]}
        carried[node] = below
    return levels


def shared_draw_groups(gm: torch.fx.GraphModule) -> list[list[torch.fx.Node]]:
    """The dropouts that would share one draw: groups of two or more of one probability,
    shape, dtype and device and one level (none reads another), in graph order."""
    nodes = list(gm.graph.nodes)
    keys = {n: key for n in nodes if (key := _dropout(n)) is not None}
    if len(keys) < 2 or len(set(keys.values())) == len(keys):
        return []
    groups: dict[tuple, list[torch.fx.Node]] = defaultdict(list)
    for node, level in _levels(nodes, keys).items():
        groups[(keys[node], level)].append(node)
    return [members for members in groups.values() if len(members) >= 2]


def share_dropout_draws(gm: torch.fx.GraphModule) -> int:
    """Rewrite ``gm`` in place so each group of :func:`shared_draw_groups` takes its masks from
    one ``torch.rand`` (see the module docstring); the number of dropouts rewritten."""
    graph = gm.graph
    first = next(n for n in graph.nodes if n.op != "placeholder")
    rewritten = 0
    for members in shared_draw_groups(gm):
        found = _dropout(members[0])
        assert found is not None  # shared_draw_groups groups only such dropouts
        p, shape, dtype, device = found
        with graph.inserting_before(first):
            draw = graph.call_function(torch.rand, ((len(members), *shape),), {"dtype": dtype, "device": device})
        _set_value(draw, (len(members), *shape), dtype, members[0])
        for k, node in enumerate(members):
            x = node.args[0] if node.args else node.kwargs["input"]
            with graph.inserting_before(node):
                row = graph.call_function(torch.select, (draw, 0, k))
                keep = graph.call_function(torch.gt, (row, p))
                masked = graph.call_function(torch.mul, (x, keep))
                out = graph.call_function(torch.mul, (masked, 1.0 / (1.0 - p)))
            for new, kind in ((row, dtype), (keep, torch.bool), (masked, dtype), (out, dtype)):
                _set_value(new, shape, kind, node)
                new.meta.update(region_tags(node))  # (checkpointed: recomputed from the saved draw)
            node.replace_all_uses_with(out)
            graph.erase_node(node)
            rewritten += 1
    if rewritten:
        graph.lint()
        gm.recompile()
    return rewritten


def _set_value(new: torch.fx.Node, shape: tuple[int, ...], dtype: torch.dtype, like: torch.fx.Node) -> None:
    """Meta of ``new``: a tensor of ``shape`` and ``dtype`` under every meta key ``like`` has
    (in ``like``'s fake mode where it has one)."""
    for key in ("val", "example_value"):
        old = like.meta.get(key)
        if isinstance(old, torch.Tensor):
            mode = getattr(old, "fake_mode", None)
            if mode is not None:
                with mode:
                    new.meta[key] = torch.empty(shape, dtype=dtype, device=old.device)
            else:
                new.meta[key] = torch.empty(shape, dtype=dtype, device="meta")
