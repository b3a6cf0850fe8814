"""Hooks that observe one compile: the Dynamo graphs, time spent in graph
optimizers, predicted and emitted kernel counts.

Everything from the optimus_eqsat package is imported lazily and optional: a
piece that does not exist yet yields NaN (or an empty dict), never an error,
so the harness runs while the library is being written.
"""

from __future__ import annotations

import contextlib
import math
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch

NAN = math.nan


@dataclass
class CompileRecord:
    """What one method's compile left behind (summed over Dynamo graphs).

    ``profile`` is the cost-model device profile used for predictions.
    """

    profile: str = "cpu"
    training: bool = False  # predictions price the backward too
    graphs: int = 0
    fx_nodes: int = 0
    pred_launches_dynamo: float = 0.0
    pred_launches: float = 0.0  # of the graph handed to Inductor, after the method's passes
    pred_step_s_dynamo: float = 0.0  # predicted step time (fx_cost.predicted_step_time) of Dynamo's graph
    pred_step_s: float = 0.0  # ... of the graph handed to Inductor
    pred_kinds: Counter = field(default_factory=Counter)
    optimizer_s: float = 0.0  # optimus_eqsat.optimize_graph
    inductor_passes_s: float = 0.0  # Inductor's pre/post-grad FX passes (Optimus passes run there)
    instrument_s: float = 0.0  # our own bookkeeping, subtracted from compile time
    optimized_graphs: int = 0
    eqsat_reports: list = field(default_factory=list)  # OptimizeReport per graph, from gm.meta
    backend: Any = None  # the method's inner backend; optimus_eqsat's keeps ``reports``
    _dynamo_kinds: Counter = field(default_factory=Counter)

    def observe_input(self, gm: torch.fx.GraphModule, example_inputs: Any = None) -> None:
        """Record a Dynamo graph before any backend touches it (passes mutate in place)."""
        start = time.perf_counter()
        self.graphs += 1
        self.fx_nodes += len(gm.graph.nodes)
        launches, kinds = predict(gm, example_inputs, self.profile)
        self.pred_launches_dynamo += launches
        self.pred_step_s_dynamo += predict_step(gm, example_inputs, self.profile, self.training)
        self._dynamo_kinds.update(kinds)
        self.instrument_s += time.perf_counter() - start

    def observe_output(self, gm: torch.fx.GraphModule) -> None:
        """Record the graph a method's optimizer hands on to the rest of Inductor."""
        start = time.perf_counter()
        self.optimized_graphs += 1
        launches, kinds = predict(gm, None, self.profile)
        self.pred_launches += launches
        self.pred_step_s += predict_step(gm, None, self.profile, self.training)
        self.pred_kinds.update(kinds)
        report = gm.meta.get("optimus_eqsat") if hasattr(gm, "meta") else None
        if report is not None:
            self.eqsat_reports.append(report)
        self.instrument_s += time.perf_counter() - start

    def finish(self) -> None:
        """Graphs no optimizer rewrote count as handed on unchanged."""
        if self.optimized_graphs == 0:
            self.pred_launches = self.pred_launches_dynamo
            self.pred_step_s = self.pred_step_s_dynamo
            self.pred_kinds = Counter(self._dynamo_kinds)

    def reports(self) -> list:
        """OptimizeReports of this compile: the backend's ``reports`` (the
        documented way), else those found on the optimized graphs' meta."""
        reports = getattr(self.backend, "reports", None)
        return list(reports) if reports is not None else list(self.eqsat_reports)

    def eqsat_summary(self) -> dict[str, Any]:
        """A few OptimizeReport fields over graphs, read defensively (the report
        grows): texts joined with ";", sizes summed."""
        reports = self.reports()

        def join(attr: str) -> str:
            return ";".join(str(getattr(r, attr, "")) for r in reports)

        def total(size: Callable[[Any], Any]) -> float:
            try:
                return float(sum(size(r) or 0 for r in reports)) if reports else NAN
            except (TypeError, ValueError):
                return NAN

        fell_back = any(getattr(r, "fell_back", False) for r in reports)
        return {
            "eqsat_stop": join("stop_reason"),
            "eqsat_extractor": join("extractor"),
            "eqsat_enodes": total(lambda r: getattr(r, "enodes", 0)),
            "eqsat_rules_fired": total(lambda r: sum((getattr(r, "rules_fired", None) or {}).values())),
            "eqsat_launches_before": total(lambda r: getattr(r, "launches_before", None)),
            "eqsat_launches_after": total(lambda r: getattr(r, "launches_after", None)),
            "eqsat_phase_s": total(lambda r: sum((getattr(r, "phase_seconds", None) or {}).values())),
            # the backend's measured choice: compiling the original and timing both (in compile_s)
            "eqsat_guard_s": total(lambda r: getattr(getattr(r, "measured", None), "overhead_s", 0.0)),
            "eqsat_kept": join_measured(reports),
            "eqsat_fell_back": join("fell_back"),
            "eqsat_fallback_reason": join("fallback_reason") if fell_back else "",
        }


