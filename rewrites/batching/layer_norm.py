"""Layer norms of equal shapes -> one layer_norm without affine over the stack, then the
stacked scale and shift (Inductor's batch_layernorm, 24)."""

from __future__ import annotations

import inspect
from typing import Any, cast

import torch
import torch.nn.functional as F

from optimus_eqsat.opspec import POINTWISE, REDUCTION, OpSpec, Slot
from optimus_eqsat.rewrites.batching.builder import BatchBuilder
from optimus_eqsat.rewrites.batching.candidates import Candidate, shapes_known
from optimus_eqsat.rewrites.batching.kinds import BatchKind, register
from optimus_eqsat.term import Binary, Op1
from optimus_eqsat.translate import Translation


def layer_norm_args(spec: OpSpec) -> dict[str, Any] | None:
    """The bound arguments of an ``F.layer_norm`` op key, or None for any other op."""
    if spec.target is not F.layer_norm:
        return None
    try:
        bound = inspect.signature(F.layer_norm).bind(*spec.args, **dict(spec.kwargs))
    except TypeError:
        return None
    bound.apply_defaults()
    return dict(bound.arguments)


@register
class LayerNorm(BatchKind):
    name = "layer_norm"

    def key(self, t: Translation, c: Candidate) -> tuple | None:
        spec = t.registry.specs.get(c.key)
        if not shapes_known(t, c) or spec is None or layer_norm_args(spec) is None:
            return None
        dtype = t.dtypes.get(c.node)
        if dtype is None or any(t.dtypes.get(o) != dtype for o in c.operands):
            # a float32 scale of a bf16 input (autocast's mixed precision): F.layer_norm gives
            # bf16, the separate multiply by the stacked scale would promote to float32
            return None
        return ("layer_norm", c.key, tuple(t.shapes[o] for o in c.operands), dtype)

    def build(self, b: BatchBuilder, group: list[Candidate]) -> bool:
        t, c0 = b.t, group[0]
        args = cast(dict[str, Any], layer_norm_args(t.registry.specs[c0.key]))  # key() saw a layer_norm
        plain = t.registry.register(
            OpSpec(
                "call_function",
                F.layer_norm,
                (Slot(0), tuple(args["normalized_shape"]), None, None, args["eps"]),
                (),
                REDUCTION,
            )
        )
        rank = len(t.shapes[c0.node])
        stacked_x, out = b.stack([c.operands[0] for c in group], rank)
        y = b.new(Op1(plain, stacked_x), out)
        named = {"mul": torch.mul, "add": torch.add}
        for slot, op in ((args["weight"], "mul"), (args["bias"], "add")):
            if isinstance(slot, Slot):
                key = t.registry.add_named(op, OpSpec("call_function", named[op], (Slot(0), Slot(1)), (), POINTWISE))
                stacked, _ = b.stack([c.operands[slot.index] for c in group], rank)
                y = b.new(Binary(key, y, stacked), out)
        b.unstack(y, [c.node for c in group])
        return True
