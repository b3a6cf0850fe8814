"""Running one step and measuring it: steady-state time, peak memory, and
numeric difference from eager."""
from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

Outputs = list[torch.Tensor]


def flat_outputs(out: object) -> Outputs:
    """A model output (tensor or tuple/list of tensors) as a flat list."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in flat_outputs(o)]
    return []


def make_step(
    fn: Callable, model: torch.nn.Module, inputs: Sequence[torch.Tensor], training: bool
) -> Callable[[], Outputs]:
    """One benchmark step: inference under no_grad, or forward + backward of the
    sum of outputs with fresh gradients (zero_grad is part of every method's step)."""
    if not training:

        def infer() -> Outputs:
            with torch.no_grad():
                return flat_outputs(fn(*inputs))

        return infer

    def train() -> Outputs:
        model.zero_grad(set_to_none=True)
        outs = flat_outputs(fn(*inputs))
        sum(o.float().sum() for o in outs).backward()
        return outs

    return train


def gradients(model: torch.nn.Module) -> list[torch.Tensor | None]:
    """Parameter gradients in parameter order (detached copies)."""
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def max_abs_diff(got: Sequence[torch.Tensor | None], want: Sequence[torch.Tensor | None]) -> float:
    """Largest elementwise |got - want| over paired tensors; inf on a shape or
    presence mismatch (a wrong program must not look accurate)."""
    if len(got) != len(want):
        return float("inf")
    worst = 0.0
    for g, w in zip(got, want):
        if g is None and w is None:
            continue
        if g is None or w is None or g.shape != w.shape:
            return float("inf")
        if g.numel():
            worst = max(worst, (g.detach().double() - w.detach().double()).abs().max().item())
    return worst


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_step(step: Callable[[], object], device: str, warmup: int, repeats: int) -> list[float]:
    """Milliseconds of each of ``repeats`` steps after ``warmup`` steps; CUDA events on GPU."""
    for _ in range(warmup):
        step()
    sync(device)
    times: list[float] = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


# --- peak memory ----------------------------------------------------------------


def _profiled_peak_bytes(step: Callable[[], object]) -> int:
    """Peak of torch's CPU allocations during one step above the start, from the
    profiler's [memory] events (alloc > 0, free < 0) replayed in time order."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return peak


_STATUS = Path("/proc/self/status")


def _rss_peak_bytes(step: Callable[[], object]) -> int | None:
    """Growth of peak RSS over one step (Linux: reset VmHWM via clear_refs).
    Coarse: allocator caching hides reused memory."""

    def kb(field: str) -> int | None:
        match = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.M)
        return int(match.group(1)) if match else None

    try:
        Path("/proc/self/clear_refs").write_text("5")
        base = kb("VmRSS")
        step()
        peak = kb("VmHWM")
    except OSError:
        return None
    return None if base is None or peak is None else max(peak - base, 0) * 1024


def peak_memory_mb(step: Callable[[], object], device: str) -> tuple[float, str]:
    """(peak MB allocated during one step above what was allocated before, how measured).

    CUDA: ``torch.cuda.max_memory_allocated``. CPU: the torch profiler's
    allocation events (exact for torch tensors; tracemalloc would miss them, as
    torch's CPU allocator bypasses Python's); the peak-RSS growth is the
    fallback if profiling fails.
    """
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20, "cuda_max_allocated"
    try:
        return _profiled_peak_bytes(step) / 2**20, "cpu_profiler_alloc_peak"
    except Exception:
        rss = _rss_peak_bytes(step)
        return (float("nan"), "unavailable") if rss is None else (rss / 2**20, "cpu_rss_hwm_delta")
