"""The research harness: every model x scale x batch x mode x threads is a case,
and every method of a case is compiled, checked and timed side by side.

A case runs in three phases, all methods alive in one process, each on its own
deep copy of the model:

1. compile: each method's first (compiling) step with Inductor caches disabled
   (cold compile time), its output code (kernel launches) and the numeric
   difference from eager;
2. settle: peak memory of a step and a second numeric check on a steady-state
   step (a CUDA graph replay for the cudagraph methods);
3. time: interleaved rounds (:mod:`benchmarks.rounds`), step time as the median
   over rounds, its spread, and the ratio to Inductor's default paired per round.

A method that fails in any phase becomes a row with ``error`` set; the others
go on. See ``python -m benchmarks -h`` for the CLI and :mod:`benchmarks.report`
for the outputs.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import math
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks import instrument, measure, stats
from benchmarks.columns import kinds_text
from benchmarks.methods import BASELINE, EqsatOptions, Method, default_methods, make_methods
from benchmarks.rounds import RoundPlan, RoundsResult, run_rounds
from benchmarks.zoo import ALL_MODELS, ModelSpec

NAN = math.nan
# torch's own intra-op thread count at import, before any case changes it: "all" threads.
ALL_THREADS = torch.get_num_threads()


@dataclass(frozen=True)
class Case:
    """One set of conditions under which every method is compared."""

    model: str
    scale: int
    batch: int
    mode: str
    threads: int
    device: str
    rows: int | None = None  # rows per embedding table; None: the zoo model's own

    @property
    def training(self) -> bool:
        return self.mode == "training"

    def spec(self) -> ModelSpec:
        spec = ALL_MODELS[self.model]
        return spec.with_rows(self.rows) if self.rows and spec.rows else spec

    def labels(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "scale": self.scale,
            "batch": self.batch,
            "mode": self.mode,
            "threads": self.threads,
            "device": self.device,
            "rows": self.spec().rows,
        }

    def __str__(self) -> str:
        return f"{self.model}/s{self.scale}/b{self.batch}/{self.mode}/t{self.threads}"


@dataclass
class BenchConfig:
    """One harness run: every combination of models x scales x batches x modes x
    threads is a :class:`Case`; ``eqsat_variants`` expand the optimus_eqsat methods.
    ``methods`` None: every method the device can run. ``threads`` None: torch's
    default (all cores)."""

    models: list[str]
    methods: list[str] | None = None
    modes: list[str] = field(default_factory=lambda: ["inference"])
    scales: list[int] = field(default_factory=lambda: [1])
    batches: list[int] = field(default_factory=lambda: [32])
    threads: list[int | None] = field(default_factory=lambda: [None])
    eqsat_variants: list[EqsatOptions] = field(default_factory=lambda: [EqsatOptions()])
    device: str = "cpu"
    rows: int | None = None  # overrides the rows per table of models that have tables
    seed: int = 0
    plan: RoundPlan = field(default_factory=RoundPlan)
    # Compile from scratch each time: cache hits would make compile times meaningless.
    disable_caches: bool = True
    progress: bool = True
    clock: str = "wall"  # "cpu": process CPU time (one thread on a shared CPU; see measure.timed_step)

    def method_list(self) -> list[Method]:
        return make_methods(self.methods or default_methods(self.device), self.eqsat_variants, self.device)

    def cases(self) -> Iterator[Case]:
        for name in self.models:
            if name not in ALL_MODELS:
                raise ValueError(f"unknown model {name!r}; choose from {', '.join(ALL_MODELS)}")
        for mode in self.modes:
            if mode not in ("inference", "training"):
                raise ValueError(f"unknown mode {mode!r}")
        for name in self.models:
            for scale in self.scales:
                for batch in self.batches:
                    for mode in self.modes:
                        if mode == "training" and not ALL_MODELS[name].has_training:
                            continue
                        for threads in self.threads:
                            yield Case(name, scale, batch, mode, threads or ALL_THREADS, self.device, self.rows)


@dataclass
class Reference:
    """Eager results for one case: the yardstick for every method."""

    model: torch.nn.Module  # pristine weights; each method runs on a deep copy
    inputs: tuple[torch.Tensor, ...]
    outputs: measure.Outputs
    grads: list[torch.Tensor | None]


@dataclass
class Compiled:
    """A method ready to time: its model copy, its step and what its compile recorded."""

    method: Method
    model: torch.nn.Module
    step: Callable[[], measure.Outputs]
    record: instrument.CompileRecord
    graphs_after_compile: int


def _reference(case: Case, seed: int) -> Reference:
    spec = case.spec()
    model = spec.build(scale=case.scale, seed=seed).to(case.device).train(case.training)
    inputs = tuple(x.to(case.device) for x in spec.inputs(case.batch, seed, case.scale))
    work = copy.deepcopy(model)
    outputs = [o.detach().clone() for o in measure.make_step(work, work, inputs, case.training)()]
    grads = measure.gradients(work) if case.training else []
    return Reference(model, inputs, outputs, grads)


def _trace_only(model: torch.nn.Module, inputs: tuple, record: instrument.CompileRecord) -> None:
    """Let Dynamo capture the graph for an eager row (graph size, predictions).
    No Dynamo reset: the other methods of the case stay compiled."""

    def capture(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        record.observe_input(gm, example_inputs)
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=capture)(*inputs)


def _compile(method: Method, ref: Reference, case: Case, config: BenchConfig, row: dict[str, Any]) -> Compiled:
    """Phase 1: the compiling first step, its code and numerics; fills ``row``."""
    from torch._dynamo.utils import counters
    from torch._inductor import config as inductor_config

    model = copy.deepcopy(ref.model)
    record = instrument.CompileRecord(profile=_pred_profile(method, case), training=case.training)
    patch = dict(method.inductor_config)
    if config.disable_caches:
        patch["force_disable_caches"] = True
    skips_before = counters["inductor"]["cudagraph_skips"]
    with (
        inductor_config.patch(patch),
        instrument.observe_optimizers(record, method.observe_pre_grad),
        instrument.capture_output_code() as codes,
    ):
        fn = method.prepare(model, record)
        step = measure.make_step(fn, model, ref.inputs, case.training)
        start = time.perf_counter()
        outputs = step()
        measure.sync(case.device)
        first_step_s = time.perf_counter() - start
        row["max_abs_diff_out"] = measure.max_abs_diff(outputs, ref.outputs)
        row["max_abs_diff_grad"] = measure.max_abs_diff(measure.gradients(model), ref.grads) if case.training else NAN
    if not method.compiled:
        _trace_only(model, ref.inputs, record)
    elif record.graphs == 0:
        raise RuntimeError("Dynamo compiled no graph (recompile limit hit? the model ran eagerly)")
    record.finish()
    generated, extern = instrument.count_kernels(codes) if method.compiled else (NAN, NAN)
    kinds = instrument.kernel_kinds(codes, generated, extern) if method.compiled else {}
    row.update(
        graphs=record.graphs,
        fx_nodes=record.fx_nodes,
        pred_launches_dynamo=record.pred_launches_dynamo,
        pred_launches=record.pred_launches,
        pred_step_ms_dynamo=record.pred_step_s_dynamo * 1e3,
        pred_step_ms=record.pred_step_s * 1e3,
        inductor_generated=generated,
        inductor_extern=extern,
        inductor_launches=generated + extern,
        optimizer_s=record.optimizer_s if method.uses_eqsat else NAN,
        inductor_passes_s=record.inductor_passes_s if method.compiled else NAN,
        # The compiling first step (cold caches), less our instrumentation; includes one run.
        compile_s=first_step_s - record.instrument_s if method.compiled else NAN,
        cudagraph_skips=counters["inductor"]["cudagraph_skips"] - skips_before if method.cudagraphs else NAN,
        emitted_kinds=kinds_text(kinds),
        pred_kinds=kinds_text(record.pred_kinds),
        pred_profile=record.profile,
        **(record.eqsat_summary() if method.uses_eqsat else {}),
    )
    return Compiled(method, model, step, record, record.graphs)


def _settle(c: Compiled, ref: Reference, case: Case, row: dict[str, Any]) -> None:
    """Phase 2: peak memory of a step, numerics of a steady-state step, CUDA graph replays."""
    cuda = case.device.startswith("cuda")
    if case.training:
        c.model.zero_grad(set_to_none=True)  # the step's own gradients count towards its peak
    # On CUDA, three steps: a CUDA graph method warms up, records, then replays.
    row["peak_mem_mb"], row["mem_source"] = measure.peak_memory_mb(c.step, case.device, steps=3 if cuda else 1)
    row["state_mb"] = measure.model_state_mb(c.model)
    row["peak_total_mb"] = row["state_mb"] + row["peak_mem_mb"]
    outputs = c.step()
    row["max_abs_diff_out"] = max(row["max_abs_diff_out"], measure.max_abs_diff(outputs, ref.outputs))
    if case.training:
        grads = measure.gradients(c.model)
        row["max_abs_diff_grad"] = max(row["max_abs_diff_grad"], measure.max_abs_diff(grads, ref.grads))
    if cuda and c.method.compiled:
        row["cuda_graph_launches"] = measure.cuda_graph_launches(c.step)


def _timing_fields(label: str, c: Compiled, result: RoundsResult, plan: RoundPlan) -> dict[str, Any]:
    """Phase 3's columns for one method."""
    times = result.round_ms.get(label, [])
    run = stats.spread(times)
    ratio = stats.spread(result.ratios(BASELINE).get(label, []))
    return {
        "run_ms": run.median,
        "run_ms_p10": run.p10,
        "run_ms_p90": run.p90,
        "run_ms_min": min(times, default=NAN),
        "rounds": run.n,
        "steps_per_round": result.steps.get(label, plan.steps),
        "run_ratio_vs_inductor": ratio.median,
        "run_ratio_p10": ratio.p10,
        "run_ratio_p90": ratio.p90,
        "stable": label not in result.unstable and label not in result.errors,
        "timing_stop": result.stop,
        "recompiles": c.record.graphs - c.graphs_after_compile,
    }


