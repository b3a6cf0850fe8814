"""The research harness: every model x method x mode in one run, one row each.

A row holds the Dynamo graph size, predicted kernel launches (cost model),
kernel launches Inductor really emitted, optimizer and compile time,
steady-state run time, peak memory and the numeric difference from eager.
See ``python -m benchmarks -h`` for the CLI and :mod:`benchmarks.report` for
the CSV / Markdown / PNG outputs.
"""
from __future__ import annotations

import copy
import math
import statistics
import time
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from . import instrument, measure
from .methods import EqsatOptions, Method, make_methods
from .zoo import MODELS

NAN = math.nan


@dataclass
class BenchConfig:
    """One harness run. Every combination of models x scales x modes x methods
    becomes a row; ``eqsat_variants`` expand the optimus_eqsat method."""

    models: list[str]
    methods: list[str] = field(default_factory=lambda: ["eager", "inductor"])
    modes: list[str] = field(default_factory=lambda: ["inference"])
    scales: list[int] = field(default_factory=lambda: [1])
    eqsat_variants: list[EqsatOptions] = field(default_factory=lambda: [EqsatOptions()])
    device: str = "cpu"
    # torch intra-op threads; None keeps torch's default. On a shared CPU, 1 avoids
    # OpenMP barrier stalls that inflate eager times by 100x under oversubscription.
    threads: int | None = None
    batch: int = 32
    seed: int = 0
    warmup: int = 3
    repeats: int = 20
    # Compile from scratch each time: cache hits would make compile times meaningless.
    disable_caches: bool = True
    progress: bool = True

    def cases(self) -> Iterator[tuple[str, int, str, Method]]:
        for name in self.models:
            if name not in MODELS:
                raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
        methods = make_methods(self.methods, self.eqsat_variants)
        for name in self.models:
            for scale in self.scales:
                for mode in self.modes:
                    if mode not in ("inference", "training"):
                        raise ValueError(f"unknown mode {mode!r}")
                    if mode == "training" and not MODELS[name].has_training:
                        continue
                    for method in methods:
                        yield name, scale, mode, method


@dataclass
class Reference:
    """Eager results for one (model, scale, mode): the yardstick for every method."""

    model: torch.nn.Module  # pristine weights; each method runs on a deep copy
    inputs: tuple[torch.Tensor, ...]
    outputs: measure.Outputs
    grads: list[torch.Tensor | None]


def _reference(name: str, scale: int, training: bool, config: BenchConfig) -> Reference:
    spec = MODELS[name]
    model = spec.build(scale=scale, seed=config.seed).to(config.device).train(training)
    inputs = tuple(x.to(config.device) for x in spec.inputs(config.batch, config.seed, scale))
    work = copy.deepcopy(model)
    outputs = [o.detach().clone() for o in measure.make_step(work, work, inputs, training)()]
    grads = measure.gradients(work) if training else []
    return Reference(model, inputs, outputs, grads)


def _trace_only(model: torch.nn.Module, inputs: tuple, record: instrument.CompileRecord) -> None:
    """Let Dynamo capture the graph for an eager row (graph size, predictions)."""

    def capture(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        record.observe_input(gm, example_inputs)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=capture)(*inputs)
    torch._dynamo.reset()


