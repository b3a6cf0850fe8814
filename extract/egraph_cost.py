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
"""

from __future__ import annotations

import math
from typing import Callable

from .cost_model import DeviceProfile, KernelKind, get_profile, kernel_time

VIEW_COST = 1e-9  # seconds; far below any kernel, enough to break ties
FUSED_LAUNCH_SHARE = 0.25
CAT_LAUNCH_SHARE = 0.5
DEFAULT_ITEMSIZE = 4  # dtypes of new terms are not tracked; float32 is the common case

_VIEWS = {"Leaf", "Slice", "Reshape", "Permute", "Expand", "TNil", "TCons"}
_ELEMENTWISE = {"Unary", "Binary", "Scalar"}
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
    ("pointwise", "matmul", ...) of an op key used by Unary/Op1-3 nodes.
    """

    def __init__(self, shapes: dict[int, tuple[int, ...]], op_kind: Callable[[str], str],
                 profile: str | DeviceProfile = "h100"):
        self.shapes = shapes
        self.op_kind = op_kind
        self.profile = get_profile(profile)

    def _bytes(self, classes: tuple[int, ...]) -> float:
        return DEFAULT_ITEMSIZE * sum(_numel(self.shapes.get(c)) for c in classes)

    def __call__(self, c: int, node) -> float:
        ctor = node.ctor
        if ctor in _VIEWS:
            return VIEW_COST if ctor != "Leaf" else 0.0
        moved = self._bytes((c,) + node.children)
        p = self.profile
        if ctor in _ELEMENTWISE:
            full = kernel_time(p, KernelKind.POINTWISE, moved, _numel(self.shapes.get(c)))
            return full - (1 - FUSED_LAUNCH_SHARE) * p.launch_s(KernelKind.POINTWISE)
        if ctor == "Cat":
            out = self._bytes((c,))
            return kernel_time(p, KernelKind.CAT, 2 * out, 0) - (1 - CAT_LAUNCH_SHARE) * p.launch_s(KernelKind.CAT)
        kind = _KIND_OF_OPKIND.get(self.op_kind(node.args[0]), KernelKind.OPAQUE)
        flops = self._matmul_flops(c, node) if kind is KernelKind.MATMUL else _numel(self.shapes.get(c))
        return kernel_time(p, kind, moved, flops)

    def _matmul_flops(self, c: int, node) -> float:
        """2 * M * N * K from the output shape and the first operand's last dim."""
        out = self.shapes.get(c)
        first = self.shapes.get(node.children[0]) if node.children else None
        k = first[-1] if first else 1
        return 2.0 * _numel(out) * k