# --- predictions from the cost model (optional) -------------------------------


def join_measured(reports: list) -> str:
    """Which program the backend's measured choice kept, per graph ("" when not measured)."""
    return ";".join(getattr(getattr(r, "measured", None), "kept", "") or "" for r in reports)


def _fx_cost() -> Any | None:
    try:
        from optimus_eqsat.extract import fx_cost
    except Exception:  # not written yet, or broken mid-edit
        return None
    return fx_cost


def default_profile(device: str) -> str:
    """The cost-model profile matching the device: "cpu", or the GPU by name."""
    if not device.startswith("cuda"):
        return "cpu"
    name = torch.cuda.get_device_name().lower() if torch.cuda.is_available() else ""
    for known in ("h200", "h100", "a100"):
        if known in name:
            return known
    return "h100"


def predict(gm: torch.fx.GraphModule, example_inputs: Any, profile: str) -> tuple[float, Counter]:
    """(predicted launches, launches by kernel kind) from ``fx_cost``.

    Uses ``predict_kernels`` when present (kinds from each kernel's ``kind``),
    else ``predicted_launches`` alone; (NaN, {}) if neither works.
    """
    fx_cost = _fx_cost()
    if fx_cost is None:
        return NAN, Counter()
    inputs = list(example_inputs) if example_inputs is not None else None
    if hasattr(fx_cost, "predict_kernels"):
        try:
            kernels = fx_cost.predict_kernels(gm, inputs, profile=profile)
            kinds = Counter(_kind_name(getattr(k, "kind", k)) for k in kernels)
            return float(len(kernels)), kinds
        except Exception:
            pass
    try:
        return float(fx_cost.predicted_launches(gm, inputs, profile=profile)), Counter()
    except Exception:
        return NAN, Counter()


def predict_step(gm: torch.fx.GraphModule, example_inputs: Any, profile: str, training: bool) -> float:
    """Predicted step seconds from ``fx_cost.predicted_step_time`` (NaN if it fails)."""
    fx_cost = _fx_cost()
    try:
        inputs = list(example_inputs) if example_inputs is not None else None
        return float(fx_cost.predicted_step_time(gm, inputs, profile, training=training))
    except Exception:
        return NAN


def _kind_name(kind: Any) -> str:
    return str(getattr(kind, "name", kind)).lower()


# --- timing the optimizers by wrapping their entry points ----------------------


@contextlib.contextmanager
def _wrapped(targets: list[tuple[Any, str]], around: Callable[[Callable], Callable]) -> Iterator[None]:
    """Temporarily replace ``module.attr`` with ``around(original)`` for each target."""
    saved = [(mod, attr, getattr(mod, attr)) for mod, attr in targets if hasattr(mod, attr)]
    try:
        for mod, attr, fn in saved:
            setattr(mod, attr, around(fn))
        yield
    finally:
        for mod, attr, fn in saved:
            setattr(mod, attr, fn)


def _result_graph(result: Any) -> torch.fx.GraphModule | None:
    """The GraphModule in an optimizer's result (itself, or a field of a report)."""
    if isinstance(result, torch.fx.GraphModule):
        return result
    for name in ("gm", "graph_module", "module", "optimized"):
        value = getattr(result, name, None)
        if isinstance(value, torch.fx.GraphModule):
            return value
    if isinstance(result, tuple) and result and isinstance(result[0], torch.fx.GraphModule):
        return result[0]
    return None


