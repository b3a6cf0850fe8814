"""Grouped linear: many linears of different shapes in one kernel launch.

``torch.ops.optimus_eqsat.grouped_linear(xs, ws, bs)`` computes, for every
group ``i``, ``y_i = x_i @ w_i.T + b_i`` -- exactly ``F.linear(x_i, w_i, b_i)``
-- where the shapes ``x_i [..., K_i]``, ``w_i [N_i, K_i]``, ``b_i [N_i]`` may
all differ between groups. It is the shape-heterogeneous counterpart of
Inductor's ``group_linear`` fusion (which needs fbgemm) and is what the
batching rewrites can extract when same-shape batching (bmm) does not apply.

Dispatch (decided per call, at run time, inside the op):

* CUDA tensors and triton importable -> one Triton launch per dtype present
  (normally one), see :mod:`optimus_eqsat.kernels._triton_grouped_linear`;
* CPU tensors -> a loop of ``F.linear``, UNLESS Triton's interpreter is on
  (``TRITON_INTERPRET=1``, set before ``import triton``: triton 3.9 wraps its
  own library functions at import) and the Triton path is asked for with
  ``options.use_triton_on_cpu = True`` or ``OPTIMUS_EQSAT_TRITON_CPU=1``: then
  the real kernel runs on the CPU tensors (slowly; this is how it is tested
  without a GPU). Asked for without a usable interpreter, it warns once and
  falls back;
* anything else (other devices, unsupported or mixed dtypes, triton missing)
  -> the ``F.linear`` loop, so the op is always correct.

Bias convention: the schema is ``Tensor[] bs`` and a bias with zero elements
(shape ``[0]``, e.g. ``x.new_empty(0)``) means "this group has no bias".
``Tensor?[]`` would be accepted by ``custom_op``'s schema inference, but its
autograd support (``torch/_library/autograd.py``, ``supports_tensorlist``) only
flattens lists whose items are all tensors: a list holding a ``None`` is passed
as one opaque leaf, so gradients would silently never reach the biases that do
exist. The empty-tensor marker is unambiguous in effect: a real bias of a group
with ``N_i == 0`` is also empty, and adding it changes nothing. The Python
helper :func:`grouped_linear` accepts ``None`` and does this mapping.

Autograd: ``dx_i = dy_i @ w_i``, ``dw_i = dy_i.T @ x_i``, ``db_i = dy_i.sum(0)``
are all computed by ONE further call of this same op (so one launch on the
Triton path): ``dx_i = linear(dy_i, w_i.T)``, ``dw_i = linear(dy_i.T, x_i.T)``
and ``db_i = linear(dy_i.T, ones[1, M_i])``, where the transposes are strided
views (the kernel takes per-group strides, nothing is copied) and ``ones`` is an
expanded scalar. Only the gradients autograd asks for are computed.

Tracing: a ``register_fake`` implementation gives shapes, so Dynamo, FX and
AOTAutograd trace the op as one node and Inductor keeps it as one extern call.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F

OP_NAME = "optimus_eqsat::grouped_linear"

# Env var that, with TRITON_INTERPRET=1, routes CPU tensors to the Triton kernel.
TRITON_CPU_ENV = "OPTIMUS_EQSAT_TRITON_CPU"


@dataclass
class GroupedLinearOptions:
    """Run-time switches of the grouped linear op (read on every call).

    Attributes:
        use_triton_on_cpu: run the Triton kernel on CPU tensors when Triton's
            interpreter is enabled (``TRITON_INTERPRET=1``). Off by default:
            the interpreter is orders of magnitude slower than ``F.linear``.
    """

    use_triton_on_cpu: bool = False


# A mutable object rather than a bare module global, so that the re-export in
# optimus_eqsat.kernels refers to the same switch (assigning a re-exported
# bool would silently change only a copy).
options = GroupedLinearOptions()


@functools.cache
def _triton_impl():
    """The Triton implementation module, or None when triton cannot be imported."""
    try:
        from optimus_eqsat.kernels import _triton_grouped_linear
    except Exception:  # ImportError, or a broken triton install raising anything else
        return None
    return _triton_grouped_linear


def triton_available() -> bool:
    """True when ``triton`` imports, i.e. the kernel can be launched at all."""
    return _triton_impl() is not None


def _triton_on_cpu_requested() -> bool:
    return options.use_triton_on_cpu or os.environ.get(TRITON_CPU_ENV, "0") == "1"


def triton_path_enabled(device: torch.device | str) -> bool:
    """Whether tensors on ``device`` go to the Triton kernel (dtype permitting)."""
    device = torch.device(device)
    impl = _triton_impl()
    if impl is None:
        return False
    if device.type == "cuda":
        return True
    if device.type == "cpu":
        if not _triton_on_cpu_requested():
            return False
        if impl.interpreter_usable():
            return True
        _warn_interpreter_unusable(impl.interpreter_enabled())
        return False
    return False


@functools.cache
def _warn_interpreter_unusable(interpret_env_on: bool) -> None:
    # Cached: warn once per situation, not on every call of a hot op.
    why = (
        "TRITON_INTERPRET=1 was set after `import triton` (it must be set before)"
        if interpret_env_on
        else "TRITON_INTERPRET=1 is not set"
    )
    warnings.warn(
        f"grouped_linear: the Triton path was requested for CPU tensors but {why}; using the F.linear fallback",
        RuntimeWarning,
        stacklevel=3,
    )


def _bias_or_none(b: torch.Tensor | None) -> torch.Tensor | None:
    """Map the op's "no bias" marker (an empty tensor) to None."""
    return None if b is None or b.numel() == 0 else b


