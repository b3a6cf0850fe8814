"""Training step of zoo models with stacked parameters (``optimus_eqsat.stack_parameters``).

Models: zoo names, or the library-style models of ``tests/library_style.py`` (``rechub.MMOE``,
``deepctr.PLE``, ...: batch norms, and deepctr's dropout of 0.1; their outputs are compared
with eager's only where no dropout is active).

For each model and batch, three copies of one seeded model, each with its own Adam
optimizer (built after any stacking), in one process:

- ``inductor``: the original model, ``torch.compile(model)`` (Inductor's defaults; the baseline);
- ``ours``: the original model, ``torch.compile(model, backend="optimus_eqsat")``;
- ``stacked``: the model after ``stack_parameters(model, inputs)``, compiled with our backend;
- ``stacked_program``: the same with ``measure=False``: the optimizer's batched program as it
  is, whichever the measured choice would keep.

The other methods run with the backend's defaults (the measured choice on, which on a busy
machine may keep either program: the ``kept`` column says which). Two steps are timed
per method, each in its own interleaved rounds (:mod:`benchmarks.rounds`, ratios paired
with Inductor's round): ``step`` (``zero_grad``, forward, backward of the outputs' sum) and
``step+opt`` (the same and ``opt.step()``). Peak memory is the torch profiler's peak of
allocations over one step above what was allocated before, plus the model's parameters and
buffers (each storage once), so a layout that held the weights twice would show.

    python -m benchmarks.stacking --models mmoe,ple,dynamic_schema --batches 32,256 \\
        --threads 1 --clock cpu --out benchmarks/results/stacking
"""

from __future__ import annotations

import argparse
import copy
import csv
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.measure import flat_outputs, max_abs_diff, model_state_mb, peak_memory_mb, timed_step
from benchmarks.rounds import RoundPlan, run_rounds
from benchmarks.stats import spread
from benchmarks.zoo import MODELS
from optimus_eqsat import stack_parameters
from optimus_eqsat.stacking import stacked_groups

METHODS = ("inductor", "ours", "stacked", "stacked_program")
STEPS = ("step", "step+opt")


def _train_step(
    compiled: Callable,
    model: torch.nn.Module,
    inputs: tuple,
    opt: torch.optim.Optimizer | None,
) -> Callable[[], list[torch.Tensor]]:
    """Zero the gradients, forward, backward of the outputs' sum and, with ``opt``, its step."""

    def step() -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        outs = flat_outputs(compiled(*inputs))
        sum(o.float().sum() for o in outs).backward()
        if opt is not None:
            opt.step()
        return outs

    return step


