"""Batch norms and dropouts that ``torch.fx.symbolic_trace`` keeps module calls, written as the
functional calls Dynamo and ``torch.export`` trace them to.

``symbolic_trace`` records ``nn.BatchNorm1d`` and ``nn.Dropout`` as ``call_module`` nodes, and
its graphs have no fake-tensor meta; Dynamo and export inline the modules' forwards
(``num_batches_tracked.add_(1)`` and ``F.batch_norm``; ``F.dropout``) and carry meta. The
batch-norm decompositions and the dropouts' shared draws (:mod:`.decompose`,
:mod:`.dropout_draws`) read that functional form, and its meta, alone: in a traced model
every norm and dropout stayed one opaque call, which walled off each expert of a multi-task
MLP from the others, so ``optimize_graph(symbolic_trace(model))`` batched nothing a Dynamo
graph of the same model batches. :func:`functional_module_calls` rewrites such calls, on a
copy, as the module's forward would run them, and gives the copy fake-tensor meta from the
example inputs.

Left as module calls: subclasses (their forward may differ), a training norm with
``momentum=None`` (its factor ``1 / num_batches_tracked`` is read from a buffer at run
time, where Dynamo reads it once as a constant), and any norm whose input rank the module
rejects (its own check raises there; the functional op would not). Without example inputs
or meta for every placeholder, nothing is rewritten.

A written-out call runs as the module ran in the mode it had when the graph was optimized
(training: batch statistics and running-statistics updates, dropout on; eval: the running
statistics, dropout off), where the traced module call followed the module's ``training``
flag at each call. :func:`guard_written_out_modes` makes the optimized module raise when
its flags no longer match (``.eval()`` for a validation pass of a module optimized for
training) instead of silently running the other mode.
"""

from __future__ import annotations

import warnings
from typing import Any, cast

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from optimus_eqsat.fx_graphs import copy_module, module_at
from optimus_eqsat.fxvocab.meta import meta_value
from optimus_eqsat.rebuild import propagate_meta

__all__ = ["functional_module_calls", "guard_written_out_modes"]

_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def _inlinable(module: nn.Module) -> bool:
    """Whether a call of ``module`` is written out here (exact types only)."""
    if type(module) in _NORMS:
        norm: Any = module
        return not (norm.training and norm.track_running_stats and norm.momentum is None)
    return type(module) is nn.Dropout


def _inlinable_calls(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The module calls of ``gm`` that this module writes out."""
    return [n for n in gm.graph.nodes if n.op == "call_module" and _inlinable(gm.get_submodule(str(n.target)))]


def functional_module_calls(gm: torch.fx.GraphModule, example_inputs: Any = None) -> torch.fx.GraphModule:
    """``gm`` itself when it calls no batch norm or dropout module this rewrites (see the
    module docstring), or when no fake-tensor meta can be propagated through the rewritten
    graph; else a copy (sharing ``gm``'s parameters, buffers and submodules) where each such
    call is the functional form its forward runs, every node with ``meta["val"]``."""
    calls = _inlinable_calls(gm)
    if not calls or any(len(n.args) != 1 or n.kwargs for n in calls):
        return gm
    out = copy_module(gm)
    names = {c.name for c in calls}
    # buffers are read at the top, as Dynamo's inputs are: the norms' count increments are
    # merged into one op before the first of them (decompose.py), which must see every buffer
    top = next(n for n in out.graph.nodes if n.op != "placeholder")
    norm_inputs: list[tuple[nn.Module, torch.fx.Node]] = []
    for node in [n for n in out.graph.nodes if n.name in names]:
        module, x = out.get_submodule(str(node.target)), node.args[0]
        with out.graph.inserting_before(node):
            if type(module) is nn.Dropout:
                new = out.graph.call_function(F.dropout, (x, module.p, module.training, module.inplace))
            else:
                new = _batch_norm(out.graph, top, str(node.target), module, x)
                norm_inputs.append((module, cast(torch.fx.Node, x)))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        out.graph.erase_node(node)
    out.graph.lint()
    out.recompile()
    if not propagate_meta(out, example_inputs):  # (which keeps the modules' state as it was)
        return gm
    for module, x in norm_inputs:  # the module's own check of its input's rank
        try:
            module._check_input_dim(meta_value(x))  # type: ignore[operator]
        except (ValueError, TypeError, AttributeError):
            return gm
    return out


def _batch_norm(graph: torch.fx.Graph, top: torch.fx.Node, path: str, norm: Any, x: Any) -> torch.fx.Node:
    """``norm(x)`` as ``_BatchNorm.forward`` runs it: the count's increment in training, then
    ``F.batch_norm`` (whose running statistics are written in training); the module's
    parameters and buffers read before ``top``."""

    def attr(name: str) -> torch.fx.Node | None:
        if getattr(norm, name) is None:
            return None
        with graph.inserting_before(top):
            return graph.get_attr(f"{path}.{name}")

    if norm.training and norm.track_running_stats and norm.num_batches_tracked is not None:
        graph.call_method("add_", (attr("num_batches_tracked"), 1))
    factor = 0.0 if norm.momentum is None else norm.momentum
    training = norm.training or (norm.running_mean is None and norm.running_var is None)
    keep_stats = not norm.training or norm.track_running_stats
    stats = (attr("running_mean"), attr("running_var")) if keep_stats else (None, None)
    return graph.call_function(F.batch_norm, (x, *stats, attr("weight"), attr("bias"), training, factor, norm.eps))


def guard_written_out_modes(source: torch.fx.GraphModule, result: torch.fx.GraphModule) -> None:
    """Make ``result`` raise when ``.train()`` / ``.eval()`` change the mode of a module whose
    call this module wrote out (``source`` calls it, ``result`` no longer does). Each such
    module's path in ``result`` holds its ``training`` flag of then (a plain module where the
    graph left nothing there), and a node at the top of the graph checks those flags (so
    copies keep the check; Dynamo, export and a re-trace, a pickle's load among them, run it
    once on the flags of the moment). Recompiles ``result``."""
    called = {str(n.target) for n in result.graph.nodes if n.op == "call_module"}
    paths = sorted({str(n.target) for n in _inlinable_calls(source)} - called)
    if not paths:
        return
    flags = tuple(source.get_submodule(path).training for path in paths)
    for path, training in zip(paths, flags):
        module_at(result, path).training = training
    graph = result.graph
    with graph.inserting_before(next(n for n in graph.nodes if n.op != "placeholder")), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Attempted to insert a get_attr Node")  # (a flag: no tensor)
        now = tuple(graph.get_attr(f"{path}.training") for path in paths)
        graph.call_function(check_training_flags, (now, flags, tuple(paths)))
    result.recompile()


@torch.fx.node.has_side_effect
def check_training_flags(now: tuple[bool, ...], optimized: tuple[bool, ...], paths: tuple[str, ...]) -> None:
    """Raise where a module's ``training`` flag is not the one its graph was optimized for."""
    for flag, expected, path in zip(now, optimized, paths):
        if flag != expected:
            raise RuntimeError(
                f"this module was optimized with {path} in "
                f"{'training' if expected else 'eval'} mode, its batch norms and dropouts written "
                f"for that mode; it is now in {'training' if flag else 'eval'} mode. Optimize the "
                "graph traced in that mode too (optimize_graph(symbolic_trace(model.eval()), ...)) "
                "and call each in its mode."
            )
