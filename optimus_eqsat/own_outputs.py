"""Outputs of an optimized training graph own their memory instead of slicing a batched result.

A batched program computes several of the original's outputs as one tensor and hands
each back as a slice of it (``narrow``, a split piece, ``x[a:b]``). AOTAutograd returns
an output that is a view of an intermediate by returning the intermediate and redoing
the view outside the compiled graph, so in training every such output gets an eager
autograd node: its backward (``slice_backward``) allocates a zero tensor the size of
the whole batched result, copies the output's gradient into it, and the engine adds
those full-size tensors together, op by op on the host, every step. Measured on the
zoo at batch 32 on one CPU thread (interleaved rounds, step time over Inductor's):
mmoe 1.08 -> 1.05, ple 1.26 -> 1.21, dynamic_schema 0.94 -> 0.93 with the outputs
copied out. A copy inside the graph costs one small kernel and its backward is fused
into the compiled backward, so such outputs are copied (``torch.clone``) in training.
Views of inputs are left alone (they alias memory the caller owns, not ours).

The reverse also holds: an output the original returned as a view of an input (a piece of
a split, a transpose, ...) is returned as that same view of that input
(:func:`input_views_as_written`), where the optimized program computes its values
otherwise (``reshape`` of a ``permute`` copies). The caller, or the next graph piece under
Dynamo, sees the aliasing eager gave; and AOTAutograd (torch 2.13) replays several views of
one intermediate from view metadata it has freed (a random shape, or a crash, at the
forward's end: found by the compiled fuzzer on a graph cut by a graph break), where views
of an input take another, sound, path.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.fx.passes.shape_prop import TensorMetadata

from optimus_eqsat.fxvocab import ALIASING_OPS, VIEW_OPS, canonical_name
from optimus_eqsat.fxvocab.meta import ExampleInputError, meta_value, record_shapes
from optimus_eqsat.keep_gradients import graph_outputs

__all__ = ["contiguous_outputs", "input_views_as_written", "own_sliced_outputs"]

#: Ops whose result is a slice of their first argument.
SLICING_OPS = frozenset({"narrow", "slice", "select"})
#: Ops returning a sequence of slices of their first argument (read through ``getitem``).
SPLITTING_OPS = frozenset({"split", "split_with_sizes", "chunk", "unbind", "tensor_split"})


def own_sliced_outputs(original: fx.GraphModule, optimized: fx.GraphModule) -> list[str]:
    """Copy each output of ``optimized`` that slices a tensor computed in the graph where the
    output at the same position of ``original`` was no view (aliasing the original had,
    the user may rely on; :mod:`this module <optimus_eqsat.own_outputs>`). Returns the
    names of the outputs copied."""
    before, after = graph_outputs(original), graph_outputs(optimized)
    if len(before) != len(after):
        return []
    # (in output order, not a set's: the program's code, and so every cache key, stays the same)
    chosen = [
        new for old, new in zip(before, after) if new is not None and _slices_an_intermediate(new) and not _is_view(old)
    ]
    return _replace_outputs(optimized, chosen, _clone)


def input_views_as_written(original: fx.GraphModule, optimized: fx.GraphModule) -> list[str]:
    """Return, at each output position where ``original`` returned a view of one of its
    inputs, that chain of views of the same input of ``optimized`` where its own output is no
    view of that input (:mod:`this module <optimus_eqsat.own_outputs>`). Views launch
    nothing. Returns the names of the outputs replaced."""
    before, after = graph_outputs(original), graph_outputs(optimized)
    if len(before) != len(after):
        return []
    inputs = {node.target: node for node in optimized.graph.find_nodes(op="placeholder")}
    chains: dict[fx.Node, list[fx.Node]] = {}
    for old, new in zip(before, after):
        chain = _input_view_chain(old)
        if new is None or not chain or chain[0].target not in inputs:
            continue
        mine = _input_view_chain(new, copying=_MAY_COPY)
        if mine and mine[0].target == chain[0].target:
            continue  # a view of the same input already
        if chains.setdefault(new, chain) is not chain:  # (one node at two positions, two chains)
            chains[new] = []
    chosen = [node for node, chain in chains.items() if chain]

    def rewrite(graph: fx.Graph, node: fx.Node) -> fx.Node:
        chain = chains[node]
        env = {chain[0]: inputs[chain[0].target]}
        for view in chain[1:]:
            env[view] = graph.node_copy(view, lambda a: env[a])
        return env[chain[-1]]

    return _replace_outputs(optimized, chosen, rewrite)


# Ops that return a view only when the layout allows (a reshape of a permute copies).
_MAY_COPY = frozenset({"reshape", "reshape_as", "flatten", "unflatten", "contiguous", "_unsafe_view"})


def _input_view_chain(node: fx.Node | None, copying: frozenset[str] = frozenset()) -> list[fx.Node]:
    """The nodes from a placeholder to ``node`` when ``node`` is a view of that placeholder
    through view ops (but those named in ``copying``) and pieces of splits, each reading
    nothing else of the graph (the placeholder first); empty otherwise."""
    chain: list[fx.Node] = []
    while node is not None and node.op in ("call_function", "call_method") and node.args:
        is_piece = node.op == "call_function" and node.target is operator.getitem
        name = canonical_name(node) if not is_piece else ""
        if is_piece:
            base = node.args[0]
            if not (
                isinstance(base, fx.Node)
                and base.op in ("call_function", "call_method")
                and canonical_name(base) in SPLITTING_OPS
            ) and not _tensor_index(node.args[1] if len(node.args) > 1 else None):
                return []
        elif name in copying or (name not in VIEW_OPS and name not in SLICING_OPS and name not in SPLITTING_OPS):
            return []
        source = node.args[0]
        reads = [a for a in node.all_input_nodes if a is not source]
        if reads or not isinstance(source, fx.Node):
            return []  # (a size read from the graph, an index tensor: not a plain view)
        chain.append(node)
        node = source
    if node is None or node.op != "placeholder":
        return []
    return [node, *reversed(chain)]


def contiguous_outputs(
    original: fx.GraphModule, optimized: fx.GraphModule, example_inputs: Sequence[Any] | None = None
) -> list[str]:
    """Make contiguous each output of ``optimized`` that the original returned contiguous and
    the optimized program does not (a column of a batched result, say): its values are equal,
    but a caller's ``view``, or ``randn_like`` drawing an upstream gradient, reads the layout.
    Layouts come from shape meta, else (a ``symbolic_trace`` graph has none) from a run of
    each graph on ``example_inputs``; an output the original surely returned contiguous is
    made contiguous unless it surely is. Returns the names of the outputs made contiguous."""
    before, after = graph_outputs(original), graph_outputs(optimized)
    if len(before) != len(after):
        return []
    was = _output_layouts(original, before, example_inputs, meta_value)
    now = _output_layouts(optimized, after, example_inputs, _propagated_value)
    # (unknown in the optimized program: made contiguous too, which costs nothing where it is)
    chosen = [
        new for new, old_c, new_c in zip(after, was, now) if new is not None and old_c is True and new_c is not True
    ]
    return _replace_outputs(optimized, chosen, lambda graph, node: graph.call_method("contiguous", (node,)))


def _propagated_value(node: fx.Node) -> Any:
    """``meta["val"]`` of a node of an optimized graph, fake-propagated over it; its other meta
    (ShapeProp's ``tensor_meta``) may be copied from the original node of the same value, whose
    layout the new one need not have."""
    return node.meta.get("val")


def _output_layouts(
    gm: fx.GraphModule,
    outputs: list[fx.Node | None],
    example_inputs: Sequence[Any] | None,
    read: Callable[[fx.Node], Any],
) -> list[bool | None]:
    """Per output of ``gm``: whether it is contiguous (None when unknown), from what ``read``
    finds in its meta, else from one run of ``gm`` on ``example_inputs`` (:func:`record_shapes`,
    which leaves the caller's inputs, buffers and RNG state as they were)."""
    layouts = [None if node is None else _layout(read(node)) for node in outputs]
    if example_inputs is None or all(c is not None for c, node in zip(layouts, outputs) if node is not None):
        return layouts
    try:
        values = record_shapes(gm, tuple(example_inputs))
    except ExampleInputError:
        return layouts
    return [c if c is not None or node is None else _layout(values.get(node)) for c, node in zip(layouts, outputs)]


def _clone(graph: fx.Graph, node: fx.Node) -> fx.Node:
    """``torch.clone(node)``, with ``node``'s meta (a clone keeps its layout)."""
    copy = graph.call_function(torch.clone, (node,))
    copy.meta = dict(node.meta)
    return copy


def _replace_outputs(
    optimized: fx.GraphModule, chosen: Iterable[fx.Node], make: Callable[[fx.Graph, fx.Node], fx.Node]
) -> list[str]:
    """Return ``make(graph, node)`` in place of each ``chosen`` output of ``optimized``; the
    names of the nodes replaced."""
    chosen = list(dict.fromkeys(chosen))
    if not chosen:
        return []
    graph = optimized.graph
    output = graph.output_node()
    copies: dict[fx.Node, fx.Node] = {}
    for node in chosen:
        with graph.inserting_before(output):
            copies[node] = make(graph, node)
    output.args = tuple(
        fx.node.map_aggregate(a, lambda v: copies.get(v, v) if isinstance(v, fx.Node) else v) for a in output.args
    )
    optimized.recompile()
    return sorted(node.name for node in chosen)


def _layout(value: Any) -> bool | None:
    """Whether ``value`` (a tensor, or ShapeProp's ``TensorMetadata``) is contiguous; None when
    it is neither. With symbolic sizes (a dynamic batch) True only when its strides are
    row-major whatever the sizes, known without adding a guard: an original's output is then
    taken for contiguous only when it surely is, and an optimized one's is made contiguous
    unless it surely is (``contiguous`` of a contiguous tensor is the tensor itself)."""
    if isinstance(value, TensorMetadata) and value.stride is not None:
        shape, strides = tuple(value.shape), tuple(value.stride)
    elif isinstance(value, torch.Tensor) and value.layout == torch.strided:
        shape, strides = tuple(value.shape), value.stride()
    else:
        return None
    if any(statically_known_true(size == 0) for size in shape):
        return True  # (no element: contiguous whatever the strides, as torch says)
    expected: Any = 1
    for size, stride in reversed(list(zip(shape, strides))):
        if not statically_known_true(size == 1) and not statically_known_true(stride == expected):
            return False
        expected = expected * size
    return True


def _is_view(node: fx.Node | None) -> bool:
    """Whether ``node`` may alias another tensor (an aliasing op or a piece of a split)."""
    if node is None or node.op not in ("call_function", "call_method"):
        return node is not None and node.op in ("placeholder", "get_attr")
    return canonical_name(node) in ALIASING_OPS


def _slices_an_intermediate(node: fx.Node) -> bool:
    """Whether ``node`` is a slice of a tensor the graph computes (not of an input or attribute)."""
    if node.op not in ("call_function", "call_method") or not node.args:
        return False
    base = node.args[0]
    if not isinstance(base, fx.Node):
        return False
    if node.op == "call_function" and node.target is operator.getitem:
        if base.op in ("call_function", "call_method") and canonical_name(base) in SPLITTING_OPS:
            base = base.args[0] if base.args and isinstance(base.args[0], fx.Node) else None
        elif not _tensor_index(node.args[1] if len(node.args) > 1 else None):
            return False
    elif canonical_name(node) not in SLICING_OPS:
        return False
    # through views to the tensor the slice reads: an input's memory is the caller's
    while (
        isinstance(base, fx.Node)
        and base.op in ("call_function", "call_method")
        and canonical_name(base) in ALIASING_OPS
        and base.args
    ):
        base = base.args[0]
    return isinstance(base, fx.Node) and base.op in ("call_function", "call_method", "call_module")


def _tensor_index(index: object) -> bool:
    """Whether ``index`` indexes a tensor by slices (``x[a:b]``, ``x[:, k]``), not a sequence."""
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, slice) or p is Ellipsis or p is None for p in parts)
