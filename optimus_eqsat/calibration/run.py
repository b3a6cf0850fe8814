"""``calibrate()``: measure a device's primitives through Inductor into a profile.

Three steps, each a set of small programs compiled with ``torch.compile``
(:mod:`.programs`) and timed in interleaved rounds (:mod:`.timing`):

1. host costs per call: the four program families at k = 1, 4, 16 (, 64), fitted
   by regression (:mod:`.fit`); on CUDA once more under CUDA graphs
   (``mode="reduce-overhead"``) for ``cudagraph_call_s`` / ``cudagraph_kernel_s``;
2. throughput of one big generated kernel: memory bandwidth (in-place pointwise
   over a buffer well beyond the caches) and pointwise FLOP/s (a multiply-add
   chain over a cache-sized tensor), each net of the fitted host costs;
3. matmul throughput of ``mm`` and ``bmm`` at a grid of shapes, each net of the
   same program's time at 8x8x8.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import cast

import numpy as np
import torch

from optimus_eqsat.calibration.fit import COUNT_COLUMNS, HostFit, NonsenseFitError, fit_host_costs
from optimus_eqsat.calibration.profile import CalibratedProfile, MatmulEntry
from optimus_eqsat.calibration.programs import (
    HOST_FAMILIES,
    CalibrationError,
    Counts,
    Program,
    bandwidth_program,
    compile_program,
    host_program,
    inputs_program,
    matmul_program,
    norms_program,
    pointwise_flops_program,
    rows_program,
    views_program,
)
from optimus_eqsat.calibration.store import device_name, dtype_name
from optimus_eqsat.calibration.timing import iqr, time_rounds

__all__ = ["calibrate", "Plan", "plan_for"]

Shape = tuple[str, int, int, int, int]  # op, batch, M, K, N


@dataclass(frozen=True)
class Plan:
    """What one calibration measures and how long it times each program."""

    ks: tuple[int, ...]
    host_rounds: int
    matmul_shapes: tuple[Shape, ...]
    matmul_rounds: int
    bandwidth_bytes: int
    flops_numel: int
    flops_depth: int
    target_s: float  # seconds per timing (one program, one round)


def _grid(
    ms: Sequence[int], kns: Sequence[int], batches: Sequence[int], bmm_ms: Sequence[int], bmm_kns: Sequence[int]
) -> tuple[Shape, ...]:
    mm = [("mm", 1, m, kn, kn) for m in ms for kn in kns]
    bmm = [("bmm", b, m, kn, kn) for b in batches for m in bmm_ms for kn in bmm_kns]
    return tuple(mm + bmm)


def plan_for(device: str, quick: bool) -> Plan:
    """The measurement plan: ``quick`` is a smoke run (fewer programs, rounds and shapes)."""
    big = device == "cuda"
    if quick:
        return Plan(
            ks=(1, 4, 16),
            host_rounds=15,
            matmul_shapes=_grid((32, 256), (16, 256), (8,), (32,), (16, 256)),
            matmul_rounds=3,
            bandwidth_bytes=(256 if big else 128) << 20,
            flops_numel=(1 << 22) if big else (1 << 14),
            flops_depth=64,
            target_s=1e-3,
        )
    # bmm stops at M=256, K=N=256: batch 64 at M=2048, K=N=1024 is 275 GFLOP, seconds on one CPU core.
    return Plan(
        ks=(1, 4, 16, 64),
        host_rounds=31,
        matmul_shapes=_grid((32, 256, 2048), (16, 64, 256, 1024), (8, 64), (32, 256), (16, 64, 256)),
        matmul_rounds=5,
        bandwidth_bytes=(1024 if big else 256) << 20,
        flops_numel=(1 << 24) if big else (1 << 16),
        flops_depth=128,
        target_s=2e-3,
    )


def _timed_matrix(programs: Sequence[Program], clock: str, rounds: int, target_s: float, warmup: int = 3) -> np.ndarray:
    """rounds x programs seconds per call."""
    times = time_rounds({p.name: p for p in programs}, clock=clock, rounds=rounds, warmup=warmup, target_s=target_s)
    return np.stack([times[p.name] for p in programs], axis=1)


def _host_time(fit: HostFit, counts: Counts) -> float:
    """Host seconds the fit predicts for a program with ``counts``."""
    return fit.costs["call_s"] + sum(
        getattr(counts, col) * fit.costs.get(cost_field, 0.0) for col, cost_field in COUNT_COLUMNS.items()
    )


ATTEMPTS = 3  # timings of the host programs before a negative fit is final


def _measure_host(
    plan: Plan,
    device: str,
    dtype: torch.dtype,
    clock: str,
    say: Callable[[str], None],
    families: Sequence[str] = HOST_FAMILIES,
    mode: str | None = None,
    tag: str = "",
    merge_kernels: bool = False,
    field_prefix: str = "",
) -> tuple[list[Program], np.ndarray, HostFit]:
    """Compile the host-cost programs, time them and fit; on a negative fit (a noisy
    spell) time them again, up to ``ATTEMPTS`` times. ``merge_kernels``: one column
    for generated and extern kernels alike."""
    programs = []
    for family in families:
        for k in plan.ks:
            programs.append(compile_program(host_program(family, k, device, dtype, tag), mode=mode))
    counts = cast(list[Counts], [p.counts for p in programs])  # compiled programs are counted
    if merge_kernels:
        counts = [Counts(c.generated + c.extern, 0, 0, 0) for c in counts]
    say(f"  compiled {len(programs)} host-cost programs{' (' + mode + ')' if mode else ''}; timing")
    for attempt in range(1, ATTEMPTS + 1):
        matrix = _timed_matrix(programs, clock, plan.host_rounds, plan.target_s)
        try:
            return programs, matrix, fit_host_costs(counts, matrix, field_prefix)
        except NonsenseFitError as exc:
            if attempt == ATTEMPTS:
                raise
            say(f"  {exc}; timing again")
    raise AssertionError("unreachable")


def _throughput(program: Program, times: np.ndarray, host_s: float) -> tuple[float, float]:
    """(median rate, IQR of per-round rates) of ``program.work`` net of the host time."""
    rates = program.work / np.maximum(times - host_s, 0.1 * times)
    return float(np.median(rates)), float(iqr(rates))


def _matmul_table(
    plan: Plan, device: str, dtype: torch.dtype, clock: str, say: Callable[[str], None]
) -> tuple[MatmulEntry, ...]:
    bases = {
        "mm": matmul_program("mm", 1, 8, 8, 8, device, dtype),
        "bmm": matmul_program("bmm", 2, 8, 8, 8, device, dtype),
    }
    shaped = [matmul_program(*shape, device, dtype) for shape in plan.matmul_shapes]
    programs = [compile_program(p) for p in (*bases.values(), *shaped)]
    say(f"  compiled {len(programs)} matmul programs; timing")
    matrix = _timed_matrix(programs, clock, plan.matmul_rounds, plan.target_s, warmup=2)
    column = {p.name: matrix[:, i] for i, p in enumerate(programs)}
    entries = []
    for shape, program in zip(plan.matmul_shapes, shaped):
        op, batch, m, k, n = shape
        times, base = column[program.name], column[bases[op].name]
        seconds, base_s = float(np.median(times)), float(np.median(base))
        noise = max(float(iqr(times)), float(iqr(base)), 0.01 * seconds)
        kernel_s = seconds - base_s
        bound = kernel_s < noise
        kernel_s = max(kernel_s, noise)
        entries.append(MatmulEntry(op, batch, m, k, n, seconds, kernel_s, program.work / kernel_s, bound))
    return tuple(entries)


def _slope(ks: Sequence[int], times: np.ndarray) -> tuple[float, float]:
    """(median slope of time over k, IQR of the per-round slopes): times is rounds x len(ks)."""
    slopes = np.polyfit(np.asarray(ks, dtype=float), times.T, 1)[0]
    return float(np.median(slopes)), float(iqr(slopes))


def _measure_inputs(
    plan: Plan, device: str, dtype: torch.dtype, clock: str, say: Callable[[str], None], alloc_s: float = 0.0
) -> dict[str, tuple[float, float]]:
    """``input_s`` and ``trained_input_s`` (see the profile), each the slope over k of a
    program family with k inputs: one generated kernel whatever k; in training, forward,
    ``backward()`` into k parameters and ``zero_grad`` as a training loop does."""
    ks = plan.ks
    plain = [compile_program(inputs_program(k, device, dtype)) for k in ks]
    views = [compile_program(views_program(k, device, dtype)) for k in ks]
    rows = [compile_program(rows_program(64 * k, device, dtype)) for k in ks]
    norms = [compile_program(norms_program(k, device, dtype)) for k in ks]
    with torch.enable_grad():
        trained = [compile_program(inputs_program(k, device, dtype, trained=True)) for k in ks]

    def step(program: Program) -> Callable[[], None]:
        params = list(cast(torch.nn.Module, program.fn).parameters())  # a trained program is a module

        def run() -> None:
            with torch.enable_grad():
                program().sum().backward()
            for p in params:
                p.grad = None

        return run

    say(f"  compiled {3 * len(ks)} per-input and per-view programs; timing")
    matrix = _timed_matrix(plain, clock, plan.host_rounds, plan.target_s)
    view_s = _slope(ks, _timed_matrix(views, clock, plan.host_rounds, plan.target_s))
    row_s = _slope([64 * k for k in ks], _timed_matrix(rows, clock, plan.host_rounds, plan.target_s))
    per_norm = _slope(ks, _timed_matrix(norms, clock, plan.host_rounds, plan.target_s))
    programs = {p.name: step(p) for p in trained}
    times = time_rounds(programs, clock=clock, rounds=plan.host_rounds, warmup=3, target_s=plan.target_s)
    trained_matrix = np.stack([times[p.name] for p in trained], axis=1)
    input_s = _slope(ks, matrix)
    per_trained = _slope(ks, trained_matrix)
    # a trained input also pays input_s in the forward call
    return {
        "input_s": input_s,
        "trained_input_s": (max(per_trained[0] - input_s[0], 0.0), per_trained[1]),
        "view_s": view_s,
        "reduction_row_s": row_s,
        # a norm of the family also pays an input, a buffer and its 32 rows
        "reduction_s": (max(per_norm[0] - input_s[0] - alloc_s - 32 * row_s[0], 0.0), per_norm[1]),
    }


def _program_rows(programs: Sequence[Program], matrix: np.ndarray) -> list[dict]:
    medians = np.median(matrix, axis=0)
    return [
        {"name": p.name, "family": p.family, "k": p.k, **vars(p.counts), "median_s": float(t)}
        for p, t in zip(programs, medians)
    ]


def calibrate(
    device: str = "cpu",
    dtype: torch.dtype | str = torch.float32,
    threads: int | None = None,
    quick: bool = False,
    clock: str = "auto",
    progress: Callable[[str], None] | None = None,
) -> CalibratedProfile:
    """Measure this machine's ``device`` ("cpu" or "cuda") through Inductor.

    Args:
        dtype: the dtype of every program (matmul throughput depends on it most).
        threads: CPU threads to measure with (``torch.set_num_threads``, restored
            afterwards); None: torch's current setting. Ignored on CUDA.
        quick: a smoke run (seconds; fewer programs, rounds and matmul shapes).
        clock: "wall", "cpu" (process CPU time) or "auto": CUDA events on CUDA,
            CPU time for one CPU thread (other jobs on a shared machine cannot
            inflate it, and for one thread it is the wall time of an idle
            machine), else wall time.
        progress: called with a line per step (e.g. ``print``).

    Raises :class:`CalibrationError` when kernel counts differ from the programs'
    design or the per-call fit is nonsense. The profile is returned, not saved
    (see :func:`save_profile`).
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise CalibrationError("calibrate(device='cuda'): CUDA is not available")
    dtype_str = dtype_name(dtype)
    dtype = cast(torch.dtype, getattr(torch, dtype_str))
    say = progress or (lambda _line: None)
    plan = plan_for(device, quick)
    started = time.perf_counter()
    old_threads = torch.get_num_threads()
    if device == "cpu" and threads is not None:
        torch.set_num_threads(threads)
    try:
        clock = _resolve_clock(clock, device)
        with torch.no_grad():
            return _calibrate(plan, device, dtype, dtype_str, quick, clock, say, started)
    finally:
        torch.set_num_threads(old_threads)