def _check_groups(
    xs: Sequence[torch.Tensor],
    ws: Sequence[torch.Tensor],
    bs: Sequence[torch.Tensor | None],
) -> None:
    """Validate shapes like F.linear would, with the group index in the message."""
    if not (len(xs) == len(ws) == len(bs)):
        raise ValueError(f"grouped_linear: xs, ws, bs must have equal lengths, got {len(xs)}, {len(ws)}, {len(bs)}")
    for i, (x, w, b) in enumerate(zip(xs, ws, bs)):
        if w.dim() != 2:
            raise ValueError(f"grouped_linear: ws[{i}] must be 2-D [N, K], got shape {tuple(w.shape)}")
        if x.dim() < 1 or x.shape[-1] != w.shape[1]:
            raise ValueError(
                f"grouped_linear: xs[{i}] shape {tuple(x.shape)} does not match ws[{i}] shape {tuple(w.shape)}"
            )
        if b is not None and tuple(b.shape) not in ((w.shape[0],), (0,)):
            raise ValueError(
                f"grouped_linear: bs[{i}] must have shape ({w.shape[0]},) or (0,) for no bias, got {tuple(b.shape)}"
            )


def _as_2d(t: torch.Tensor) -> torch.Tensor:
    """``t`` as ``[rows, last]``; explicit rows because ``reshape(-1, 0)`` is ambiguous."""
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def _out_shape(x: torch.Tensor, w: torch.Tensor) -> tuple[int, ...]:
    return (*x.shape[:-1], w.shape[0])


def _fallback(
    xs: Sequence[torch.Tensor],
    ws: Sequence[torch.Tensor],
    bs: Sequence[torch.Tensor | None],
) -> list[torch.Tensor]:
    """One F.linear per group. ``.contiguous()`` keeps strides equal to the fake impl's."""
    return [F.linear(x, w, b).contiguous() for x, w, b in zip(xs, ws, bs)]


def _grouped_linear_impl(
    xs: Sequence[torch.Tensor],
    ws: Sequence[torch.Tensor],
    bs: Sequence[torch.Tensor | None],
) -> list[torch.Tensor]:
    """Dispatch groups to the Triton kernel where possible, else to F.linear."""
    _check_groups(xs, ws, bs)
    bs = [_bias_or_none(b) for b in bs]
    if not xs:
        return []
    device = xs[0].device
    same_device = all(t.device == device for t in (*xs, *ws, *(b for b in bs if b is not None)))
    impl = _triton_impl()
    if not same_device or not triton_path_enabled(device):
        return _fallback(xs, ws, bs)

    # Bucket the groups the kernel handles by dtype (one launch per bucket;
    # a real model has one). Mixed-dtype groups keep F.linear's semantics
    # (including its error) through the fallback.
    out: list[torch.Tensor | None] = [None] * len(xs)
    buckets: dict[torch.dtype, list[int]] = {}
    rest: list[int] = []
    for i, (x, w, b) in enumerate(zip(xs, ws, bs)):
        ok = x.dtype in impl.SUPPORTED_DTYPES and w.dtype == x.dtype and (b is None or b.dtype == x.dtype)
        (buckets.setdefault(x.dtype, []) if ok else rest).append(i)
    for idx in buckets.values():
        # The kernel works on 2-D [M, K] views with any strides; reshape only
        # copies when the leading dims cannot be flattened as a view.
        x2 = [_as_2d(xs[i]) for i in idx]
        b1 = [None if bs[i] is None else cast(torch.Tensor, bs[i]).contiguous() for i in idx]
        ys = impl.grouped_linear_triton(x2, [ws[i] for i in idx], b1)
        for i, y in zip(idx, ys):
            out[i] = y.view(_out_shape(xs[i], ws[i]))
    for i, y in zip(rest, _fallback([xs[i] for i in rest], [ws[i] for i in rest], [bs[i] for i in rest])):
        out[i] = y
    return out  # type: ignore[return-value]


# cudagraph_unsafe: every call builds its pointer table on the host and copies
# it to the device; a captured CUDA graph would replay that copy from a host
# buffer that has since been recycled. Inductor splits graphs around such ops.
_TAGS = tuple(t for t in (getattr(torch.Tag, "cudagraph_unsafe", None),) if t is not None)


@torch.library.custom_op(OP_NAME, mutates_args=(), tags=_TAGS)
def _grouped_linear_op(
    xs: list[torch.Tensor],
    ws: list[torch.Tensor],
    bs: list[torch.Tensor],
) -> list[torch.Tensor]:
    """``[F.linear(x, w, b) for x, w, b in zip(xs, ws, bs)]`` in one launch.

    An empty ``b`` (``numel() == 0``) means no bias; see the module doc.
    """
    return _grouped_linear_impl(xs, ws, bs)


