"""Members' slices of one tensor taken by one split, so the backward builds their gradient once.

A batched program hands each member its slice of the batched result with ``torch.narrow``.
Autograd's backward of a narrow (``slice_backward``) is a zero tensor the size of the whole
sliced tensor with the slice's gradient written into it; N members give N of them, added
up. Inductor fuses that sum into the work that reads it when the work is pointwise, but
where the gradient feeds a reduction (a batch norm's backward sums over the batch) it
materializes every full-size term first. Measured on the rechub-style MMOE with stacked
parameters, training at batch 256 on the CPU: a (16, 256, 16) buffer, four members'
zero-padded (1024, 16) gradients, was the largest allocation at the backward's peak (962 KB
against Inductor's 543 KB). One ``split`` over the same dim has one backward, the cat of the
pieces' gradients (zeros for pieces nobody reads), the size of the sliced tensor once, and
a smaller aten graph for Inductor to compile.

Only a tensor read by nothing but narrows on one dim, of fixed sizes and positions, is
split, and only when the tensor it reshapes or permutes, if any, has no other reader either:
otherwise its gradient is the cat plus the other readers', and Inductor writes the cat out
before adding (a second buffer the size of the tensor, where the narrows' backward terms
fuse into one sum; measured on the same models at batch 32: 5-14% more peak memory). The
narrows must not overlap, and nothing between the first and the last of them may switch grad
mode, inference mode or autocast or write to memory (the split runs where the first narrow ran, and its
pieces must be what each narrow returned there).
"""

from __future__ import annotations

import operator
from collections import defaultdict

import torch
import torch.fx as fx

from optimus_eqsat.fxvocab import WHOLE_VIEW_OPS, canonical_name
from optimus_eqsat.fxvocab.global_state import is_switch
from optimus_eqsat.fxvocab.meta import STATE_SWITCHES, node_tensor_infos
from optimus_eqsat.fxvocab.mutation import is_mutating

__all__ = ["narrows_as_splits"]

Narrow = tuple[fx.Node, int, int]  # (the narrow node, start, length)

#: Calls that switch grad mode, inference mode or autocast: a split must not run across one.
_SWITCHES = (*sorted(STATE_SWITCHES), "_enter_inference_mode", "_exit_inference_mode")

#: Views that rearrange a whole tensor: the gradient of what they read is theirs, rearranged
#: (canonical names: ``swapaxes`` and ``swapdims`` read as ``transpose``, ``moveaxis`` as ``movedim``).
_REARRANGING = WHOLE_VIEW_OPS | {"permute", "transpose", "t", "movedim"}


def narrows_as_splits(gm: fx.GraphModule) -> list[str]:
    """Replace each group of two or more ``torch.narrow`` calls on one tensor and dim by one
    ``torch.split`` and its pieces (this module's docstring says why and when). Returns the
    names of the narrows replaced; the replacements carry no meta (propagate it after)."""
    graph = gm.graph
    position = {node: i for i, node in enumerate(graph.nodes)}
    replaced: list[str] = []
    piece_for: dict[fx.Node, fx.Node] = {}  # a narrow replaced -> its piece (the base of later groups)
    for base, size, dim, narrows in _narrow_groups(graph):
        pieces = _pieces(narrows, size) if len(narrows) >= 2 else None
        base = piece_for.get(base, base)
        if pieces is None or not _read_only_by(base, narrows):
            continue
        narrows.sort(key=lambda n: position[n[0]])
        first, last = narrows[0][0], narrows[-1][0]
        if _crosses_state_or_writes(gm, first, last):
            continue
        sizes, piece_of = pieces
        with graph.inserting_before(first):
            split = graph.call_function(torch.split, (base, sizes, dim))
        for node, start, _ in narrows:
            with graph.inserting_before(node):
                piece = graph.call_function(operator.getitem, (split, piece_of[start]))
            node.replace_all_uses_with(piece)
            piece_for[node] = piece
            replaced.append(node.name)
            graph.erase_node(node)
    if replaced:
        gm.recompile()
    return replaced


def _narrow_groups(graph: fx.Graph) -> list[tuple[fx.Node, int, int, list[Narrow]]]:
    """``torch.narrow`` calls with int dim, start and length, by (tensor, dim) in graph order,
    each group as (tensor, its size along dim, dim, narrows); tensors of unknown or symbolic
    size left out."""
    groups: dict[tuple[fx.Node, int, int], list[Narrow]] = defaultdict(list)
    for node in graph.nodes:
        if node.op != "call_function" or canonical_name(node) != "narrow" or node.kwargs:
            continue
        if len(node.args) != 4 or not isinstance(node.args[0], fx.Node):
            continue
        base, dim, start, length = node.args
        if not all(type(v) is int for v in (dim, start, length)):
            continue
        infos = node_tensor_infos(base)
        shape = infos[0].shape if infos and len(infos) == 1 else None
        if shape is None or not -len(shape) <= dim < len(shape) or start < 0:
            continue
        size = shape[dim]
        if size is not None:
            groups[(base, size, dim % len(shape))].append((node, start, length))
    return [(base, size, dim, narrows) for (base, size, dim), narrows in groups.items()]


def _read_only_by(base: fx.Node, narrows: list[Narrow]) -> bool:
    """Whether ``base`` is read by the narrows alone, and so is each tensor it rearranges
    (reshapes, permutes) on the way up to the one computed: their gradient is then the cat
    of the pieces' and nothing else."""
    if len(base.users) != len(narrows):
        return False
    node = base
    while node.op in ("call_function", "call_method") and canonical_name(node) in _REARRANGING:
        parent = node.args[0] if node.args else None
        if not isinstance(parent, fx.Node) or len(parent.users) != 1:
            return False
        node = parent
    return True


def _pieces(narrows: list[Narrow], size: int) -> tuple[list[int], dict[int, int]] | None:
    """The split's sizes over ``[0, size)`` (a filler piece for each gap) and, per narrow's
    start, the index of its piece; None unless the narrows' ranges lie in ``[0, size)`` and
    overlap nowhere (the same range twice is one piece, read twice)."""
    sizes: list[int] = []
    piece_of: dict[int, int] = {}
    end = 0
    for start, length in sorted({(start, length) for _, start, length in narrows}):
        if length <= 0 or start < end or start + length > size:
            return None
        if start > end:
            sizes.append(start - end)
        piece_of[start] = len(sizes)
        sizes.append(length)
        end = start + length
    if end < size:
        sizes.append(size - end)
    return sizes, piece_of


def _crosses_state_or_writes(gm: fx.GraphModule, first: fx.Node, last: fx.Node) -> bool:
    """Whether a node from ``first`` to ``last`` switches grad mode, inference mode or autocast,
    or writes to memory: the split, run at ``first``, would then not return what each narrow returned."""
    node = first
    while True:
        if is_switch(node, *_SWITCHES):
            return True
        if node.op in ("call_function", "call_method", "call_module") and is_mutating(gm, node):
            return True
        if node is last:
            return False
        node = node.next