def run_case(case: Case, methods: list[Method], config: BenchConfig, say: Any = None) -> list[dict[str, Any]]:
    """Every method of one case, compiled, settled and timed together; one row each."""
    torch.set_num_threads(case.threads)
    torch._dynamo.reset()
    rows = {m.label: _base_row(case, m) for m in methods}
    say = say or (lambda _text: None)
    live: dict[str, Compiled] = {}
    # Every method's graph lives on the same forward code object: room for all of them.
    limit = max(torch._dynamo.config.recompile_limit, 2 * len(methods) + 2)
    try:
        with torch._dynamo.config.patch(recompile_limit=limit):
            ref = _reference(case, config.seed)
            for m in methods:
                say(f"{case}: compile {m.label}")
                with _row_errors(rows[m.label]):
                    live[m.label] = _compile(m, ref, case, config, rows[m.label])
            for label, c in list(live.items()):
                with _row_errors(rows[label]):
                    _settle(c, ref, case, rows[label])
                if rows[label]["error"]:
                    del live[label]
            say(f"{case}: timing {len(live)} methods")
            steps = {label: measure.timed_step(c.step, case.device, config.clock) for label, c in live.items()}
            result = _without_gc(run_rounds, steps, config.plan, baseline=BASELINE)
            for label, c in live.items():
                row = rows[label]
                row.update(_timing_fields(label, c, result, config.plan))
                if label in result.errors:
                    row["error"] = result.errors[label]
                elif row["recompiles"]:
                    # The recompiled code ran without the method's settings (they are
                    # patched around the compiling step only): its times are not the method's.
                    row["error"] = f"Dynamo recompiled {row['recompiles']} time(s) after the compiling step"
    except Exception as exc:  # beyond one method (the eager reference, say): every row says so
        for row in rows.values():
            row["error"] = row["error"] or _error_text(exc)
    finally:
        live.clear()
        _release(case.device)
    out = list(rows.values())
    _add_case_ratios(out)
    return out


