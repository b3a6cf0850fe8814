"""The ``torch.compile`` backend: optimize Dynamo's graph, then hand it to Inductor.

Registered as ``optimus_eqsat`` through the ``torch_dynamo_backends`` entry
point, so ``torch.compile(model, backend="optimus_eqsat")`` works without
importing this package. The optimization runs on the pre-autograd graph, so
training works: AOTAutograd inside Inductor differentiates the optimized graph.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import torch
import torch.fx

from .api import OptimizeOptions, optimize_graph
from .inductor_compat import first_line, is_dynamo_signal

log = logging.getLogger("optimus_eqsat")


def make_backend(**options: Any) -> Callable[[torch.fx.GraphModule, Sequence[Any]], Callable]:
    """A backend with :func:`optimize_graph` options, e.g. ``make_backend(extractor="greedy")``.

    ``inductor=False`` returns the optimized GraphModule itself (runs eagerly),
    which is handy for debugging rewrites without compiling.
    """
    use_inductor = options.pop("inductor", True)
    options.setdefault("raise_on_error", False)  # never crash inside a user's compile
    # A caller's mistake (an unknown option, a missing or broken rule file) is an error
    # here, when the backend is made, not later inside the user's compile.
    OptimizeOptions.from_kwargs(**options)

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        optimized = optimize_graph(gm, example_inputs, **options)
        report = optimized.meta.get("optimus_eqsat")
        if report is not None:
            log.info("optimus_eqsat backend:\n%s", report.summary())
            backend.reports.append(report)
        if not use_inductor:
            return optimized
        from torch._inductor.compile_fx import compile_fx

        if report is None or report.fell_back:
            return compile_fx(gm, example_inputs)
        try:
            return compile_fx(optimized, example_inputs)
        except Exception as exc:
            if is_dynamo_signal(exc):
                raise  # Dynamo restarts the frame (e.g. to tensorify a scalar) and calls us again
            # Inductor's own passes can trip on shapes they do not expect (seen: its
            # attention-fusion pattern on a folded q/k/v permute). Never fail the user's
            # compile for it: compile the graph Dynamo gave us instead.
            log.warning("optimus_eqsat: Inductor failed on the optimized graph (%s); compiling the original",
                        first_line(exc))
            report.fell_back, report.fallback_reason = True, f"Inductor: {type(exc).__name__}: {exc}"[:500]
            return compile_fx(gm, example_inputs)

    backend.reports = []  # type: ignore[attr-defined]
    return backend


def optimus_eqsat_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """The default backend (entry point ``optimus_eqsat``)."""
    return _DEFAULT(gm, example_inputs)


_DEFAULT = make_backend()
