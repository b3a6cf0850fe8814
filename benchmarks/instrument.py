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

import torch

NAN = math.nan


@dataclass
class CompileRecord:
    """What one method's compile left behind (summed over Dynamo graphs)."""

    graphs: int = 0
    fx_nodes: int = 0
    pred_launches_dynamo: float = 0.0
    pred_launches: float = 0.0  # of the graph handed to Inductor, after the method's passes
    pred_kinds: Counter = field(default_factory=Counter)
    optimizer_s: float = 0.0  # optimus_eqsat.optimize_graph
    inductor_passes_s: float = 0.0  # Inductor's pre/post-grad FX passes (Optimus passes run there)
    instrument_s: float = 0.0  # our own bookkeeping, subtracted from compile time
    optimized_graphs: int = 0

    def observe_input(self, gm: torch.fx.GraphModule) -> None:
        """Record a Dynamo graph before any backend touches it (passes mutate in place)."""
        start = time.perf_counter()
        self.graphs += 1
        self.fx_nodes += len(gm.graph.nodes)
        self.pred_launches_dynamo += predicted_launches(gm)
        self.instrument_s += time.perf_counter() - start

    def observe_output(self, gm: torch.fx.GraphModule) -> None:
        """Record the graph a method's optimizer hands on to the rest of Inductor."""
        start = time.perf_counter()
        self.optimized_graphs += 1
        self.pred_launches += predicted_launches(gm)
        self.pred_kinds.update(predicted_kinds(gm))
        self.instrument_s += time.perf_counter() - start

    def finish(self) -> None:
        """Graphs no optimizer rewrote count as handed on unchanged."""
        if self.optimized_graphs == 0:
            self.pred_launches = self.pred_launches_dynamo


# --- predictions from the cost model (optional) -------------------------------


def _fx_cost() -> Any | None:
    try:
        from optimus_eqsat.extract import fx_cost
    except Exception:  # not written yet, or broken mid-edit
        return None
    return fx_cost


def predicted_launches(gm: torch.fx.GraphModule) -> float:
    """``fx_cost.predicted_launches(gm)``, or NaN if unavailable or failing."""
    fx_cost = _fx_cost()
    if fx_cost is None or not hasattr(fx_cost, "predicted_launches"):
        return NAN
    try:
        return float(fx_cost.predicted_launches(gm))
    except Exception:
        return NAN


def predicted_kinds(gm: torch.fx.GraphModule) -> Counter:
    """Predicted kernels by kind via ``fx_cost.predict_kernels`` (empty if absent).

    Accepts a mapping kind -> count, or an iterable of kernels that carry a
    ``kind`` attribute/key or are kind strings themselves.
    """
    fx_cost = _fx_cost()
    if fx_cost is None or not hasattr(fx_cost, "predict_kernels"):
        return Counter()
    try:
        kernels = fx_cost.predict_kernels(gm)
    except Exception:
        return Counter()
    if isinstance(kernels, dict):
        return Counter({str(k): int(v) for k, v in kernels.items()})
    kinds: Counter = Counter()
    for kernel in kernels:
        kind = getattr(kernel, "kind", None)
        if kind is None and isinstance(kernel, dict):
            kind = kernel.get("kind")
        kinds[str(kind if kind is not None else kernel)] += 1
    return kinds


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
    """Every loaded optimus_eqsat module that binds the name ``optimize_graph``
    (the backend may have imported it under that name)."""
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

    with contextlib.ExitStack() as stack:
        stack.enter_context(_wrapped(_optimize_graph_targets(), _timed(record, "optimizer_s", True)))
        stack.enter_context(
            _wrapped([(compile_fx, "pre_grad_passes")], _timed(record, "inductor_passes_s", observe_pre_grad))
        )
        stack.enter_context(
            _wrapped([(compile_fx, "post_grad_passes")], _timed(record, "inductor_passes_s", False))
        )
        yield


# --- counting the kernels Inductor emitted -------------------------------------

_EXTERN = re.compile(r"\bextern_kernels\.(\w+)\(")
_GENERATED_DEF = re.compile(r"^(\w+)\s*=\s*async_compile\.(?:cpp_pybinding|cpp|triton)\(", re.M)


def _fallback_count(code: str) -> tuple[int, int]:
    """(generated, extern) for one output-code module, used only when
    ``optimus_eqsat.inductor_count`` is missing: kernel definitions and
    ``extern_kernels.*`` calls."""
    return len(_GENERATED_DEF.findall(code)), len(_EXTERN.findall(code))


def count_kernels(codes: list[str]) -> tuple[int, int]:
    """(generated, extern) kernel launches summed over output-code modules."""
    try:
        from optimus_eqsat.inductor_count import count_kernels_in_code
    except Exception:
        count_kernels_in_code = _fallback_count
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