def _build(method: str, base: torch.nn.Module, inputs: tuple) -> dict[str, Any]:
    """One method's model, compiled program and optimizer; the first step (the compile) run."""
    model = copy.deepcopy(base)
    start = time.perf_counter()
    if method.startswith("stacked"):
        stack_parameters(model, inputs)
    stack_s = time.perf_counter() - start
    if method == "inductor":
        compiled = torch.compile(model, dynamic=False)
    else:
        from optimus_eqsat.backend import make_backend

        backend = make_backend(**({"measure": False} if method == "stacked_program" else {}))
        compiled = torch.compile(model, backend=backend, dynamic=False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    steps = {"step": _train_step(compiled, model, inputs, None), "step+opt": _train_step(compiled, model, inputs, opt)}
    start = time.perf_counter()
    outs = steps["step"]()
    compile_s = time.perf_counter() - start
    kept = ""
    if method != "inductor":
        kept = ";".join(
            r.measured.kept if r.measured is not None else ("unchanged" if not r.changed else "untimed")
            for r in backend.reports
        )
    return {
        "model": model,
        "steps": steps,
        "outs": [o.detach() for o in outs],
        "stack_s": stack_s,
        "compile_s": compile_s,
        "kept": kept,
        "groups": len(stacked_groups(model)),
        "params": sum(1 for _ in model.parameters()),
    }


def model_and_inputs(name: str, batch: int) -> tuple[torch.nn.Module, tuple]:
    """A seeded zoo or library-style model (training mode) and its inputs."""
    if name in MODELS:
        spec = MODELS[name]
        return spec.build(seed=0), spec.inputs(batch, seed=0)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.library_style import BUILDERS

    return BUILDERS[name](batch)


def run_case(name: str, batch: int, plan: RoundPlan, clock: str, say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every method and step of one (model, batch): rows with times, ratios and peak memory."""
    base, inputs = model_and_inputs(name, batch)
    random = any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in base.modules())
    reference = [o.detach() for o in flat_outputs(base(*inputs))]
    built = {}
    for method in METHODS:
        say(f"{name} b{batch}: compiling {method}")
        built[method] = _build(method, base, inputs)
    rows = []
    for step in STEPS:
        say(f"{name} b{batch}: timing {step}")
        result = run_rounds(
            {m: timed_step(built[m]["steps"][step], "cpu", clock) for m in METHODS}, plan, baseline="inductor"
        )
        ratios = result.ratios("inductor")
        peaks = {
            m: peak_memory_mb(built[m]["steps"][step], "cpu")[0] + model_state_mb(built[m]["model"]) for m in METHODS
        }
        for m in METHODS:
            own, ratio = spread(result.round_ms[m]), spread(ratios.get(m, []))
            rows.append(
                {
                    "model": name,
                    "batch": batch,
                    "step": step,
                    "method": m,
                    "run_ms": own.median,
                    "run_ms_p10": own.p10,
                    "run_ms_p90": own.p90,
                    "ratio": ratio.median,
                    "ratio_p10": ratio.p10,
                    "ratio_p90": ratio.p90,
                    "rounds": result.rounds,
                    "stop": result.stop,
                    "stable": m not in result.unstable,
                    "peak_mb": peaks[m],
                    "peak_ratio": peaks[m] / peaks["inductor"],
                    "max_abs_diff_out": float("nan") if random else max_abs_diff(built[m]["outs"], reference),
                    "parameters": built[m]["params"],
                    "stacks": built[m]["groups"],
                    "stack_s": built[m]["stack_s"],
                    "compile_s": built[m]["compile_s"],
                    "kept": built[m]["kept"],
                    "error": result.errors.get(m, ""),
                }
            )
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | batch | step | Inductor ms | ours / Inductor [p10, p90] | stacked / Inductor [p10, p90] "
        "| stacked, measure off / Inductor [p10, p90] | rounds | peak memory / Inductor: stacked, measure off "
        "| parameters (stacks) | program kept (ours; stacked) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_case: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        by_case.setdefault((r["model"], r["batch"], r["step"]), {})[r["method"]] = r
    for (model, batch, step), m in by_case.items():

        def ratio(r: dict) -> str:
            star = "" if r["stable"] else "*"
            return f"{r['ratio']:.2f} [{r['ratio_p10']:.2f}, {r['ratio_p90']:.2f}]{star}"

        ind, ours, st, prog = m["inductor"], m["ours"], m["stacked"], m["stacked_program"]
        lines.append(
            f"| {model} | {batch} | {step} | {ind['run_ms']:.2f} | {ratio(ours)} | {ratio(st)} | "
            f"{ratio(prog)} | {ind['rounds']} | {st['peak_ratio']:.2f}, {prog['peak_ratio']:.2f} | "
            f"{ind['parameters']} -> {prog['parameters']} ({prog['stacks']}) | {ours['kept']}; {st['kept']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mmoe,ple,dynamic_schema")
    parser.add_argument("--batches", default="32,256")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--max-rounds", type=int, default=25)
    parser.add_argument("--max-timing-s", type=float, default=40.0)
    parser.add_argument("--out", default="benchmarks/results/stacking")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 4096
    plan = RoundPlan(min_rounds=args.rounds, max_rounds=args.max_rounds, max_seconds=args.max_timing_s)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            try:
                rows += run_case(name, batch, plan, args.clock, lambda s: print(s, flush=True))
            except Exception as exc:  # one broken case must not lose the others' rows
                print(f"{name} b{batch}: {type(exc).__name__}: {exc}", flush=True)
                continue
            with (out / "results.csv").open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
            (out / "table.md").write_text(_table(rows) + "\n")
            print(_table(rows), flush=True)


if __name__ == "__main__":
    main()
