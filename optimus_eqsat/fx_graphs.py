"""Small facts about FX GraphModules that the pipeline and the explorer share:
op counts, whether shapes came as fake tensors, a fresh copy, the predicted cost."""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.fx

_OPS = ("call_function", "call_method", "call_module")


def op_count(gm: torch.fx.GraphModule) -> int:
    """FX call nodes (ops) of ``gm``: what the report counts before and after."""
    return sum(1 for n in gm.graph.nodes if n.op in _OPS)


def has_fake_meta(gm: torch.fx.GraphModule) -> bool:
    """Whether the inputs carry fake-tensor meta (Dynamo's ``example_value``, export's ``val``)."""
    return any("val" in n.meta or "example_value" in n.meta for n in gm.graph.nodes if n.op == "placeholder")


def copy_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A new GraphModule with a copy of ``gm``'s graph (the fallback result: the input is never returned)."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    graph._codegen = gm.graph._codegen
    return torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)


def predict(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None, objective: Any) -> tuple[int, float]:
    """Kernel launches and step seconds the fusion-aware cost model (fx_cost) predicts for
    ``gm`` under ``objective`` (an ``objective.Objective``: profile and mode). Frozen inference
    is predicted on the graph with its parameter-only work folded (extract/freezing.py); cached
    inference with the work the backend's parameter cache keeps folded (parameter_cache.py)."""
    from .extract.freezing import fold_parameters
    from .extract.fx_cost import predict_kernels, predicted_step_time
    from .parameter_cache import packable_nodes

    if objective.frozen and example_inputs is not None:
        gm = fold_parameters(gm, example_inputs)
    elif objective.cached and example_inputs is not None:
        gm = fold_parameters(gm, example_inputs, packable_nodes)
    launches = len(predict_kernels(gm, example_inputs, objective.profile))
    return launches, predicted_step_time(gm, example_inputs, objective.profile, objective.training)
