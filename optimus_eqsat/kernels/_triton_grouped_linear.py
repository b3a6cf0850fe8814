"""Triton implementation of the grouped linear (one launch for many linears).

This module imports ``triton`` at the top and must only be imported when
triton is available; :mod:`optimus_eqsat.kernels.grouped_linear` guards that.

Layout of the launch (after the Triton "grouped GEMM" tutorial, but with a
non-persistent grid):

* the host computes, per group ``g``, the number of output tiles
  ``cdiv(M_g, BLOCK_M) * cdiv(N_g, BLOCK_N)`` and their exclusive prefix sum
  ``tile_start[0..G]``;
* the grid is ``tile_start[G]`` programs; program ``pid`` finds its group by a
  binary search over ``tile_start`` (``LOG_G`` scalar loads, all from one small
  cached table) and computes one ``BLOCK_M x BLOCK_N`` tile of ``y_g``;
* everything per group (tensor addresses, sizes, strides) lives in ONE packed
  int64 table, so a launch costs one host->device copy plus the kernel.

Addresses are raw ``data_ptr()`` values cast back to typed pointers inside the
kernel with ``.to(tl.pointer_type(DTYPE))``. Under ``TRITON_INTERPRET=1`` the
same code runs on CPU tensors (the interpreter dereferences host addresses).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

# Rows of the packed per-group table (each row has G int64 entries), followed
# by the G + 1 tile prefix sums. The kernel addresses rows by these numbers
# written as literals (``table_ptr + 4 * G + g`` is row _ROW_M): keep in sync.
_ROW_X, _ROW_W, _ROW_B, _ROW_Y = 0, 1, 2, 3
_ROW_M, _ROW_N, _ROW_K = 4, 5, 6
_ROW_SXM, _ROW_SXK, _ROW_SWN, _ROW_SWK = 7, 8, 9, 10
_NUM_ROWS = 11

_TORCH_TO_TL = {
    torch.float32: tl.float32,
    torch.float16: tl.float16,
    torch.bfloat16: tl.bfloat16,
}
SUPPORTED_DTYPES = frozenset(_TORCH_TO_TL)


def _grouped_linear_kernel(
    table_ptr,  # int64 [11 * G + G + 1], layout above
    G,  # number of groups
    DTYPE: tl.constexpr,  # element type of x, w, b, y (one per launch)
    LOG_G: tl.constexpr,  # binary-search steps: ceil(log2(G)), >= 0
    HAS_ANY_BIAS: tl.constexpr,  # skip the bias branch entirely when no group has one
    INPUT_PRECISION: tl.constexpr,  # "ieee"/"tf32" for fp32, None (default) otherwise
    UPCAST_OPERANDS: tl.constexpr,  # cast x/w tiles to fp32 before tl.dot (interpreter + bf16)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    starts = table_ptr + 11 * G

    # Largest g with tile_start[g] <= pid. Invariant: start[lo] <= pid < start[hi];
    # groups with zero tiles have start[g] == start[g + 1] and are skipped.
    lo = pid * 0  # int64 scalar 0
    hi = lo + G
    for _ in tl.static_range(LOG_G):
        mid = (lo + hi) // 2
        pred = tl.load(starts + mid) <= pid
        lo = tl.where(pred, mid, lo)
        hi = tl.where(pred, hi, mid)
    g = lo
    local = pid - tl.load(starts + g)

    M = tl.load(table_ptr + 4 * G + g)
    N = tl.load(table_ptr + 5 * G + g)
    K = tl.load(table_ptr + 6 * G + g)
    sxm = tl.load(table_ptr + 7 * G + g)
    sxk = tl.load(table_ptr + 8 * G + g)
    swn = tl.load(table_ptr + 9 * G + g)
    swk = tl.load(table_ptr + 10 * G + g)
    x_ptr = tl.load(table_ptr + 0 * G + g).to(tl.pointer_type(DTYPE))
    w_ptr = tl.load(table_ptr + 1 * G + g).to(tl.pointer_type(DTYPE))
    y_ptr = tl.load(table_ptr + 3 * G + g).to(tl.pointer_type(DTYPE))

    num_n_tiles = tl.cdiv(N, BLOCK_N)
    tile_m = local // num_n_tiles
    tile_n = local % num_n_tiles

    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N

    # x tile [BLOCK_M, BLOCK_K]; w tile loaded transposed as [BLOCK_K, BLOCK_N]
    # so that acc += x @ w.T is a plain tl.dot. Strides are per group, so
    # transposed views (used by the backward) need no copy.
    x_ptrs = x_ptr + offs_m[:, None] * sxm + offs_k[None, :] * sxk
    w_ptrs = w_ptr + offs_k[:, None] * swk + offs_n[None, :] * swn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k0 * BLOCK_K
        a = tl.load(x_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(w_ptrs, mask=(offs_k[:, None] < k_left) & mask_n[None, :], other=0.0)
        if UPCAST_OPERANDS:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        x_ptrs += BLOCK_K * sxk
        w_ptrs += BLOCK_K * swk

    if HAS_ANY_BIAS:
        b_addr = tl.load(table_ptr + 2 * G + g)
        if b_addr != 0:  # 0 encodes "this group has no bias"
            bias = tl.load(b_addr.to(tl.pointer_type(DTYPE)) + offs_n, mask=mask_n, other=0.0)
            acc += bias.to(tl.float32)[None, :]

    # Outputs are always freshly allocated and contiguous: row stride is N.
    y_ptrs = y_ptr + offs_m[:, None] * N + offs_n[None, :]
    tl.store(y_ptrs, acc.to(DTYPE), mask=mask_m[:, None] & mask_n[None, :])


# triton.jit decides at decoration time whether it builds a compiled
# JITFunction or an interpreter function (it reads TRITON_INTERPRET then), so
# the kernel is wrapped lazily, once per mode: importing this module never
# fixes the mode (see interpreter_usable for why the env var must still be set
# before `import triton`).
_JIT_CACHE: dict[bool, object] = {}

# Number of kernel launches so far; tests use it to prove the Triton path ran.
stats: dict[str, int] = {"launches": 0}


def interpreter_enabled() -> bool:
    """True when Triton would run kernels in its CPU interpreter now."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:  # triton >= 3.4: the knob reads the env var on each access
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpreter_usable() -> bool:
    """True when kernels can run in the interpreter in this process.

    Besides TRITON_INTERPRET=1 now, the interpreter needs it to have been set
    when ``triton`` was imported: triton's own ``@triton.jit`` library functions
    (``tl.zeros``, ``tl.cdiv``, ...) are wrapped at import, and compiled
    JITFunction versions raise "Cannot call @triton.jit'd outside of the scope
    of a kernel" when an interpreted kernel calls them.
    """
    if not interpreter_enabled():
        return False
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return False
    return isinstance(getattr(tl, "zeros", None), InterpretedFunction)