def _timed(record: CompileRecord, slot: str, observe: bool) -> Callable[[Callable], Callable]:
    def around(fn: Callable) -> Callable:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            setattr(record, slot, getattr(record, slot) + time.perf_counter() - start)
            graph = _result_graph(result) if observe else None
            if graph is not None:
                record.observe_output(graph)
            return result

        return wrapper

    return around


def _optimize_graph_targets() -> list[tuple[Any, str]]:
    """Every optimus_eqsat module that binds the name ``optimize_graph`` (the
    backend imports it under that name), after importing the backend."""
    try:
        import optimus_eqsat.backend  # noqa: F401  (so its binding gets wrapped too)
    except Exception:
        pass
    return [
        (mod, "optimize_graph")
        for name, mod in list(sys.modules.items())
        if mod is not None
        and (name == "optimus_eqsat" or name.startswith("optimus_eqsat."))
        and callable(getattr(mod, "optimize_graph", None))
    ]


@contextlib.contextmanager
def observe_optimizers(record: CompileRecord, observe_pre_grad: bool) -> Iterator[None]:
    """Time ``optimus_eqsat.optimize_graph`` and Inductor's pre/post-grad passes.

    With ``observe_pre_grad`` the graph returned by Inductor's pre-grad passes
    (where its Optimus passes run) is taken as the optimized graph.
    """
    from torch._inductor import compile_fx

    targets = _optimize_graph_targets()
    # The post-grad pass calls optimize_graph on Inductor's aten graphs (forward and
    # backward): timed, but not observed as the method's program, which the prediction of
    # the pre-grad graph (its backward priced) already stands for; counted too, they
    # doubled our predicted step.
    post_grad = [(mod, attr) for mod, attr in targets if mod.__name__.startswith("optimus_eqsat.postgrad")]
    pre_grad = [target for target in targets if target not in post_grad]
    with contextlib.ExitStack() as stack:
        stack.enter_context(_wrapped(pre_grad, _timed(record, "optimizer_s", True)))
        stack.enter_context(_wrapped(post_grad, _timed(record, "optimizer_s", False)))
        stack.enter_context(
            _wrapped([(compile_fx, "pre_grad_passes")], _timed(record, "inductor_passes_s", observe_pre_grad))
        )
        stack.enter_context(_wrapped([(compile_fx, "post_grad_passes")], _timed(record, "inductor_passes_s", False)))
        yield


# --- counting the kernels Inductor emitted -------------------------------------


@contextlib.contextmanager
def capture_output_code() -> Iterator[list[str]]:
    """Inductor's output code of every graph compiled inside, in order (each once).

    ``torch._inductor.utils.run_and_get_code`` does the same but resets Dynamo
    first, which would throw away the other methods of a case (they would
    recompile later without their settings).
    """
    from torch._inductor.graph import GraphLowering

    codes: list[str] = []

    def save_output_code(code: str) -> None:
        if code not in codes:
            codes.append(code)

    with mock.patch.object(GraphLowering, "save_output_code", save_output_code):
        yield codes


_EXTERN = re.compile(r"\bextern_kernels\.(\w+)\(")


def count_kernels(codes: list[str]) -> tuple[int, int]:
    """(generated, extern) kernel launches summed over output-code modules, by
    ``optimus_eqsat.inductor_count`` (the same parser the cost model is
    calibrated with; the harness compiles once and reuses that compile's code
    instead of calling ``count_inductor_kernels``, which compiles again)."""
    from optimus_eqsat.inductor_count import count_kernels_in_code

    generated = extern = 0
    for code in codes:
        g, e = count_kernels_in_code(code)
        generated, extern = generated + g, extern + e
    return generated, extern


def kernel_kinds(codes: list[str], generated: int, extern: int) -> Counter:
    """Emitted launches by kind: ``generated`` (Inductor's C++/Triton kernels),
    ``extern:<name>`` per extern_kernels call, ``extern:other`` for the rest of
    ``extern`` (aten fallbacks)."""
    kinds: Counter = Counter({"generated": generated})
    for code in codes:
        for name in _EXTERN.findall(code):
            kinds[f"extern:{name}"] += 1
    named = sum(v for k, v in kinds.items() if k.startswith("extern:"))
    kinds["extern:other"] = max(extern - named, 0)
    return kinds
