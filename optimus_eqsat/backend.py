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

from .api import optimize_graph

log = logging.getLogger("optimus_eqsat")


def make_backend(**options: Any) -> Callable[[torch.fx.GraphModule, Sequence[Any]], Callable]:
    """A backend with :func:`optimize_graph` options, e.g. ``make_backend(extractor="greedy")``.

    ``inductor=False`` returns the optimized GraphModule itself (runs eagerly),
    which is handy for debugging rewrites without compiling.
    """
    use_inductor = options.pop("inductor", True)
    options.setdefault("raise_on_error", False)  # never crash inside a user's compile

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        optimized = optimize_graph(gm, example_inputs, **options)
        report = optimized.meta.get("optimus_eqsat")
        if report is not None:
            log.info("optimus_eqsat backend:\n%s", report.summary())
            backend.reports.append(report)
        if not use_inductor:
            return optimized
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(optimized, example_inputs)

    backend.reports = []  # type: ignore[attr-defined]
    return backend


def optimus_eqsat_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """The default backend (entry point ``optimus_eqsat``)."""
    return _DEFAULT(gm, example_inputs)


_DEFAULT = make_backend()