def _kernel(mode: bool):
    """The jitted kernel for interpreter mode ``mode`` (built on first use).

    (Lazy wrapping alone does not make a late TRITON_INTERPRET=1 work, see
    :func:`interpreter_usable`, but it keeps this module's import free of the
    mode and lets a process use both modes where triton allows it.)
    """
    fn = _JIT_CACHE.get(mode)
    if fn is None:
        fn = triton.jit(_grouped_linear_kernel)
        _JIT_CACHE[mode] = fn
    return fn


def _pow2_clamp(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, triton.next_power_of_2(max(1, n))))


def _block_sizes(max_m: int, max_n: int, max_k: int, elem_size: int) -> tuple[int, int, int, int]:
    """Pick (BLOCK_M, BLOCK_N, BLOCK_K, num_warps) from the largest problem.

    A heuristic, not an autotuner: recommendation linears are small, so tiles
    shrink to the problem (>= 16, tl.dot's minimum) to avoid wasted lanes, and
    are capped where register pressure would start to bite.
    """
    bm = _pow2_clamp(max_m, 16, 64)
    bn = _pow2_clamp(max_n, 16, 128)
    bk = _pow2_clamp(max_k, 16, 64 if elem_size <= 2 else 32)
    warps = 4 if bm * bn >= 64 * 64 else 2
    return bm, bn, bk, warps


