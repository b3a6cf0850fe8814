"""Running one step and measuring it: steady-state time, peak memory, and
numeric difference from eager."""
from __future__ import annotations

import re
import statistics
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


def make_step(fn: Callable, model: torch.nn.Module, inputs: Sequence[torch.Tensor], training: bool) -> Callable[[], Outputs]:
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


def time_step(step: Callable[[], object], device: str, warmup: int, repeats: int) -> float:
    """Median milliseconds per step after ``warmup`` steps; CUDA events on GPU."""
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
    return statistics.median(times)


# --- peak memory ----------------------------------------------------------------

_STATUS = Path("/proc/self/status")


def _rss_kb(field: str) -> int | None:
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.M)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def _reset_rss_peak() -> bool:
    """Reset the kernel's peak-RSS mark (Linux: write 5 to clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_memory_mb(step: Callable[[], object], device: str) -> tuple[float, str]:
    """(peak MB during one step above the memory in use before it, how measured).

    CUDA: torch.cuda.max_memory_allocated. CPU: growth of the process's peak
    resident set (VmHWM after resetting it) over the current RSS; an estimate
    that includes allocator caching and is NaN where /proc is unavailable.
    torch's CPU allocator bypasses Python's, so tracemalloc would miss tensors.
    """
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20, "cuda_max_allocated"
    if not _reset_rss_peak():
        return float("nan"), "unavailable"
    base = _rss_kb("VmRSS")
    if base is None:
        return float("nan"), "unavailable"
    step()
    peak = _rss_kb("VmHWM")
    return (max(peak - base, 0) / 1024 if peak else float("nan")), "cpu_rss_hwm_delta"