def _run_case(method: Method, ref: Reference, training: bool, config: BenchConfig) -> dict[str, Any]:
    """Compile (if any), run, measure; the fields of one row."""
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    model = copy.deepcopy(ref.model)
    record = instrument.CompileRecord(profile=_pred_profile(method, config))
    patch = dict(method.inductor_config)
    if config.disable_caches:
        patch["force_disable_caches"] = True
    torch._dynamo.reset()
    codes: list[str] = []
    with inductor_config.patch(patch), instrument.observe_optimizers(record, method.observe_pre_grad):
        fn = method.prepare(model, record)
        step = measure.make_step(fn, model, ref.inputs, training)
        start = time.perf_counter()
        if method.compiled:
            outputs, codes = run_and_get_code(step)
        else:
            outputs = step()
        measure.sync(config.device)
        first_step_s = time.perf_counter() - start
        grads = measure.gradients(model) if training else []
        row: dict[str, Any] = {
            "max_abs_diff_out": measure.max_abs_diff(outputs, ref.outputs),
            "max_abs_diff_grad": measure.max_abs_diff(grads, ref.grads) if training else NAN,
        }
        times = measure.time_step(step, config.device, config.warmup, config.repeats)
        peak_mb, mem_source = measure.peak_memory_mb(step, config.device)
    if not method.compiled:
        _trace_only(model, ref.inputs, record)
    record.finish()
    generated, extern = instrument.count_kernels(codes) if method.compiled else (NAN, NAN)
    kinds = instrument.kernel_kinds(codes, generated, extern) if method.compiled else {}
    row.update(
        graphs=record.graphs,
        fx_nodes=record.fx_nodes,
        pred_launches_dynamo=record.pred_launches_dynamo,
        pred_launches=record.pred_launches,
        inductor_generated=generated,
        inductor_extern=extern,
        inductor_launches=generated + extern,
        optimizer_s=record.optimizer_s if method.name == "optimus_eqsat" else NAN,
        inductor_passes_s=record.inductor_passes_s if method.compiled else NAN,
        # The compiling first step, less our instrumentation; includes one run.
        compile_s=first_step_s - record.instrument_s if method.compiled else NAN,
        run_ms=statistics.median(times),
        run_ms_min=min(times),
        peak_mem_mb=peak_mb,
        mem_source=mem_source,
        emitted_kinds=_kinds_text(kinds),
        pred_kinds=_kinds_text(record.pred_kinds),
        pred_profile=record.profile,
        **(record.eqsat_summary() if method.name == "optimus_eqsat" else {}),
    )
    return row


def _pred_profile(method: Method, config: BenchConfig) -> str:
    """The profile for cost-model predictions: the ablation's, else the device's."""
    if method.eqsat is not None and method.eqsat.profile:
        return method.eqsat.profile
    return instrument.default_profile(config.device)


def _kinds_text(kinds: dict[str, int]) -> str:
    """``kind=count;...`` sorted by kind (a CSV-friendly Counter)."""
    return ";".join(f"{k}={v}" for k, v in sorted(kinds.items()) if v)


def run(config: BenchConfig) -> list[dict[str, Any]]:
    """Run every case; a failing case becomes a row with ``error`` set."""
    cases = list(config.cases())
    # force_disable_caches makes Dynamo warn once per compile; it is intended here.
    warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")
    if config.threads:
        torch.set_num_threads(config.threads)
    rows: list[dict[str, Any]] = []
    refs: dict[tuple[str, int, str], Reference] = {}
    bar = _progress(cases, config.progress)
    for name, scale, mode, method in bar:
        label = f"{name}/s{scale}/{mode}/{method.name}"
        if hasattr(bar, "set_description"):
            bar.set_description(label)
        training = mode == "training"
        row: dict[str, Any] = {
            "model": name,
            "scale": scale,
            "batch": config.batch,
            "mode": mode,
            "method": method.name,
            **(method.eqsat or EqsatOptions()).label(),
            "device": config.device,
            "threads": torch.get_num_threads(),
            "error": "",
        }
        try:
            key = (name, scale, mode)
            if key not in refs:
                refs.clear()  # one reference alive at a time: bounded memory
                refs[key] = _reference(name, scale, training, config)
            row.update(_run_case(method, refs[key], training, config))
        except Exception as exc:  # a broken method must not stop the sweep
            row["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            row["traceback"] = traceback.format_exc(limit=3)
        finally:
            torch._dynamo.reset()
        rows.append(row)
    _add_ratios(rows)
    return rows


def _progress(cases: list, enabled: bool) -> Any:
    if not enabled:
        return cases
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return cases
    return tqdm(cases, unit="case")


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """run_ms and launch ratios to Inductor's default on the same (model, scale, mode)."""
    base = {
        (r["model"], r["scale"], r["mode"]): r
        for r in rows
        if r["method"] == "inductor" and not r["error"]
    }
    for r in rows:
        b = base.get((r["model"], r["scale"], r["mode"]))
        r["run_ratio_vs_inductor"] = _ratio(r.get("run_ms"), b and b.get("run_ms"))
        r["launch_ratio_vs_inductor"] = _ratio(
            r.get("inductor_launches"), b and b.get("inductor_launches")
        )


def _ratio(a: Any, b: Any) -> float:
    try:
        return float(a) / float(b)
    except (TypeError, ValueError, ZeroDivisionError):
        return NAN
