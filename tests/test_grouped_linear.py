"""Tests of the grouped linear op (optimus_eqsat::grouped_linear).

The Triton kernel runs here on CPU tensors through Triton's interpreter. In
triton 3.9 ``TRITON_INTERPRET`` is read whenever ``@triton.jit`` wraps a
function and during launches (``triton.knobs`` reads the environment on every
access), so it must be set BEFORE ``import triton``: triton's own jit library
functions (``tl.zeros``, ``tl.cdiv``) are wrapped at import, and an interpreted
kernel cannot call compiled ones. Setting it later in this process (e.g. with
monkeypatch) would not work and would leak into other tests that use triton.

So the kernel tests (``test_triton_*``) only run in a process started with the
interpreter on: ``test_triton_suite_in_subprocess`` re-runs this file's
``test_triton_*`` tests in a child pytest with ``TRITON_INTERPRET=1``; in the
parent they skip. Running the file directly with ``TRITON_INTERPRET=1`` runs
them in-process instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from optimus_eqsat.kernels import (
    TRITON_CPU_ENV,
    grouped_linear,
    options,
    triton_available,
    triton_path_enabled,
)

REPO = Path(__file__).resolve().parent.parent


def _interpreter_usable() -> bool:
    if not triton_available():
        return False
    from optimus_eqsat.kernels import _triton_grouped_linear

    return _triton_grouped_linear.interpreter_usable()


# Evaluated at collection: in the child pytest the interpreter is on from the start.
INTERPRETER = _interpreter_usable()
needs_interpreter = pytest.mark.skipif(
    not INTERPRETER,
    reason="needs TRITON_INTERPRET=1 before triton is imported; run by test_triton_suite_in_subprocess",
)

# (M, K, N, has_bias) per group. Chosen to hit masking on every edge: M and N
# not multiples of any block, odd K, K > BLOCK_K (several K steps), size-1 dims.
SHAPE_SETS = {
    "ragged": [(5, 7, 3, True), (33, 17, 65, False), (1, 1, 1, True), (64, 16, 32, True)],
    "odd_k": [(3, 9, 5, False), (19, 67, 2, True), (2, 131, 7, True)],
    "single": [(17, 33, 18, True)],
    "no_bias": [(4, 5, 6, False), (7, 3, 2, False)],
}


def _kernel_stats() -> dict[str, int]:
    from optimus_eqsat.kernels import _triton_grouped_linear

    return _triton_grouped_linear.stats


def _make_groups(
    shapes: list[tuple[int, int, int, bool]],
    dtype: torch.dtype = torch.float32,
    requires_grad: bool = False,
    seed: int = 0,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor | None]]:
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype).requires_grad_(requires_grad)

    xs = [rand(m, k) for m, k, _, _ in shapes]
    ws = [rand(n, k) for _, k, n, _ in shapes]
    bs = [rand(n) if has_b else None for _, _, n, has_b in shapes]
    return xs, ws, bs


def _reference(xs, ws, bs) -> list[torch.Tensor]:
    return [F.linear(x, w, b) for x, w, b in zip(xs, ws, bs)]


@pytest.fixture
def triton_cpu(monkeypatch: pytest.MonkeyPatch):
    """Route CPU tensors to the Triton kernel for one test; yields the launch counter."""
    monkeypatch.setattr(options, "use_triton_on_cpu", True)
    assert triton_path_enabled("cpu")
    yield _kernel_stats()


# --------------------------------------------------------------------------
# Fallback path (CPU default)


def test_cpu_default_is_fallback_and_matches_linear() -> None:
    assert not options.use_triton_on_cpu
    if os.environ.get(TRITON_CPU_ENV) != "1":
        assert not triton_path_enabled("cpu")
    xs, ws, bs = _make_groups(SHAPE_SETS["ragged"])
    # N-D inputs keep their leading dims, like F.linear.
    xs.append(torch.randn(2, 3, 4))
    ws.append(torch.randn(6, 4))
    bs.append(torch.randn(6))
    for y, r in zip(grouped_linear(xs, ws, bs), _reference(xs, ws, bs)):
        assert y.shape == r.shape and y.is_contiguous()
        torch.testing.assert_close(y, r)
    assert grouped_linear([], [], []) == []


def test_fallback_gradcheck_and_gradgradcheck_float64() -> None:
    xs, ws, bs = _make_groups([(3, 4, 2, True), (2, 3, 5, False)], dtype=torch.float64, requires_grad=True)

    def fn(x0, x1, w0, w1, b0):
        return tuple(grouped_linear([x0, x1], [w0, w1], [b0, None]))

    args = (xs[0], xs[1], ws[0], ws[1], bs[0])
    assert torch.autograd.gradcheck(fn, args)
    # The backward is itself a grouped_linear call, so double backward works too.
    assert torch.autograd.gradgradcheck(fn, args)


def test_opcheck() -> None:
    # Schema, fake impl, autograd registration and AOT dispatch, all at once.
    xs, ws, bs = _make_groups(SHAPE_SETS["ragged"][:2], requires_grad=True)
    b_marked = [x.new_empty(0) if b is None else b for x, b in zip(xs, bs)]
    torch.library.opcheck(torch.ops.optimus_eqsat.grouped_linear.default, (xs, ws, b_marked))


def test_validation_errors() -> None:
    x, w = torch.randn(2, 3), torch.randn(4, 3)
    with pytest.raises(ValueError, match="does not match"):
        grouped_linear([x], [torch.randn(4, 5)])
    with pytest.raises(ValueError, match="bs\\[0\\]"):
        grouped_linear([x], [w], [torch.randn(5)])
    with pytest.raises(ValueError):
        grouped_linear([x, x], [w], None)


# --------------------------------------------------------------------------
# Triton kernel (interpreter on CPU)


@needs_interpreter
@pytest.mark.parametrize("name", sorted(SHAPE_SETS))
def test_triton_matches_linear(triton_cpu: dict[str, int], name: str) -> None:
    xs, ws, bs = _make_groups(SHAPE_SETS[name])
    before = triton_cpu["launches"]
    ys = grouped_linear(xs, ws, bs)
    assert triton_cpu["launches"] == before + 1  # the whole group in one launch
    for y, r in zip(ys, _reference(xs, ws, bs)):
        assert y.shape == r.shape and y.is_contiguous()
        torch.testing.assert_close(y, r, rtol=1e-5, atol=1e-5)


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_half_precision(triton_cpu: dict[str, int], dtype: torch.dtype) -> None:
    xs, ws, bs = _make_groups(SHAPE_SETS["ragged"], dtype=dtype)
    ys = grouped_linear(xs, ws, bs)
    for y, x, w, b in zip(ys, xs, ws, bs):
        assert y.dtype == dtype
        # Kernel accumulates in fp32 and rounds once: compare to the fp32 result
        # with one rounding step of tolerance.
        r = F.linear(x.float(), w.float(), None if b is None else b.float())
        tol = 1e-2 if dtype == torch.float16 else 8e-3
        torch.testing.assert_close(y.float(), r, rtol=tol, atol=tol * r.abs().max().item())


@needs_interpreter
def test_triton_strided_empty_and_nd_inputs(triton_cpu: dict[str, int]) -> None:
    xs = [
        torch.randn(9, 6).t(),  # [6, 9] transposed view: kernel uses strides, no copy
        torch.randn(0, 4),  # M == 0: no tiles
        torch.randn(3, 0),  # K == 0: output is the bias
        torch.randn(4, 5),  # N == 0
        torch.randn(2, 3, 5),  # N-D input
        torch.randn(5, 8)[:, ::2],  # column stride 2
    ]
    ws = [
        torch.randn(9, 7).t(),
        torch.randn(3, 4),
        torch.randn(2, 0),
        torch.randn(0, 5),
        torch.randn(4, 5),
        torch.randn(3, 4),
    ]
    bs = [torch.randn(7), torch.randn(3), torch.randn(2), None, None, torch.randn(3)]
    before = triton_cpu["launches"]
    ys = grouped_linear(xs, ws, bs)
    assert triton_cpu["launches"] == before + 1
    for y, r in zip(ys, _reference(xs, ws, bs)):
        assert y.shape == r.shape
        torch.testing.assert_close(y, r, rtol=1e-5, atol=1e-5)


@needs_interpreter
def test_triton_mixed_dtypes_bucketed(triton_cpu: dict[str, int]) -> None:
    # One launch per supported dtype; float64 (unsupported by the kernel) falls back.
    xs = [torch.randn(3, 4), torch.randn(5, 6).half(), torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 2)]
    ws = [torch.randn(2, 4), torch.randn(3, 6).half(), torch.randn(4, 3, dtype=torch.float64), torch.randn(5, 2)]
    bs = [None, torch.randn(3).half(), torch.randn(4, dtype=torch.float64), torch.randn(5)]
    before = triton_cpu["launches"]
    ys = grouped_linear(xs, ws, bs)
    assert triton_cpu["launches"] == before + 2
    for y, r in zip(ys, _reference(xs, ws, bs)):
        assert y.dtype == r.dtype
        torch.testing.assert_close(y, r, rtol=2e-3, atol=2e-3)


@needs_interpreter
def test_triton_gradients_match_autograd_of_fallback(triton_cpu: dict[str, int]) -> None:
    # Includes K == 0 and N == 0 groups (empty gradients must not crash).
    shapes = [(5, 7, 3, True), (33, 17, 20, False), (2, 3, 4, True), (2, 0, 3, True), (3, 4, 0, True)]
    xs, ws, bs = _make_groups(shapes, requires_grad=True)
    xs[0] = xs[0].detach()  # an input without grad: its dx must not be computed
    cotangents = [torch.randn(m, n) for m, _, n, _ in shapes]

    def run(fn) -> list[torch.Tensor | None]:
        ys = fn(xs, ws, bs)
        leaves = [t for t in (*xs, *ws, *bs) if t is not None and t.requires_grad]
        grads = torch.autograd.grad(sum((y * c).sum() for y, c in zip(ys, cotangents)), leaves)
        return list(grads)

    before = triton_cpu["launches"]
    got = run(grouped_linear)
    # Forward: one launch; backward: ONE launch for every dx, dw and db.
    assert triton_cpu["launches"] == before + 2
    for g, r in zip(got, run(_reference)):
        assert g.shape == r.shape
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-4)


@needs_interpreter
def test_triton_env_var_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """OPTIMUS_EQSAT_TRITON_CPU=1 alone (no option) selects the kernel."""
    monkeypatch.setattr(options, "use_triton_on_cpu", False)
    monkeypatch.setenv(TRITON_CPU_ENV, "1")
    stats = _kernel_stats()
    before = stats["launches"]
    x, w = torch.randn(3, 5), torch.randn(4, 5)
    torch.testing.assert_close(grouped_linear([x], [w])[0], F.linear(x, w))
    assert stats["launches"] == before + 1
    monkeypatch.setenv(TRITON_CPU_ENV, "0")
    grouped_linear([x], [w])
    assert stats["launches"] == before + 1


def _child_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
@pytest.mark.skipif(INTERPRETER, reason="the test_triton_* tests already run in this process")
def test_triton_suite_in_subprocess() -> None:
    """Run this file's test_triton_* tests with the interpreter on from the start."""
    cmd = [
        sys.executable, "-m", "pytest", str(Path(__file__).resolve()), "-q",
        "-p", "no:cacheprovider", "-k", "test_triton_ and not in_subprocess",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=REPO, env=_child_env(TRITON_INTERPRET="1"), capture_output=True, text=True, timeout=300
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "passed" in out and "skipped" not in out and "failed" not in out, out[-3000:]


def test_late_interpreter_env_warns_and_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Asking for the kernel on CPU without a usable interpreter must not crash."""
    if INTERPRETER:
        pytest.skip("the interpreter is usable in this process")
    from optimus_eqsat.kernels.grouped_linear import _warn_interpreter_unusable

    _warn_interpreter_unusable.cache_clear()
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # too late: triton is already imported
    monkeypatch.setattr(options, "use_triton_on_cpu", True)
    x, w = torch.randn(3, 5), torch.randn(4, 5)
    with pytest.warns(RuntimeWarning, match="fallback"):
        y = grouped_linear([x], [w])
    torch.testing.assert_close(y[0], F.linear(x, w))


def test_subprocess_without_triton() -> None:
    """With `import triton` failing, the package imports and the op falls back."""
    script = textwrap.dedent(
        """
        import os, sys
        sys.modules["triton"] = None  # makes `import triton` raise ImportError
        import torch, torch.nn.functional as F
        from optimus_eqsat.kernels import grouped_linear, triton_available, triton_path_enabled
        assert not triton_available() and not triton_path_enabled("cpu")
        x = torch.randn(3, 5, requires_grad=True); w = torch.randn(4, 5)
        (y,) = grouped_linear([x], [w])
        torch.testing.assert_close(y, F.linear(x, w))
        y.sum().backward()
        print("OK")
        """
    )
    # Even with the Triton path requested, a missing triton means the fallback.
    env = _child_env(TRITON_INTERPRET="1", OPTIMUS_EQSAT_TRITON_CPU="1")
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


# --------------------------------------------------------------------------
# Tracing: FX, Dynamo (eager backend), Inductor


class _Towers(nn.Module):
    """Three differently shaped linears, one without bias, fused into one call."""

    def __init__(self) -> None:
        super().__init__()
        self.towers = nn.ModuleList([nn.Linear(7, 3), nn.Linear(5, 9, bias=False), nn.Linear(4, 2)])

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        ys = grouped_linear([a, b, c], [t.weight for t in self.towers], [t.bias for t in self.towers])
        return ys[0].sum() + 2 * ys[1].sum() + ys[2].relu().sum()


def _towers_inputs() -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(1)
    return (torch.randn(4, 7, generator=gen), torch.randn(6, 5, generator=gen), torch.randn(2, 3, 4, generator=gen))


def test_fx_symbolic_trace() -> None:
    model, args = _Towers(), _towers_inputs()
    gm = torch.fx.symbolic_trace(model)
    calls = [n for n in gm.graph.nodes if n.target is torch.ops.optimus_eqsat.grouped_linear]
    assert len(calls) == 1
    torch.testing.assert_close(gm(*args), model(*args))


def test_compile_eager_backend_fullgraph() -> None:
    torch._dynamo.reset()
    model, args = _Towers(), _towers_inputs()
    out = torch.compile(model, backend="eager", fullgraph=True)(*args)
    torch.testing.assert_close(out, model(*args))


def test_compile_inductor_single_extern_call_fwd_and_bwd() -> None:
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    model, args = _Towers(), _towers_inputs()
    ref_model = _Towers()
    ref_model.load_state_dict(model.state_dict())
    compiled = torch.compile(model, fullgraph=True)

    def step() -> torch.Tensor:
        out = compiled(*args)
        out.backward()
        return out

    out, codes = run_and_get_code(step)
    ref = ref_model(*args)
    ref.backward()
    torch.testing.assert_close(out, ref)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5)

    calls = [c.count("torch.ops.optimus_eqsat.grouped_linear.default(") for c in codes]
    # Forward graph and backward graph each hold exactly one extern call and no
    # per-linear matmuls.
    assert sorted(calls) == [1, 1], calls
    assert not any("extern_kernels.addmm" in c or "extern_kernels.mm" in c for c in codes)


@needs_interpreter
def test_triton_kernel_under_aot_autograd(triton_cpu: dict[str, int]) -> None:
    """Compiled forward and backward graphs call the real kernel: 1 launch each."""
    torch._dynamo.reset()
    model, args = _Towers(), _towers_inputs()
    ref_model = _Towers()
    ref_model.load_state_dict(model.state_dict())
    before = triton_cpu["launches"]
    out = torch.compile(model, backend="aot_eager", fullgraph=True)(*args)
    out.backward()
    assert triton_cpu["launches"] == before + 2
    ref = ref_model(*args)
    ref.backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------
# The compiled (GPU) kernel, checked without a GPU


def _ptxas_available() -> bool:
    if not triton_available():
        return False
    import triton

    return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")  # triton 3.9 deprecation notice
@pytest.mark.skipif(not _ptxas_available(), reason="triton's CUDA backend (ptxas) is not installed")
@pytest.mark.skipif(INTERPRETER, reason="TRITON_INTERPRET=1 makes triton.jit build interpreter functions")
@pytest.mark.parametrize(
    "arch, dtype_name, precision, log_g, has_bias",
    [(90, "float32", "ieee", 3, True), (80, "bfloat16", None, 0, False)],
)
def test_kernel_compiles_to_cubin(
    arch: int, dtype_name: str, precision: str | None, log_g: int, has_bias: bool
) -> None:
    """The interpreter is lenient; compiling ahead of time for real GPUs (no
    device needed) checks the kernel through Triton's full pipeline to a cubin."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from optimus_eqsat.kernels._triton_grouped_linear import _grouped_linear_kernel

    constexprs = {
        "DTYPE": getattr(tl, dtype_name),
        "LOG_G": log_g,
        "HAS_ANY_BIAS": has_bias,
        "INPUT_PRECISION": precision,
        "UPCAST_OPERANDS": False,
        "BLOCK_M": 64,
        "BLOCK_N": 64,
        "BLOCK_K": 32,
    }
    signature = {"table_ptr": "*i64", "G": "i32", **{k: "constexpr" for k in constexprs}}
    src = ASTSource(triton.jit(_grouped_linear_kernel), signature=signature, constexprs=constexprs)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": 4})
    assert len(compiled.asm["cubin"]) > 0
