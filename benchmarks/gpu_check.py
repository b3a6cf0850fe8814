"""GPU checks that unit tests cannot run here: the Triton grouped-linear kernel on CUDA.

    python -m benchmarks.gpu_check [--out FILE]

For several groups of linears with different shapes (fp32 and bf16):

- forward and gradients of ``torch.ops.optimus_eqsat.grouped_linear`` against a
  loop of ``F.linear`` (max abs difference, relative to the output's scale);
- CUDA kernels launched per call, counted with ``torch.profiler`` (the claim:
  one launch for the forward, one for the backward);
- time per call (``triton.testing.do_bench``, median) against the ``F.linear``
  loop, as a ratio, and the host time per call (Python and dispatch) of each.

And the backend under ``torch.compile(mode=...)`` (``reduce-overhead``: CUDA graphs,
with the measured choice timing programs in turns): the demo model's outputs, and
in training its gradients over three steps, against eager.

Run by benchmarks/device_run.sh on a CUDA machine; exits non-zero if a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from optimus_eqsat.kernels import grouped_linear

CASES = {
    # name: [(M, K, N), ...] one tuple per linear of the group
    "towers_16_small": [(256, 16 * (1 + i % 3), 8 * (1 + i % 4)) for i in range(16)],
    "features_300_tiny": [(64, (4, 8, 16)[i % 3], 8) for i in range(300)],
    "mlp_heads_8_medium": [(1024, 256 + 64 * i, 128 + 32 * i) for i in range(8)],
}


def _operands(shapes, dtype, requires_grad):
    g = torch.Generator(device="cuda").manual_seed(0)
    xs = [torch.randn(m, k, device="cuda", dtype=dtype, generator=g, requires_grad=requires_grad) for m, k, _ in shapes]
    ws = [
        torch.randn(n, k, device="cuda", dtype=dtype, generator=g, requires_grad=requires_grad) / k**0.5
        for _, k, n in shapes
    ]
    bs = [torch.randn(n, device="cuda", dtype=dtype, generator=g, requires_grad=requires_grad) for _, _, n in shapes]
    return xs, ws, bs


def _kernels(fn) -> int:
    """CUDA kernels launched by one call of ``fn`` (after a warm-up call)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(
        1 for e in prof.events() if e.device_type.name == "CUDA" and "Memcpy" not in e.name and "Memset" not in e.name
    )


def _host_ms(fn, calls: int = 20) -> float:
    """Host time per call (launch-side Python and dispatch, without waiting for the GPU)."""
    import time

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls
    torch.cuda.synchronize()
    return 1e3 * host


def check(name: str, shapes, dtype: torch.dtype) -> dict[str, object]:
    from triton.testing import do_bench

    xs, ws, bs = _operands(shapes, dtype, requires_grad=True)
    ys = grouped_linear(xs, ws, bs)
    refs = [F.linear(x.float(), w.float(), b.float()) for x, w, b in zip(xs, ws, bs)]
    scale = max(r.abs().max().item() for r in refs)
    fwd_err = max((y.float() - r).abs().max().item() for y, r in zip(ys, refs)) / scale
    grads_out = [torch.randn_like(y) for y in ys]
    got = torch.autograd.grad(ys, [*xs, *ws, *bs], grads_out)
    ref_ys = [F.linear(x, w, b) for x, w, b in zip(xs, ws, bs)]
    want = torch.autograd.grad(ref_ys, [*xs, *ws, *bs], grads_out)
    grad_err = max(
        ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item() for a, b in zip(got, want)
    )

    with torch.no_grad():
        xs0, ws0, bs0 = [x.detach() for x in xs], [w.detach() for w in ws], [b.detach() for b in bs]
        fused_fwd = lambda: grouped_linear(xs0, ws0, bs0)  # noqa: E731
        loop_fwd = lambda: [F.linear(x, w, b) for x, w, b in zip(xs0, ws0, bs0)]  # noqa: E731
        launches_fused, launches_loop = _kernels(fused_fwd), _kernels(loop_fwd)
        t_fused, t_loop = do_bench(fused_fwd), do_bench(loop_fwd)
        host_fused, host_loop = _host_ms(fused_fwd), _host_ms(loop_fwd)

    def fused_bwd():
        torch.autograd.grad(grouped_linear(xs, ws, bs), [*xs, *ws, *bs], grads_out)

    def loop_bwd():
        torch.autograd.grad([F.linear(x, w, b) for x, w, b in zip(xs, ws, bs)], [*xs, *ws, *bs], grads_out)

    tb_fused, tb_loop = do_bench(fused_bwd), do_bench(loop_bwd)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    return {
        "case": name,
        "dtype": str(dtype).replace("torch.", ""),
        "groups": len(shapes),
        "fwd_rel_err": fwd_err,
        "grad_rel_err": grad_err,
        "ok": fwd_err < tol and grad_err < 10 * tol,
        "fwd_kernels_grouped": launches_fused,
        "fwd_kernels_loop": launches_loop,
        "fwd_ms_grouped": round(t_fused, 4),
        "fwd_ms_loop": round(t_loop, 4),
        "fwd_speedup": round(t_loop / t_fused, 2),
        "fwd_host_ms_grouped": round(host_fused, 4),
        "fwd_host_ms_loop": round(host_loop, 4),
        "fwd_bwd_ms_grouped": round(tb_fused, 4),
        "fwd_bwd_ms_loop": round(tb_loop, 4),
        "fwd_bwd_speedup": round(tb_loop / tb_fused, 2),
    }


def check_backend_mode(mode: str, training: bool, device: str = "cuda") -> dict[str, object]:
    """``torch.compile(DemoRecModel, backend="optimus_eqsat", mode=mode)`` against eager."""
    import copy

    from optimus_eqsat.demo import DemoRecModel

    torch.manual_seed(0)
    model = DemoRecModel(features=8).to(device).train(training)
    reference = copy.deepcopy(model)
    (x,) = (t.to(device) for t in model.example_inputs(batch=256))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="optimus_eqsat", mode=mode)
    worst = 0.0
    for _ in range(3):
        torch.compiler.cudagraph_mark_step_begin()
        with torch.set_grad_enabled(training):
            out, want = compiled(x), reference(x)
        worst = max(worst, (out - want).abs().max().item())
        if training:
            out.sum().backward()
            want.sum().backward()
            worst = max(
                worst,
                *((p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), reference.parameters())),
            )
    return {"case": f"backend mode={mode}", "training": training, "max_abs_diff": worst, "ok": worst < 1e-3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="also write the rows as JSON lines here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 2
    print(f"torch {torch.__version__}, device {torch.cuda.get_device_name()}", flush=True)
    rows, ok = [], True
    for name, shapes in CASES.items():
        for dtype in (torch.float32, torch.bfloat16):
            try:
                row = check(name, shapes, dtype)
            except Exception as exc:  # report and go on: one broken case must not hide the others
                row = {"case": name, "dtype": str(dtype), "ok": False, "error": f"{type(exc).__name__}: {exc}"}
            ok &= bool(row["ok"])
            rows.append(row)
            print(json.dumps(row), flush=True)
    for mode in ("reduce-overhead", "max-autotune-no-cudagraphs"):
        for training in (False, True):
            try:
                row = check_backend_mode(mode, training)
            except Exception as exc:
                row = {
                    "case": f"backend mode={mode}",
                    "training": training,
                    "ok": False,
                    "error": f"{type(exc).__name__}: {exc}",
                }
            ok &= bool(row["ok"])
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