def run(config: BenchConfig) -> list[dict[str, Any]]:
    """Run every case; a failing method becomes a row with ``error`` set."""
    methods = config.method_list()
    cases = list(config.cases())
    # force_disable_caches makes Dynamo warn once per compile; it is intended here.
    warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")
    bar = _progress(cases, config.progress)
    say = bar.set_description if hasattr(bar, "set_description") else None
    _warm_up_compilers(methods, config.device)
    rows: list[dict[str, Any]] = []
    threads = torch.get_num_threads()
    try:
        for case in bar:
            rows.extend(run_case(case, methods, config, say))
    finally:
        torch.set_num_threads(threads)
    return rows


def _warm_up_compilers(methods: list[Method], device: str) -> None:
    """Compile a tiny model, forward and backward, with Inductor and with each
    optimus_eqsat variant once per run, so one-time costs of the process
    (imports, compiler start-up) do not land on the first method's compile_s."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    makers: list[Callable[[], Callable]] = [lambda: compile_fx] if any(m.compiled for m in methods) else []
    makers += [m.inner_backend for m in methods if m.uses_eqsat][:1]
    tiny = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).to(device)
    x = torch.randn(4, 8, device=device)
    for make in makers:
        torch._dynamo.reset()
        try:
            with inductor_config.patch(force_disable_caches=True):
                torch.compile(copy.deepcopy(tiny), backend=make())(x).sum().backward()
        except Exception:  # a broken backend shows in its own rows
            pass
    torch._dynamo.reset()


def _base_row(case: Case, method: Method) -> dict[str, Any]:
    return {**case.labels(), "method": method.name, **(method.eqsat or EqsatOptions()).label(), "error": ""}


@contextlib.contextmanager
def _row_errors(row: dict[str, Any]) -> Iterator[None]:
    """An exception inside becomes the row's error (and goes no further)."""
    try:
        yield
    except Exception as exc:  # a broken method must not stop the others
        row["error"] = _error_text(exc)
        row["traceback"] = traceback.format_exc(limit=3)