@_grouped_linear_op.register_fake
def _grouped_linear_fake(
    xs: list[torch.Tensor],
    ws: list[torch.Tensor],
    bs: list[torch.Tensor],
) -> list[torch.Tensor]:
    # Shapes and dtype as F.linear; outputs are fresh contiguous tensors, which
    # both real paths guarantee.
    _check_groups(xs, ws, bs)
    return [x.new_empty(_out_shape(x, w)) for x, w in zip(xs, ws)]


def _setup_context(ctx, inputs: tuple, output: list[torch.Tensor]) -> None:
    xs, ws, bs = inputs
    ctx.num_groups = len(xs)
    ctx.need_x = [x.requires_grad for x in xs]
    ctx.need_w = [w.requires_grad for w in ws]
    ctx.need_b = [b.requires_grad and b.numel() > 0 for b in bs]
    ctx.x_shapes = [x.shape for x in xs]
    # Save only what a requested gradient reads: dx needs w, dw needs x (an
    # input batch that needs no grad is then not kept alive for the backward).
    ctx.save_for_backward(
        *(x if nw else None for x, nw in zip(xs, ctx.need_w)),
        *(w if nx else None for w, nx in zip(ws, ctx.need_x)),
    )
    # An empty bias that requires grad (a real bias of an N == 0 group, or a
    # "no bias" marker someone made differentiable) gets an empty gradient,
    # not None: autograd.grad would call None "unused" where F.linear's isn't.
    ctx.empty_b = [b.requires_grad and b.numel() == 0 for b in bs]


def _backward(ctx, grads: list[torch.Tensor | None]):
    """All requested dx, dw, db through one further grouped_linear call."""
    G = ctx.num_groups
    saved = ctx.saved_tensors
    xs, ws = saved[:G], saved[G:]
    need_x, need_w, need_b = ctx.need_x, ctx.need_w, ctx.need_b

    dxs: list[torch.Tensor | None] = [None] * G
    dws: list[torch.Tensor | None] = [None] * G
    dbs: list[torch.Tensor | None] = [None] * G
    # jobs[j] = (kind, group); gradient j is linear(lhs[j], rhs[j]).
    jobs: list[tuple[str, int]] = []
    lhs: list[torch.Tensor] = []
    rhs: list[torch.Tensor] = []
    for i in range(G):
        dy = grads[i]
        if dy is None:  # output unused: its gradient contributions are zero
            continue
        x, w = xs[i], ws[i]
        dy2 = _as_2d(dy)  # [M, N]
        if need_x[i]:
            jobs.append(("x", i))
            lhs.append(dy2)
            rhs.append(w.t())  # [K, N] view
        if need_w[i]:
            jobs.append(("w", i))
            lhs.append(dy2.t())  # [N, M] view
            rhs.append(_as_2d(x).t())  # [K, M] view
        if ctx.empty_b[i]:
            dbs[i] = dy.new_zeros(0)
        elif need_b[i]:
            jobs.append(("b", i))
            lhs.append(dy2.t())
            # [1, M] of ones without allocating M elements (stride 0).
            rhs.append(dy2.new_ones(()).expand(1, dy2.shape[0]))

    if jobs:
        no_bias = [t.new_empty(0) for t in lhs]
        outs = torch.ops.optimus_eqsat.grouped_linear(lhs, rhs, no_bias)
        for (kind, i), out in zip(jobs, outs):
            if kind == "x":
                dxs[i] = out.view(ctx.x_shapes[i])
            elif kind == "w":
                dws[i] = out
            else:
                dbs[i] = out.view(-1)
    return dxs, dws, dbs


_grouped_linear_op.register_autograd(_backward, setup_context=_setup_context)


def grouped_linear(
    xs: Sequence[torch.Tensor],
    ws: Sequence[torch.Tensor],
    bs: Sequence[torch.Tensor | None] | None = None,
) -> list[torch.Tensor]:
    """Compute ``[F.linear(x_i, w_i, b_i) for each group i]`` with one launch.

    Args:
        xs: inputs ``[..., K_i]`` (any leading dims, any strides).
        ws: weights ``[N_i, K_i]``.
        bs: biases ``[N_i]`` or ``None`` per group (an empty tensor also means
            no bias); ``bs=None`` for "no bias anywhere".

    Returns:
        Contiguous outputs ``[..., N_i]``, one per group, differentiable in all inputs.
    """
    xs, ws = list(xs), list(ws)
    bs = [None] * len(xs) if bs is None else list(bs)
    if len(bs) != len(xs):
        raise ValueError(f"grouped_linear: got {len(xs)} inputs but {len(bs)} biases")
    # The op's schema has no None in tensor lists (see module doc): mark "no bias"
    # with an empty tensor of the group's dtype/device.
    b_marked = [x.new_empty(0) if b is None else b for x, b in zip(xs, bs)]
    return torch.ops.optimus_eqsat.grouped_linear(xs, ws, b_marked)
