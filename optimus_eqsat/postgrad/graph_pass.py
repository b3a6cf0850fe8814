"""The optimizer as an Inductor post-grad pass: forward and backward aten graphs, in place.

Inductor calls ``config.post_grad_custom_pre_pass`` once on the forward graph and
once on the backward graph of every compile (the inference graph alone under
no_grad), after AOTAutograd has made them functional aten and before its own
post-grad passes. We hook the *pre* pass, not the post pass: what we write then
goes through the same clean-ups as any AOTAutograd graph (no-op view removal,
Inductor's pattern passes, reinplacing), and we see the graph as AOTAutograd
made it, before Inductor's patterns fuse mm + bias or reorder it.

:class:`PostGradPass` runs :func:`optimize_aten_graph`: the graph, copied into a
GraphModule, goes through :func:`~optimus_eqsat.optimize_graph` with the same
language, rules, cost model and extractor as the pre-grad graph; a changed
program is retraced into functional aten (:mod:`.lowering`) and spliced into
Inductor's graph. Any failure leaves the graph as it was (logged); Dynamo's
restart signals pass through.

Its :meth:`~PostGradPass.uuid` keys Inductor's FX graph cache: a hash of this
package's source, rules and calibration files and of the options, so a cached
program is reused only when our pass would write the same graph.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

from optimus_eqsat.api import OptimizeOptions, optimize_graph
from optimus_eqsat.disk_cache import package_source_files
from optimus_eqsat.extract.cost_model import profile_for_inputs
from optimus_eqsat.fx_graphs import copy_module
from optimus_eqsat.inductor_compat import first_line, install_inplace_alias_fix, is_dynamo_signal
from optimus_eqsat.postgrad.lowering import fake_inputs, lower_to_aten, splice
from optimus_eqsat.report import OptimizeReport

log = logging.getLogger("optimus_eqsat")

__all__ = ["PostGradPass", "optimize_aten_graph", "graph_role", "source_files"]


def source_files(rule_files: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Every file whose content decides what the pass writes: the package's Python
    sources, rule files and calibration profiles (rewrites/ and extract/ included), and the
    user's rule files."""
    files = {str(path.resolve()) for _, path in package_source_files()}
    return tuple(sorted(files)) + tuple(str(Path(f).resolve()) for f in rule_files)


def graph_role(graph: torch.fx.Graph) -> str:
    """ "backward" for an AOTAutograd backward graph (it reads tangents), else "forward"."""
    tangents = any(n.op == "placeholder" and str(n.target).startswith("tangents") for n in graph.nodes)
    return "backward" if tangents else "forward"


def optimize_aten_graph(
    graph: torch.fx.Graph, require_fewer_launches: bool = True, **options: Any
) -> OptimizeReport | None:
    """Optimize a functional aten graph (``meta["val"]`` fake tensors) in place.

    Returns the report, or None when the graph was skipped (symbolic shapes, no fake
    inputs to lower with, or sparse tensors: the gradient of an ``Embedding(sparse=True)``,
    whose storage Inductor's checks of a rewritten graph cannot read). The graph is
    rewritten only when the optimizer's program is predicted to launch fewer kernels
    (``require_fewer_launches=False``: whenever the optimizer keeps its program, as the
    fuzzer wants); on a failure it is left as it was and the exception propagates."""
    inputs = fake_inputs(graph)
    if inputs is None or _holds_sparse_tensors(graph):
        return None
    owner = graph.owning_module
    work = copy_module(owner) if owner is not None else _module_of(graph)
    options = {**options, "mode": "inference"}  # each aten graph runs as it is: no autograd on top
    if options.get("profile", "auto") == "auto":  # no example inputs: the fake inputs' device decides
        options["profile"] = profile_for_inputs(inputs)
    optimized = optimize_graph(work, None, **options)
    report: OptimizeReport = optimized.meta["optimus_eqsat"]
    if report.fell_back or not report.changed:
        return report
    # a program the optimizer kept has both launch counts
    if require_fewer_launches and cast(int, report.launches_after) >= cast(int, report.launches_before):
        # Inductor's scheduler fuses an aten graph on its own: a program predicted to launch as
        # many kernels only reshuffles it, at the risk of a fusion the model does not see (batched
        # bias sums of a pre-grad-batched backward can cost two more CPU kernels).
        report.fall_back(
            f"post-grad: no fewer launches predicted ({report.launches_before} -> "
            f"{report.launches_after}); kept the graph"
        )
        return report
    lowered = lower_to_aten(optimized, inputs)
    splice(graph, lowered)
    report.nodes_after = sum(1 for n in graph.nodes if n.op == "call_function")
    return report