def _without_gc(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn`` with Python's cyclic garbage collector paused, as ``timeit`` does:
    a collection landing in one method's turn would bill it for everyone's garbage."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        return fn(*args, **kwargs)
    finally:
        if enabled:
            gc.enable()


def _error_text(exc: BaseException) -> str:
    return (f"{type(exc).__name__}: {exc}".splitlines() or [""])[0][:300]


def _release(device: str) -> None:
    """Drop the case's compiled code and CUDA graph pools before the next case."""
    torch._dynamo.reset()
    if device.startswith("cuda"):
        from torch._inductor import cudagraph_trees

        cudagraph_trees.reset_cudagraph_trees()
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def _pred_profile(method: Method, case: Case) -> str:
    """The profile for cost-model predictions: the ablation's, else the device's."""
    if method.eqsat is not None and method.eqsat.profile:
        return method.eqsat.profile
    return instrument.default_profile(case.device)


def _progress(cases: list, enabled: bool) -> Any:
    if not enabled:
        return cases
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return cases
    return tqdm(cases, unit="case")


def _add_case_ratios(rows: list[dict[str, Any]]) -> None:
    """Launch, peak-memory and compile-time ratios to Inductor's default in the
    same case (step time has its own paired ratio from the rounds)."""
    base = next((r for r in rows if r["method"] == BASELINE and not r["error"]), {})
    for r in rows:
        for column, ratio in (
            ("inductor_launches", "launch_ratio_vs_inductor"),
            ("peak_mem_mb", "peak_mem_ratio_vs_inductor"),
            ("peak_total_mb", "peak_total_ratio_vs_inductor"),
            ("compile_s", "compile_ratio_vs_inductor"),
        ):
            r[ratio] = _ratio(r.get(column), base.get(column))
        r.setdefault("run_ratio_vs_inductor", NAN)


def _ratio(a: Any, b: Any) -> float:
    try:
        return float(a) / float(b)
    except (TypeError, ValueError, ZeroDivisionError):
        return NAN
