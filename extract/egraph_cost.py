"""Adapts the kernel cost model (cost_model.py) to e-nodes of the term language.

An e-node is priced as the kernel it would be on its own: launch overhead plus
roofline time over the bytes it reads and writes. Extraction costs are
additive, but Inductor fuses chains of elementwise ops, so an elementwise
e-node pays only ``FUSED_LAUNCH_SHARE`` of a launch (it usually rides in a
neighbour's kernel) and a cat pays ``CAT_LAUNCH_SHARE`` (it fuses into an
elementwise producer or consumer about as often as not). Views cost
``VIEW_COST``: nothing on the device, but a tie-breaker toward shorter view
chains. The exact fusion model runs afterwards on the rebuilt FX graph
(fx_cost.py), and the optimizer keeps the original if that says it got worse.

A grouped linear (batching's group_linear) is priced as what runs: on GPU
profiles (codegen "triton") the call is one extern launch and each member adds
its roofline time plus host time (the profile's ``grouped_host_s`` per call and
``grouped_host_s_per_member`` per member: the call is host-bound, so it
rarely beats plain linears); on the CPU profile the op runs one
``F.linear`` per member, so each member is a full matmul and the call adds its
own dispatch on top: there it never beats the plain linears. Packing terms
(operand chains, getitem of the call's outputs) cost ``VIEW_COST``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from optimus_eqsat.extract.cost_model import DeviceProfile, KernelKind, get_profile, kernel_costs, kernel_time
from optimus_eqsat.extract.egraph import ENode, ExtractionGraph
from optimus_eqsat.extract.fusion_triton import MAX_POINTWISE_CAT_INPUTS  # a cat of at most 8 inputs fuses
from optimus_eqsat.term import CTORS, Role

VIEW_COST = 1e-9  # seconds; far below any kernel, enough to break ties
FUSED_LAUNCH_SHARE = 0.25
CAT_LAUNCH_SHARE = 0.5
# A list cell (one cat input) on GPU profiles: past 8 inputs Inductor's cat is a
# ConcatKernel that copies every input that is not a whole generated buffer, one
# kernel each, so long lists cost launches by the item. A quarter launch per cell
# beyond the 8th (counted from the list's end: cells of shorter lists are free)
# lets runs folded into one view (rewrites/batching/views.py, the cat-run rules) win. Cells
# holding graph inputs (a stack of parameters) are free: their copies are one
# foreach kernel, paid by the Cat.
CELL_LAUNCH_SHARE = 0.25
DEFAULT_ITEMSIZE = 4  # dtypes of new terms are not tracked; float32 is the common case

_GROUPED = {"grouped_matmul", "grouped_member", "pack"}  # opspec.GROUPED_MATMUL, GROUPED_MEMBER, PACK
_KIND_OF_OPKIND = {
    "pointwise": KernelKind.POINTWISE,
    "reduction": KernelKind.REDUCTION,
    "matmul": KernelKind.MATMUL,
    "gather": KernelKind.GATHER,
    "other": KernelKind.OPAQUE,
}


def _numel(shape: tuple[int, ...] | None) -> int:
    return math.prod(shape) if shape is not None else 1


class EGraphCost:
    """Prices e-nodes: ``cost(class_index, node) -> seconds``.

    ``shapes`` maps e-class -> shape; ``op_kind(key)`` gives the kind
    ("pointwise", "matmul", ...) of an op key used by Unary/Op1-3 nodes;
    ``input_classes`` are the classes of graph inputs and their views
    (``ExportedEGraph.input_classes``), whose list cells cost nothing;
    ``list_lengths`` the fewest members each list class can hold
    (``ExportedEGraph.list_lengths``): cells of lists of at most 8 are free.
    ``constant_classes`` (``ExportedEGraph.constant_classes`` of the parameters, given
    when parameter-only work is done once: frozen or cached inference): a node computing
    one of them from such classes alone costs nothing per step (a view's share, so that
    of two free programs the smaller is kept).
    """

    def __init__(
        self,
        shapes: dict[int, tuple[int, ...]],
        op_kind: Callable[[str], str],
        profile: str | DeviceProfile = "h100",
        input_classes: Collection[int] = frozenset(),
        list_lengths: dict[int, int] | None = None,
        training: bool = False,
        constant_classes: Collection[int] = frozenset(),
    ):
        self.training = training
        self.constant_classes = constant_classes
        self.shapes = shapes
        self.input_classes = input_classes
        self.list_lengths = list_lengths or {}
        self.op_kind = op_kind
        self.profile = get_profile(profile)

    def _bytes(self, classes: tuple[int, ...]) -> float:
        return DEFAULT_ITEMSIZE * sum(_numel(self.shapes.get(c)) for c in classes)

    def __call__(self, c: int, node) -> float:
        if c in self.constant_classes and all(k in self.constant_classes for k in node.children):
            return VIEW_COST
        forward = self._forward(c, node)
        return forward * self._backward_factor(node) if self.training else forward

    def _backward_factor(self, node) -> float:
        """Forward plus backward, as a multiple of the forward (a training step prices both;
        the exact backward model prices the rebuilt programs, pricing.Pricing.backward_costs):
        a matmul's backward is two matmuls (grad input, grad weight); elementwise ops,
        reductions and gathers have one backward kernel each; a cat's backward is views of
        its gradient, and views have none."""
        role = CTORS[node.ctor].role
        if role is Role.ELEMENTWISE:
            return 2.0
        if role is Role.OP:
            return 3.0 if self.op_kind(node.args[0]) == "matmul" else 2.0
        return 1.0

    def _forward(self, c: int, node) -> float:
        role = CTORS[node.ctor].role  # only constructors the rebuilder emits are priced
        if role is Role.LEAF:
            return 0.0
        if role is Role.VIEW:
            return VIEW_COST
        p = self.profile
        if role is Role.CELL:
            return self.cell(node, self.list_lengths.get(c, 0))
        moved = self._bytes((c,) + node.children)
        if role is Role.ELEMENTWISE:
            return self._fused_pointwise(c, moved)
        if role is Role.CAT:
            out = self._bytes((c,))
            return kernel_time(p, KernelKind.CAT, 2 * out, 0) - (1 - CAT_LAUNCH_SHARE) * p.launch_s(KernelKind.CAT)
        opkind = self.op_kind(node.args[0])
        if opkind in _GROUPED:
            return self._grouped(opkind, node)
        kind = _KIND_OF_OPKIND.get(opkind, KernelKind.OPAQUE)
        if kind is KernelKind.POINTWISE:  # pad, shift_segments, ...: fuse like Unary/Binary
            return self._fused_pointwise(c, moved)
        if kind is KernelKind.MATMUL:
            host, device = kernel_costs(p, kind, moved, self._matmul_flops(c, node), self._matmul_shape(c, node))
            return host + device
        time = kernel_time(p, kind, moved, _numel(self.shapes.get(c)))
        if kind is KernelKind.REDUCTION:  # its loop's setup and rows (CPU profiles; 0 elsewhere)
            shape = self.shapes.get(c)
            rows = _numel(shape) // shape[-1] if shape and shape[-1] else 1
            time += p.reduction_s + rows * p.reduction_row_s
        return time

    def cell(self, node, length: int, exact: bool = False) -> float:
        """A list cell (``TCons``) starting a list of ``length`` members (see ``CELL_LAUNCH_SHARE``).

        ``exact``: ``length`` is that of the list as chosen (``reprice_cells``), so the one
        cell starting the 9th member from the end also pays a launch: the list is a
        ConcatKernel (its foreach copy of graph inputs) rather than a pointwise cat that
        its inputs' producers fuse into."""
        p = self.profile
        if p.codegen != "triton":  # a CPU cat is a ConcatKernel: the wrapper names each input's slot
            return VIEW_COST + p.view_s
        concat = p.launch_s(KernelKind.CAT) if exact and length == MAX_POINTWISE_CAT_INPUTS + 1 else 0.0
        if node.children[0] in self.input_classes or length <= MAX_POINTWISE_CAT_INPUTS:
            return VIEW_COST + concat
        return CELL_LAUNCH_SHARE * p.launch_s(KernelKind.CAT) + concat

    def _fused_pointwise(self, c: int, moved: float) -> float:
        """A pointwise op: its traffic, and a share of a launch and its buffer (it usually
        fuses with a neighbour: no kernel of its own, so no least device time either)."""
        p = self.profile
        memory_s = moved / (p.mem_bandwidth_bytes_per_s * p.bandwidth_efficiency)
        compute_s = _numel(self.shapes.get(c)) / p.pointwise_flops_per_s
        return FUSED_LAUNCH_SHARE * (p.launch_s(KernelKind.POINTWISE) + p.alloc_s) + max(memory_s, compute_s)

    def _grouped(self, opkind: str, node) -> float:
        """Terms of a grouped linear (see the module doc)."""
        p = self.profile
        if opkind == "pack":
            return VIEW_COST
        if opkind == "grouped_matmul":
            return p.launch_s(KernelKind.MATMUL) + (p.grouped_host_s if p.codegen == "triton" else 0.0)
        x, w = (self.shapes.get(ch) for ch in node.children[:2])
        rows = _numel(x) // x[-1] if x and x[-1] else 0
        n_out = w[0] if w else 1
        flops = 2.0 * _numel(x) * n_out
        moved = self._bytes(node.children) + DEFAULT_ITEMSIZE * rows * n_out
        time = kernel_time(p, KernelKind.MATMUL, moved, flops)
        if p.codegen == "cpp":
            return time  # the CPU fallback: one F.linear per member
        return time - p.launch_s(KernelKind.MATMUL) + p.grouped_host_s_per_member

    def _matmul_shape(self, c: int, node) -> tuple[int, int, int, int] | None:
        """(batch, M, K, N) from the output shape and the first operand's last dim."""
        out = self.shapes.get(c)
        first = self.shapes.get(node.children[0]) if node.children else None
        if not out or not first or len(out) < 2:
            return None
        batch = math.prod(out[:-2]) if len(first) > 2 else 1
        rows = out[-2] if len(first) > 2 else _numel(out) // out[-1] if out[-1] else 0
        return batch, rows, first[-1], out[-1]

    def _matmul_flops(self, c: int, node) -> float:
        """2 * M * N * K from the output shape and the first operand's last dim."""
        out = self.shapes.get(c)
        first = self.shapes.get(node.children[0]) if node.children else None
        k = first[-1] if first else 1
        return 2.0 * _numel(out) * k