def _load_average() -> float | None:
    """The machine's 1-minute load average (Unix): above the core count, other jobs
    were competing with the measurement."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _resolve_clock(clock: str, device: str) -> str:
    if device == "cuda":
        return "cuda"
    if clock == "auto":
        return "cpu" if torch.get_num_threads() == 1 else "wall"
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'auto', 'wall' or 'cpu', not {clock!r}")
    return clock


def _calibrate(
    plan: Plan,
    device: str,
    dtype: torch.dtype,
    dtype_str: str,
    quick: bool,
    clock: str,
    say: Callable[[str], None],
    started: float,
) -> CalibratedProfile:
    load = _load_average()
    if load is not None and load > (os.cpu_count() or 1):
        say(
            f"  warning: load average {load} exceeds the {os.cpu_count()} cores: other jobs compete; "
            "wall-clock numbers will be slow (the CPU clock of a one-thread run is less affected)"
        )
    say(
        f"calibrating {device_name(device)} ({device}, {dtype_str}, threads {torch.get_num_threads()}"
        f"{', quick' if quick else ''}, {clock} clock)"
    )
    host_programs, host_matrix, fit = _measure_host(plan, device, dtype, clock, say)
    costs, spread = dict(fit.costs), dict(fit.spread)
    fit_record = {
        "residual_rms_s": fit.residual_rms_s,
        "residual_rel": fit.residual_rel,
        "columns": list(fit.columns),
        "rounds": plan.host_rounds,
        "counts_verified": True,
        "programs": _program_rows(host_programs, host_matrix),
    }

    if device == "cuda":
        # Inside a CUDA graph a kernel is a kernel: one column for generated and extern alike.
        cg_programs, cg_matrix, cg_fit = _measure_host(
            plan,
            device,
            dtype,
            clock,
            say,
            ("chain_mm", "mm_relu"),
            mode="reduce-overhead",
            tag="_cudagraph",
            merge_kernels=True,
            field_prefix="cudagraph_",
        )
        costs["cudagraph_kernel_s"] = cg_fit.costs.pop("cudagraph_generated_kernel_s")
        spread["cudagraph_kernel_s"] = cg_fit.spread.pop("cudagraph_generated_kernel_s")
        costs.update(cg_fit.costs)
        spread.update(cg_fit.spread)
        fit_record["cudagraph"] = {
            "residual_rms_s": cg_fit.residual_rms_s,
            "residual_rel": cg_fit.residual_rel,
            "programs": _program_rows(cg_programs, cg_matrix),
        }

    itemsize = torch.empty((), dtype=dtype).element_size()
    bandwidth = compile_program(bandwidth_program(plan.bandwidth_bytes // itemsize, device, dtype))
    flops = compile_program(pointwise_flops_program(plan.flops_numel, plan.flops_depth, device, dtype))
    say("  timing bandwidth and pointwise FLOP/s")
    matrix = _timed_matrix([bandwidth, flops], clock, max(5, plan.matmul_rounds), plan.target_s, warmup=2)
    # both are compiled, so counted
    bandwidth_rate, spread["mem_bandwidth_bytes_per_s"] = _throughput(
        bandwidth, matrix[:, 0], _host_time(fit, cast(Counts, bandwidth.counts))
    )
    flops_rate, spread["pointwise_flops_per_s"] = _throughput(
        flops, matrix[:, 1], _host_time(fit, cast(Counts, flops.counts))
    )

    matmul = _matmul_table(plan, device, dtype, clock, say)
    per_input = _measure_inputs(plan, device, dtype, clock, say, costs["alloc_s"])
    for name, (value, iqr_value) in per_input.items():
        costs[name], spread[name] = value, iqr_value
    fit_record["duration_s"] = round(time.perf_counter() - started, 1)
    fit_record["quick"] = quick
    fit_record["clock"] = clock
    fit_record["load_average"] = _load_average()
    rounds = f"medians of {plan.host_rounds} interleaved rounds, {clock} clock"
    source = {
        "call_s": f"measured: intercept of the regression over {len(host_programs)} Inductor programs "
        f"({', '.join(HOST_FAMILIES)} at k = {', '.join(map(str, plan.ks))}), {rounds}",
        "generated_kernel_s": "measured: regression slope per generated kernel call",
        "extern_call_s": "measured: regression slope per extern call (8x8 mm included)",
        "alloc_s": "measured: regression slope per wrapper empty_strided (returned buffers included)",
        "custom_op_s": "measured: regression slope per torch.library Python custom op call (body: one clone)",
        "mem_bandwidth_bytes_per_s": f"measured: in-place generated pointwise kernel over "
        f"{plan.bandwidth_bytes >> 20} MiB, read + write, net of host cost, "
        f"{clock} clock",
        "pointwise_flops_per_s": f"measured: generated kernel, {plan.flops_depth} multiply-adds per element "
        f"over {plan.flops_numel} elements, net of host cost, {clock} clock",
        "matmul": f"measured: extern mm/bmm through Inductor, median of {plan.matmul_rounds} rounds "
        f"minus the 8x8x8 program's, {clock} clock",
        "input_s": f"measured: slope over k = {', '.join(map(str, plan.ks))} of one-kernel programs reading "
        f"k inputs, {rounds}",
        "trained_input_s": "measured: slope over k of a training step (forward, backward into k parameters, "
        "zero_grad) of the same programs, less input_s",
        "view_s": "measured: slope over k of a one-kernel program returning k views of its buffer "
        "(reinterpret_tensor in the wrapper)",
        "reduction_row_s": "measured: slope over rows of one layer norm over rows of 8",
        "reduction_s": "measured: slope over k of k layer norms of 32x8 in one kernel, less an input, a "
        "buffer and 32 rows",
    }
    if device == "cuda":
        source["cudagraph_call_s"] = "measured: intercept under mode='reduce-overhead' (CUDA graph trees)"
        source["cudagraph_kernel_s"] = "measured: slope per kernel under mode='reduce-overhead'"
    else:
        source["cudagraph_call_s"] = source["cudagraph_kernel_s"] = "not applicable on cpu"
    return CalibratedProfile(
        device=device_name(device),
        device_kind=device,
        dtype=dtype_str,
        torch_version=torch.__version__,
        threads=torch.get_num_threads() if device == "cpu" else None,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        call_s=costs["call_s"],
        generated_kernel_s=costs["generated_kernel_s"],
        extern_call_s=costs["extern_call_s"],
        alloc_s=costs["alloc_s"],
        custom_op_s=costs.get("custom_op_s"),
        mem_bandwidth_bytes_per_s=bandwidth_rate,
        pointwise_flops_per_s=flops_rate,
        matmul=matmul,
        cudagraph_call_s=costs.get("cudagraph_call_s"),
        cudagraph_kernel_s=costs.get("cudagraph_kernel_s"),
        input_s=costs.get("input_s"),
        trained_input_s=costs.get("trained_input_s"),
        view_s=costs.get("view_s"),
        reduction_row_s=costs.get("reduction_row_s"),
        reduction_s=costs.get("reduction_s"),
        source=source,
        spread=spread,
        fit=fit_record,
    )
