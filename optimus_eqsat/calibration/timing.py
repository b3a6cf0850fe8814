"""Timing programs in interleaved rounds.

The machine may be shared and noisy, so every program is timed once per round,
in an order rotated each round (a slow spell hits all programs alike rather than
one), after a warm-up; callers take medians over rounds and report spreads.
Within a round a program is timed ``repeats`` times in a row and the fastest
kept: on a machine shared with other jobs a timing that was preempted is
several times too slow, and the minimum of a few short timings drops it while
the median over rounds still reflects the typical cost.
Each timing runs a program ``n`` times back to back, ``n`` chosen so one timing
lasts about ``target_s``. On CUDA the loop is bracketed by CUDA events and
synchronized, so host-bound programs measure host time and device-bound ones
device time.

Clocks: "wall" (``time.perf_counter``), "cpu" (``time.process_time``: CPU time
of the whole process, which other jobs on a shared machine cannot inflate; it
equals wall time only for single-threaded work) and "cuda" (events).
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Mapping

import numpy as np
import torch

__all__ = ["time_rounds", "iqr"]


def _time_wall(fn: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def _time_process(fn: Callable[[], object], n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n


def _time_cuda(fn: Callable[[], object], n: int) -> float:
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / n


_TIMERS = {"wall": _time_wall, "cpu": _time_process, "cuda": _time_cuda}


def time_rounds(
    programs: Mapping[str, Callable[[], object]],
    *,
    clock: str = "wall",
    rounds: int = 9,
    repeats: int = 3,
    warmup: int = 3,
    target_s: float = 2e-3,
    max_inner: int = 10_000,
) -> dict[str, np.ndarray]:
    """Seconds per call of each program, one value per round (arrays of length ``rounds``):
    the fastest of ``repeats`` timings of about ``target_s`` each."""
    timer = _TIMERS[clock]
    names = list(programs)
    inner: dict[str, int] = {}
    for name in names:
        fn = programs[name]
        for _ in range(warmup):
            fn()
        once = timer(fn, 1)
        inner[name] = max(1, min(max_inner, math.ceil(target_s / max(once, 1e-9))))
    results = {name: np.empty(rounds) for name in names}
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection inside a timing is noise, not a program's cost
    try:
        for r in range(rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                results[name][r] = min(timer(programs[name], inner[name]) for _ in range(repeats))
    finally:
        if gc_was_enabled:
            gc.enable()
    return results


def iqr(values: np.ndarray, axis: int = 0) -> np.ndarray:
    """Interquartile range (q75 - q25)."""
    q25, q75 = np.percentile(values, [25, 75], axis=axis)
    return q75 - q25