def chosen_list_lengths(classes: Sequence[Sequence[Any]], choice: Mapping[int, int]) -> dict[int, int]:
    """Members of the list each chosen list class holds in the extraction ``choice``
    (``classes``: the exported e-graph's term nodes; chosen lists are TCons chains)."""
    lengths: dict[int, int] = {}
    for start in choice:
        chain, c = [], start
        while c in choice and c not in lengths and classes[c][choice[c]].ctor in ("TCons", "TNil"):
            chain.append(c)
            node = classes[c][choice[c]]
            if node.ctor == "TNil":
                break
            c = node.children[1]
        end = lengths.get(c, 0)  # a TNil, a list walked before, or (not a list) nothing
        for c in reversed(chain):
            if classes[c][choice[c]].ctor == "TNil":
                lengths[c] = end = 0
            else:
                lengths[c] = end = end + 1
    return lengths


def reprice_cells(
    graph: ExtractionGraph, classes: Sequence[Sequence[Any]], choice: Mapping[int, int], cost: EGraphCost
) -> ExtractionGraph | None:
    """``graph`` with every list cell priced by the list it starts as the extraction
    ``choice`` builds it; None when that changes nothing (no chosen list is longer than a
    cat Inductor fuses, or the profile's cats are never fused).

    The first pricing charges a cell by the fewest members its list class can hold, and
    equal lists share a class: a long flattened list (one ConcatKernel copy per input
    past the 8th) and a short one (a few views) are one class, so every cell of the long
    one looks free. Here a cell's list is one member plus its tail as chosen (or, where
    the tail was not chosen, the fewest it can hold): re-extracting prices the lists the
    first extraction picked as long as they are.
    """
    if cost.profile.codegen != "triton":
        return None
    lengths = chosen_list_lengths(classes, choice)
    if max(lengths.values(), default=0) <= MAX_POINTWISE_CAT_INPUTS:
        return None
    repriced = list(graph.classes)
    for c, nodes in enumerate(classes):
        if not any(n.ctor == "TCons" for n in nodes):
            continue
        repriced[c] = [
            ENode(
                e.op,
                e.children,
                cost.cell(n, 1 + lengths.get(tail := n.children[1], cost.list_lengths.get(tail, 0)), exact=True),
            )
            if n.ctor == "TCons"
            else e
            for e, n in zip(graph.classes[c], nodes)
        ]
    return ExtractionGraph(repriced, graph.roots)
