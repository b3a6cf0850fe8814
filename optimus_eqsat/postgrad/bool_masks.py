"""Recompute boolean masks in the backward instead of saving them (training on the CPU).

AOTAutograd's partitioner saves for the backward whatever is smallest, and a ReLU's
``threshold_backward`` then keeps the mask ``relu_out <= 0`` as a bool tensor (one
byte an element) next to ``relu_out`` itself, which the backward of the next matmul
needs anyway. On the CPU that choice is slow: Inductor's C++ kernels store bool
tensors through a vector-mask conversion that costs tens of times a float store
(torch 2.13), so a training forward with many ReLUs can spend a fifth of its step
writing masks. Reading a mask is cheap; writing it is not.

:class:`RecomputeMasks` is a joint-graph pass (Inductor's ``joint_custom_post_pass``,
before the partition): it marks such a mask ``MUST_RECOMPUTE`` when every tensor it
is computed from is saved for the backward regardless (an input of the graph, or a
tensor the backward reads, directly or through views), so the partition saves no
more bytes than before and the backward's fused kernel recomputes the mask from what
it reads anyway. A mask of a piece of a concatenation the backward reads (the
experts' outputs stacked for a gate) is recomputed from that slice of the
concatenation; the backward then holds the concatenation longer, which can raise its
peak memory, so the measured choice's memory rule decides. Masks of anything else (a
dropout's random numbers, say) stay saved: recomputing those would save four bytes
where one was.

Only graphs on the CPU are touched; Triton stores bool tensors at full speed. The
backend installs the pass around its own compile (``recompute_masks=True``). Masks
recomputed from saved tensors alone save no more bytes and store no bool tensor, so
they need no measurement: the measured choice times the result against Inductor's own
program only where a mask reads a slice of a concatenation (or another rewrite of ours
is in the program).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.fx
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch.utils.checkpoint import CheckpointPolicy

from optimus_eqsat.inductor_compat import first_line, is_dynamo_signal

__all__ = ["RecomputeMasks", "recomputable_masks"]

log = logging.getLogger("optimus_eqsat")


def _value(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _backward_nodes(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Nodes that depend on a tangent: the backward part of a joint graph."""
    backward: set[torch.fx.Node] = set()
    for node in graph.nodes:  # topological order
        if node.op == "placeholder":
            if str(node.target).startswith("tangents"):
                backward.add(node)
        elif any(arg in backward for arg in node.all_input_nodes):
            backward.add(node)
    return backward