def _holds_sparse_tensors(graph: torch.fx.Graph) -> bool:
    return any(
        isinstance(v, torch.Tensor) and v.layout != torch.strided
        for n in graph.nodes
        for v in pytree.tree_leaves(n.meta.get("val"))
    )


def _module_of(graph: torch.fx.Graph) -> torch.fx.GraphModule:
    copy = torch.fx.Graph()
    copy.output(copy.graph_copy(graph, {}))
    return torch.fx.GraphModule(torch.nn.Module(), copy)


# The ILP's limit on each aten graph. The aten graphs come after the pre-grad pass did the
# batching, so the post-grad ILP finds its final program early where it matters; past a
# second it mostly proves optimality, or finds time-only gains the pass then rejects for
# launching as many kernels.
POST_GRAD_ILP_SECONDS = 1.0


class PostGradPass(CustomGraphPass):
    """``optimize_graph`` on every aten graph Inductor compiles (forward and backward).

    ``options`` are :func:`~optimus_eqsat.optimize_graph`'s; ``require_fewer_launches``
    :func:`optimize_aten_graph`'s. Making one installs, for the process, the fix that keeps
    Inductor from writing a result in place over a piece of a concatenation
    (:func:`~..inductor_compat.install_inplace_alias_fix`). Reports are appended as
    ``(role, report)`` pairs, role "forward" or "backward", to every list in ``sinks`` (``[reports]`` unless set).
    ``roles``: the graphs it optimizes; another is left as it is (and reported so). A backward
    graph's ``min_gain`` is a fraction of the whole step: the forward it follows (the last
    forward graph the pass optimized) counts as the rest of the step."""

    def __init__(
        self,
        require_fewer_launches: bool = True,
        roles: tuple[str, ...] = ("forward", "backward"),
        **options: Any,
    ):
        options.setdefault("raise_on_error", False)
        # (the default ILP limit, spent on each of a step's aten graphs, would add seconds to a compile)
        options.setdefault("ilp_time_limit_s", POST_GRAD_ILP_SECONDS)
        OptimizeOptions.from_kwargs(**options)  # a caller's mistake is an error here, not in the compile
        self.options = options
        self.require_fewer_launches = require_fewer_launches
        install_inplace_alias_fix()  # (our cats' pieces are not written over while read; inductor_compat)
        self.roles = tuple(roles)
        self.reports: list[tuple[str, OptimizeReport]] = []
        self.sinks = [self.reports]  # every list the (role, report) pairs go to
        self._forward_cost_s = 0.0  # predicted time of the last forward graph it saw (0: unknown)

    def __call__(self, graph: torch.fx.Graph) -> None:
        role = graph_role(graph)
        if role not in self.roles:  # by design (the pre-grad pass rewrote the forward): no news to log
            skipped = OptimizeReport(
                fell_back=True, fallback_reason=f"post-grad: the {role} graph is not among those to optimize; kept"
            )
            self._report(role, skipped, level=logging.DEBUG)
            return
        options = self.options
        if role == "backward" and self._forward_cost_s and "rest_of_step_s" not in options:
            # the forward's predicted time: a backward's rewrite must be worth min_gain of the step
            options = {**options, "rest_of_step_s": self._forward_cost_s}
        try:
            report = optimize_aten_graph(graph, self.require_fewer_launches, **options)
        except Exception as exc:
            if is_dynamo_signal(exc):
                raise
            if self.options.get("raise_on_error"):
                raise
            log.warning("optimus_eqsat post-grad (%s): leaving the graph as it was: %s", role, first_line(exc, 400))
            report = OptimizeReport(fell_back=True, fallback_reason=f"post-grad: {first_line(exc, 400)}")
        if report is None:  # every call is reported: the backend reads which graphs the pass saw
            report = OptimizeReport(
                fell_back=True, fallback_reason="post-grad: skipped (symbolic shapes or no fake inputs); kept the graph"
            )
        if role == "forward":
            self._forward_cost_s = report.cost_before or 0.0
        self._report(role, report)

    def _report(self, role: str, report: OptimizeReport, level: int = logging.INFO) -> None:
        for sink in self.sinks:
            sink.append((role, report))
        log.log(level, "optimus_eqsat post-grad (%s):\n%s", role, report.summary())

    def uuid(self) -> bytes:
        files = source_files(tuple(self.options.get("rule_files", ())))
        settings = sorted((k, repr(v)) for k, v in self.options.items())
        return get_hash_for_files(files, repr((settings, self.require_fewer_launches, self.roles)))
