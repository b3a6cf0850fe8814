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


CLOCKS = ("wall", "cpu")


def timed_step(step: Callable[[], object], device: str, clock: str = "wall") -> Callable[[], float]:
    """``step`` as a callable that runs it once and returns its milliseconds.

    Wall clock by default, not CUDA events: users pay the host time too (launch
    overhead, Python, the optimizer's extra ops), and on small batches that is
    most of a step. On CUDA the device is synchronized before and after, so
    queued work of the previous step is not billed to this one. ``clock="cpu"``
    takes this process's CPU time instead: with one thread on a CPU it is the
    wall time the step would take alone, and time the process spends preempted
    by other jobs on a shared machine is not counted (never for CUDA or several
    threads, whose waits it would miss).
    """
    now = time.process_time if clock == "cpu" else time.perf_counter

    def timed() -> float:
        sync(device)
        start = now()
        step()
        sync(device)
        return (now() - start) * 1e3

    return timed


def cuda_graph_launches(step: Callable[[], object]) -> int:
    """``cudaGraphLaunch`` calls during one step (CUDA profiler): > 0 when the
    step replays CUDA graphs, so a cudagraph method that silently fell back shows 0."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return count_events(prof.events(), "cudaGraphLaunch")


def count_events(events: Sequence[object], name: str) -> int:
    """How many profiler events carry ``name``."""
    return sum(1 for e in events if getattr(e, "name", None) == name)


# --- peak memory ----------------------------------------------------------------


def _profiled_peak_bytes(step: Callable[[], object]) -> int:
    """Peak of torch's CPU allocations during one step above the start, from the
    profiler's [memory] events (alloc > 0, free < 0) replayed in time order."""
    from optimus_eqsat.guard import step_peak_bytes

    return step_peak_bytes(step, on_cuda=False)


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


def model_state_mb(model: torch.nn.Module) -> float:
    """MB of the model's parameters and buffers, each storage once: what a step holds besides
    what it allocates (a program that packs parameters into shared stacks holds them once)."""
    from optimus_eqsat.guard import resident_bytes

    return resident_bytes([*model.parameters(), *model.buffers()]) / 2**20


def peak_memory_mb(step: Callable[[], object], device: str, steps: int = 1) -> tuple[float, str]:
    """(peak MB allocated during ``steps`` steps above what was allocated before, how measured).

    CUDA: ``torch.cuda.max_memory_allocated`` over ``steps`` steps (give CUDA
    graph methods three: their first run warms up and the second records into
    the graph's private pool, whose blocks only count while being recorded).
    CPU: the torch profiler's allocation events over one step (exact for torch
    tensors; tracemalloc would miss them, as torch's CPU allocator bypasses
    Python's); the peak-RSS growth is the fallback if profiling fails.
    """
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(max(steps, 1)):
            step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20, "cuda_max_allocated"
    try:
        return _profiled_peak_bytes(step) / 2**20, "cpu_profiler_alloc_peak"
    except Exception:
        rss = _rss_peak_bytes(step)
        return (float("nan"), "unavailable") if rss is None else (rss / 2**20, "cpu_rss_hwm_delta")