def _is_view(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and bool(getattr(node.target, "is_view", False))


def _read_by_backward(node: torch.fx.Node, backward: set[torch.fx.Node]) -> bool:
    """Whether the backward reads ``node``'s tensor: an input of the graph (kept alive by
    the caller anyway), or read by a backward node directly or through forward views."""
    if node.op == "placeholder":
        return True
    seen, todo = set(), [node]
    while todo:
        current = todo.pop()
        for user in current.users:
            if user in backward:
                return True
            if _is_view(user) and user not in seen:
                seen.add(user)
                todo.append(user)
    return False


def _piece_of_saved_cat(node: torch.fx.Node, backward: set[torch.fx.Node]) -> tuple | None:
    """``(cat, dim, start, end)`` when ``node`` is a piece of a forward ``aten.cat`` the
    backward reads (experts stacked for a gate): the mask can be recomputed from that slice
    of the cat instead of saving the piece as well. None otherwise."""
    for user in node.users:
        if (
            user.op != "call_function"
            or user.target is not torch.ops.aten.cat.default
            or user in backward
            or not _read_by_backward(user, backward)
        ):
            continue
        pieces = cast(Sequence[torch.fx.node.Argument], user.args[0])
        if sum(piece is node for piece in pieces) > 1:
            # a piece the cat holds twice: Inductor (torch 2.13) then writes the forward's cat
            # wrongly once a mask reads a slice of it (test_a_cat_holding_a_piece_twice_...)
            continue
        dim = user.args[1] if len(user.args) > 1 else user.kwargs.get("dim", 0)
        value = _value(user)
        dim = dim % value.dim()
        start = 0
        for piece in pieces:
            size = getattr(_value(piece), "shape", (None,) * (dim + 1))[dim]
            if not isinstance(size, int):  # a symbolic (or unknown) size: no constant slice to write
                return None
            if piece is node:
                return user, dim, start, start + size
            start += size
    return None


def _depends_on(node: torch.fx.Node, ancestor: torch.fx.Node, position: dict[torch.fx.Node, int]) -> bool:
    """Whether ``node`` reads ``ancestor``, directly or through other nodes (``position``: the
    graph's order; nothing before ``ancestor`` can read it)."""
    seen, work, first = set(), [node], position[ancestor]
    while work:
        n = work.pop()
        if n is ancestor:
            return True
        for a in n.all_input_nodes:
            if a not in seen and position.get(a, first) >= first:
                seen.add(a)
                work.append(a)
    return False


def recomputable_masks(graph: torch.fx.Graph, sliced: list[torch.fx.Node] | None = None) -> list[torch.fx.Node]:
    """Marks-to-be: the forward nodes of a joint ``graph`` that compute a bool tensor from
    tensors the backward has anyway (see the module docstring): inputs of the graph, tensors
    the backward reads, other such masks, or pieces of a concatenation the backward reads
    (the mask's argument is then rewritten to that slice of the concatenation, in place).
    Outputs of the graph are left alone. The masks read from such a slice (which hold the
    concatenation longer, see the module docstring) are also appended to ``sliced``."""
    backward = _backward_nodes(graph)
    if not backward:
        return []
    outputs = {arg for node in graph.nodes if node.op == "output" for arg in node.all_input_nodes}
    masks: list[torch.fx.Node] = []
    position = {n: k for k, n in enumerate(graph.nodes)}  # (slices added below sit before their mask)
    for node in list(graph.nodes):
        value = _value(node)
        if (
            node.op != "call_function"
            or node in backward
            or node in outputs
            or _is_view(node)
            or not isinstance(value, torch.Tensor)
            or value.dtype != torch.bool
            or value.device.type != "cpu"
            or torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())
        ):  # random: never redone
            continue
        sources = [arg for arg in node.all_input_nodes if isinstance(_value(arg), torch.Tensor)]
        pieces = {
            arg: _piece_of_saved_cat(arg, backward)
            for arg in sources
            if arg not in masks and not _read_by_backward(arg, backward)
        }
        if not sources or any(piece is None or _depends_on(piece[0], node, position) for piece in pieces.values()):
            continue  # (a cat computed from the mask itself cannot be read to compute it)
        for arg, (cat, dim, start, end) in cast(dict[torch.fx.Node, tuple], pieces).items():  # no None left
            with graph.inserting_before(node):
                piece = graph.call_function(torch.ops.aten.slice.Tensor, (cat, dim, start, end))
            piece.meta["val"] = _value(arg)
            node.replace_input_with(arg, piece)
        if pieces and sliced is not None:
            sliced.append(node)
        masks.append(node)
    return masks


class RecomputeMasks(CustomGraphPass):
    """Inductor ``joint_custom_post_pass``: marks :func:`recomputable_masks` for
    recomputation in the backward. How many it marked in each joint graph goes to every
    list in ``sinks``; how many of those read a slice of a concatenation (the only ones that
    can raise the peak memory) to every list in ``sliced_sinks``."""

    def __init__(self) -> None:
        self.sinks: list[list[int]] = []
        self.sliced_sinks: list[list[int]] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        sliced: list[torch.fx.Node] = []
        try:
            masks = recomputable_masks(graph, sliced)
        except Exception as exc:  # never fail the user's compile: its rewrites are exact, tags optional
            if is_dynamo_signal(exc):
                raise
            log.warning("optimus_eqsat joint graph: masks left saved: %s", first_line(exc))
            masks, sliced = [], []
        for node in masks:
            node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
        for sink in self.sinks:
            sink.append(len(masks))
        for sink in self.sliced_sinks:
            sink.append(len(sliced))

    def uuid(self) -> bytes:
        return get_hash_for_files((__file__,), "recompute-masks")
