"""Kernel kinds: what an FX node becomes under Inductor, the vocabulary the op tables
and the cost model share."""

from __future__ import annotations

import enum


class KernelKind(enum.Enum):
    """What an FX node becomes under Inductor (before fusion).

    VIEW       free: metadata only (slice, reshape/view, permute, getitem,
               squeeze/unsqueeze, expand, alias, detach); launches nothing.
    POINTWISE  elementwise; fuses into one generated kernel with neighbours.
    REDUCTION  sum/mean/amax/softmax/layer_norm/...; a generated kernel that
               pointwise producers and consumers fuse into.
    MATMUL     extern library call (mm/addmm/bmm/baddbmm/linear/matmul/conv):
               one launch each, never fused with generated code.
    CAT        a copy into one buffer, free when fused with a pointwise
               producer/consumer, else one copy kernel.
    GATHER     embedding/index_select/gather: Inductor lowers these to indirect
               loads, so they fuse like pointwise ops.
    OPAQUE     unknown op (or a library fallback such as embedding_bag): one
               launch, never fused.
    NONE       placeholders, outputs, get_attr, scalar (SymInt) arithmetic.
    """

    VIEW = "view"
    POINTWISE = "pointwise"
    REDUCTION = "reduction"
    MATMUL = "matmul"
    CAT = "cat"
    GATHER = "gather"
    OPAQUE = "opaque"
    NONE = "none"
