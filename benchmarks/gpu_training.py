"""Step time of recommendation models on a CUDA device: library-style models with batch norms
and dropout, and zoo models with stacked parameters (issues 26 and 28's GPU targets).

    python -m benchmarks.gpu_training --cases rechub.MMOE:training:256,mmoe:training:2048 \\
        --out results.jsonl

A case is ``model:mode:batch``; a model is one of ``tests/library_style.py``'s builders
(``rechub.MMOE``, ``deepctr.PLE``, ... with their batch norms and dropouts) or a zoo model.
In each case these methods are compiled (cold) and timed side by side in interleaved rounds
(:func:`benchmarks.rounds.run_rounds`, wall clock with the device synchronized around a step):

- ``inductor`` and ``optimus_eqsat`` (the default backend, measured choice on);
- ``inductor_cudagraphs`` and ``optimus_eqsat_cudagraphs`` (``mode="reduce-overhead"``);
- in training, ``stacked``: :func:`optimus_eqsat.stack_parameters` on the model, then the
  default backend.

Per method one JSON line: median step ms, the median per-round ratio to Inductor with its
10th and 90th percentiles, the first call's seconds (compile, and for ours the measured
choice), the CUDA kernels of one step counted by the profiler (calibration of the GPU
profile: beside them the launches the cost model predicts for Dynamo's graph and for the
graph handed to Inductor), and, for ours, the program the measured choice kept.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_map

from benchmarks.instrument import CompileRecord, default_profile
from benchmarks.measure import make_step, sync, timed_step
from benchmarks.methods import EqsatOptions, Method, make_methods
from benchmarks.rounds import RoundPlan, run_rounds
from benchmarks.stats import spread

METHODS = ("inductor", "optimus_eqsat", "inductor_cudagraphs", "optimus_eqsat_cudagraphs")


def build_case(model: str, batch: int, device: str) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """A fresh seeded model and its inputs on ``device``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.zoo import MODELS
    from tests.library_style import BUILDERS

    if model in BUILDERS:
        net, inputs = BUILDERS[model](batch)
    else:
        net, inputs = MODELS[model].build(), MODELS[model].inputs(batch)
    return net.to(device), tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, inputs)


def kernels_per_step(step: Callable[[], object]) -> int:
    """Kernels the device ran in one step (profiler; a replayed CUDA graph's kernels included
    where the profiler sees them)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def _kept(record: CompileRecord) -> str:
    reports = list(getattr(record.backend, "reports", []) or [])
    kept = [r.measured.kept for r in reports if getattr(r, "measured", None) is not None]
    fallbacks = [r.fallback_reason for r in reports if getattr(r, "fallback_reason", None)]
    return ",".join(kept) + (f" (fallback: {'; '.join(fallbacks)[:200]})" if fallbacks else "")


def run_case(model: str, mode: str, batch: int, plan: RoundPlan, device: str = "cuda") -> list[dict[str, Any]]:
    """Compile and time every method on one case; one row per method."""
    training = mode == "training"
    steps: dict[str, Callable[[], float]] = {}
    rows: dict[str, dict[str, Any]] = {}
    names = list(METHODS) if device == "cuda" else [m for m in METHODS if "cudagraphs" not in m]
    methods: list[tuple[str, Method | None]] = [(m.label, m) for m in make_methods(names, [EqsatOptions()], device)]
    if training:
        methods.append(("stacked", None))
    for label, method in methods:
        row: dict[str, Any] = {"model": model, "mode": mode, "batch": batch, "method": label}
        rows[label] = row
        try:
            torch._dynamo.reset()
            torch.manual_seed(0)
            net, inputs = build_case(model, batch, device)
            net.train(training)
            record = CompileRecord(profile=default_profile(device), training=training)
            start = time.perf_counter()
            if method is None:
                from optimus_eqsat import stack_parameters

                stack_parameters(net, inputs)
                row["stack_s"] = time.perf_counter() - start
                method = make_methods(["optimus_eqsat"], [EqsatOptions()], device)[0]
            fn = method.prepare(net, record)
            step = make_step(fn, net, inputs, training)
            step()
            sync(device)
            row["first_call_s"] = time.perf_counter() - start
            if device == "cuda":
                row["kernels"] = kernels_per_step(step)
            row["pred_launches_dynamo"] = record.pred_launches_dynamo
            row["kept"] = _kept(record)
            steps[label] = timed_step(step, device)
        except Exception as exc:  # noqa: BLE001 - one method's failure is a row, not the end of the case
            row["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    result = run_rounds(steps, plan, baseline="inductor")
    ratios = result.ratios("inductor") if "inductor" in steps else {}
    for label, row in rows.items():
        if result.round_ms.get(label):
            row["ms"] = statistics.median(result.round_ms[label])
            row["rounds"] = len(result.round_ms[label])
        if ratios.get(label):
            ratio = spread(ratios[label])
            row.update(ratio=ratio.median, ratio_p10=ratio.p10, ratio_p90=ratio.p90)
        if label in result.errors:
            row["error"] = result.errors[label]
    steps.clear()
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return list(rows.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", required=True, help="comma list of model:mode:batch")
    parser.add_argument("--max-rounds", type=int, default=15)
    parser.add_argument("--max-timing-s", type=float, default=20.0, help="no round starts after this, per case")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to dry-run without the CUDA-graph methods")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, appended")
    args = parser.parse_args(argv)
    plan = RoundPlan(min_rounds=min(5, args.max_rounds), max_rounds=args.max_rounds, max_seconds=args.max_timing_s)
    for case in args.cases.split(","):
        model, mode, batch = case.split(":")
        start = time.perf_counter()
        rows = run_case(model, mode, int(batch), plan, args.device)
        with open(args.out, "a") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
        for row in rows:
            print(row, flush=True)
        print(f"{case}: {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