def grouped_linear_triton(
    xs: Sequence[torch.Tensor],
    ws: Sequence[torch.Tensor],
    bs: Sequence[torch.Tensor | None],
) -> list[torch.Tensor]:
    """Compute ``[x @ w.T + b]`` for 2-D ``x``/``w`` with one kernel launch.

    Preconditions (checked by the caller): all tensors on one device with one
    dtype in :data:`SUPPORTED_DTYPES`, ``x_i`` is ``[M_i, K_i]``, ``w_i`` is
    ``[N_i, K_i]``, ``b_i`` is a contiguous ``[N_i]`` or ``None``. ``x`` and
    ``w`` may have arbitrary strides. Returns contiguous ``[M_i, N_i]``.
    """
    G = len(xs)
    dtype = xs[0].dtype
    device = xs[0].device
    ys = [torch.empty((x.shape[0], w.shape[0]), dtype=dtype, device=device) for x, w in zip(xs, ws)]
    if G == 0:
        return ys
    max_m = max(x.shape[0] for x in xs)
    max_n = max(w.shape[0] for w in ws)
    max_k = max(x.shape[1] for x in xs)
    bm, bn, bk, warps = _block_sizes(max_m, max_n, max_k, xs[0].element_size())

    rows: list[list[int]] = [[0] * G for _ in range(_NUM_ROWS)]
    starts = [0] * (G + 1)
    for g, (x, w, b, y) in enumerate(zip(xs, ws, bs, ys)):
        m, k = x.shape
        n = w.shape[0]
        rows[_ROW_X][g] = x.data_ptr()
        rows[_ROW_W][g] = w.data_ptr()
        rows[_ROW_B][g] = 0 if b is None else b.data_ptr()
        rows[_ROW_Y][g] = y.data_ptr()
        rows[_ROW_M][g], rows[_ROW_N][g], rows[_ROW_K][g] = m, n, k
        rows[_ROW_SXM][g], rows[_ROW_SXK][g] = x.stride()
        rows[_ROW_SWN][g], rows[_ROW_SWK][g] = w.stride()
        starts[g + 1] = starts[g] + triton.cdiv(m, bm) * triton.cdiv(n, bn)
    total_tiles = starts[G]
    if total_tiles == 0:  # every group has M == 0 or N == 0: nothing to write
        return ys

    flat = [v for row in rows for v in row] + starts
    # One packed host->device copy for all per-group metadata. Not through pinned
    # memory: pinning a fresh buffer on every call cost about half a millisecond on
    # an H200 (benchmarks/gpu_check.py), far more than this small synchronous copy.
    table = torch.tensor(flat, dtype=torch.int64, device=device)

    allow_tf32 = dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 and device.type == "cuda"
    interpret = interpreter_enabled()
    # The interpreter keeps bf16 as raw uint16 and its tl.dot multiplies the bit
    # patterns (triton-lang/triton#11584, "not supported yet"); upcasting the
    # tiles is exact (bf16 products fit fp32), so only the interpreter does it.
    upcast = interpret and dtype == torch.bfloat16
    log_g = (G - 1).bit_length()  # ceil(log2(G)); 0 when G == 1
    kernel = _kernel(interpret)
    # Triton launches on the current CUDA device; make it the tensors' device.
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        kernel[(total_tiles,)](
            table,
            G,
            DTYPE=_TORCH_TO_TL[dtype],
            LOG_G=log_g,
            HAS_ANY_BIAS=any(b is not None for b in bs),
            # F.linear in fp32 uses TF32 only if torch allows it; match that.
            INPUT_PRECISION=("tf32" if allow_tf32 else "ieee") if dtype == torch.float32 else None,
            UPCAST_OPERANDS=upcast,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            num_warps=warps,
        )
    stats["launches"] += 1
    return ys
