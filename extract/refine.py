"""Refine: re-extract with cats priced as chosen, and without the batch kinds that do not pay.

E-node costs add up; Inductor's fusion does not: a batched kernel that the
e-graph prices below its members may cost more once the fusion-aware model
(fx_cost) sees what the members fused with before; and a cat's inputs are
priced by the shortest list their class can hold, not the one chosen. Refine
first re-extracts (greedy, then a move per other cat of each long chosen cat)
with list cells priced by the chosen lists' lengths (``egraph_cost.reprice_cells``);
then re-extracts with each batch kind the extraction uses forbidden, then with
all of them; it keeps the variant predicted fastest, within a time limit.
:class:`BatchRefine` decides which variants to try, forbids their batched
alternatives and picks the winner; :func:`refine_run` applies it to an
``OptimizationRun`` (its ``finish`` calls it), which extracts and builds the variants.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generic, Mapping, Sequence, TypeVar

import torch.fx

from optimus_eqsat.fx_graphs import predict

from ..term import CTORS, Role
from .egraph import ENode, ExtractionGraph
from .egraph_cost import MAX_POINTWISE_CAT_INPUTS, chosen_list_lengths, reprice_cells
from .group_search import improve_with_groups, long_cat_moves

if TYPE_CHECKING:
    from optimus_eqsat.api import OptimizationRun

log = logging.getLogger("optimus_eqsat")

# A class whose batched alternative refine forbids keeps these (the member's slice of
# another group's result, a cat of views): only the batched computation itself goes.
_KEPT_WHEN_BANNED = frozenset(c.name for c in CTORS.values()
                               if c.output == "Tensor" and c.role in (Role.LEAF, Role.VIEW, Role.CAT))

# Batch kinds whose price in the e-graph is least sure come first in refine, which may
# only have time for one or two variants on large graphs: padded linears (whether the
# pads fuse), elementwise batches (whether their stacks are views); then the rest.
_REFINE_FIRST = ("batch-linear_padk", "batch-elementwise")


def _refine_priority(kind: str) -> tuple[int, str]:
    return (_REFINE_FIRST.index(kind) if kind in _REFINE_FIRST else len(_REFINE_FIRST), kind)


T = TypeVar("T")


@dataclass(frozen=True)
class Variant(Generic[T]):
    """One program refine compared: the batch kinds dropped (none: the first extraction),
    its predicted launches and seconds, and what the caller keeps if it wins (None for
    the first extraction)."""

    dropped: tuple[str, ...]
    launches: int
    seconds: float
    kept: T | None = None


@dataclass(frozen=True)
class BatchRefine:
    """The refine policy over one exported e-graph and the batches added to it.

    ``egraph``: the exported e-graph (``classes`` of term nodes, ``class_of_id``);
    ``batch_outputs``: batch kind -> ids of its batched terms; ``time_limit_s``:
    a variant is started only when it is expected to end within this many seconds
    of refining.
    """

    egraph: Any
    batch_outputs: Mapping[str, Sequence[int]]
    time_limit_s: float

    def kinds_used(self, choice: Mapping[int, int]) -> list[str]:
        """Batch kinds the extraction ``choice`` uses (dropping an unused one changes
        nothing), those whose price is least sure first."""
        class_of = self.egraph.class_of_id
        return sorted((k for k, ids in self.batch_outputs.items() if any(class_of.get(i) in choice for i in ids)),
                      key=_refine_priority)

    @staticmethod
    def variants(kinds: Sequence[str]) -> list[tuple[str, ...]]:
        """The kinds to drop, variant by variant: each alone, then all together."""
        return [(k,) for k in kinds] + ([tuple(kinds)] if len(kinds) > 1 else [])

    def without(self, kinds: Sequence[str], graph: ExtractionGraph) -> ExtractionGraph:
        """``graph`` with the batched alternatives of ``kinds`` forbidden (their classes
        keep only views and cats). Shares every other class's nodes: re-pricing all of
        them took a second on the 2,000-feature graph."""
        eg, banned = self.egraph, set()
        for kind in kinds:
            banned.update(eg.class_of_id[i] for i in self.batch_outputs.get(kind, ()) if i in eg.class_of_id)
        classes = list(graph.classes)
        for c in banned:
            classes[c] = [node if term.ctor in _KEPT_WHEN_BANNED else ENode(node.op, node.children, math.inf)
                          for node, term in zip(graph.classes[c], eg.classes[c])]
        return ExtractionGraph(classes, graph.roots)

    def variant_seconds(self, phase_seconds: Mapping[str, float], extractor: str | None) -> float | None:
        """Expected seconds of one variant, from the phases so far; None when one alone
        would exceed the time limit (no refine)."""
        # A variant is a greedy extraction and a build: when the main extraction was
        # greedy, its time says what a variant will take (tens of seconds on the
        # 2,000-feature graph, where starting one would overrun the limit by as much).
        extract_s = phase_seconds.get("extract", 0.0) if extractor == "greedy" else 0.0
        if extract_s > self.time_limit_s:
            log.info("optimus_eqsat: no refine: one variant (over %.1f s) exceeds its time limit", extract_s)
            return None
        # The first program is itself a cheap build (finish): a variant costs what it took
        # (rebuild, and one of verify's two predictions) on top of its extraction.
        return extract_s + phase_seconds.get("rebuild", 0.0) + phase_seconds.get("verify", 0.0) / 2

    def run(self, choice: Mapping[int, int], first: Variant[T], report: Any,
            build: Callable[[tuple[str, ...]], tuple[T, torch.fx.GraphModule]],
            predict: Callable[[torch.fx.GraphModule], tuple[int, float]]) -> Variant[T] | None:
        """Try the variants of the extraction ``choice`` (predicted as ``first``); return
        the fastest, or None when refine had nothing to try or no time for it.

        ``report`` (an OptimizeReport) gives the phase times and the extractor, and
        collects the variants tried (``refine_tried``). ``build(dropped)`` extracts and
        builds a variant cheaply (raising when the kinds cannot be dropped) and returns
        what to keep if it wins with the built module; ``predict`` prices a module.
        """
        kinds = self.kinds_used(choice)
        if not kinds:
            return None
        start = time.perf_counter()
        variant_s = self.variant_seconds(report.phase_seconds, report.extractor)
        if variant_s is None:
            return None
        best = first
        for dropped in self.variants(kinds):
            if time.perf_counter() - start + variant_s > self.time_limit_s:
                log.info("optimus_eqsat: refine stopped: a variant (about %.1f s) would overrun its time limit "
                         "(%.1f s)", variant_s, self.time_limit_s)
                break
            report.refine_tried.append(list(dropped))
            try:
                kept, candidate = build(dropped)
            except Exception as exc:  # a kind that cannot be dropped: keep what we have
                log.debug("optimus_eqsat: refine without %s failed: %s", dropped, exc)
                continue
            n, t = predict(candidate)
            if t < best.seconds * (1 - 1e-9):
                best = Variant(dropped, n, t, kept)
        return best


def _relist(run: OptimizationRun, policy: BatchRefine, result: torch.fx.GraphModule, launches: int,
            seconds: float) -> tuple[torch.fx.GraphModule, int, float]:
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
    candidate = run.build(meta=False)
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


def refine_run(run: OptimizationRun, result: torch.fx.GraphModule, launches: int,
               seconds: float) -> tuple[torch.fx.GraphModule | None, int, float]:
    """Refine a run's extraction in place: drop the batch kinds that do not pay.

    ``result`` is the cheap build (no fake-tensor meta) of ``run.extraction`` and
    ``launches``, ``seconds`` its prediction. Returns (``result``, or None when a
    variant won and is now ``run.extraction``; its launches; its seconds).
    """
    limit_s = run.options.refine_time_limit_s
    budget = getattr(run, "budget", None)  # the run's time budget: refine gets its share of what is left
    policy = BatchRefine(run.egraph, run.batches.outputs, limit_s if budget is None else budget.share(limit_s))
    result, launches, seconds = _relist(run, policy, result, launches, seconds)
    main_graph, first = run.graph, _state(run)

    def build_variant(dropped: tuple[str, ...]) -> tuple[tuple, torch.fx.GraphModule]:
        run.extract(graph=policy.without(dropped, main_graph), extractor="greedy")
        return _state(run), run.build(meta=False)

    best = policy.run(run.extraction.choice, Variant((), launches, seconds), run.report, build_variant,
                      lambda gm: predict(gm, run.example_inputs, run.objective))
    if best is None:  # nothing to drop, or no time for a variant
        return result, launches, seconds
    _restore(run, first if best.kept is None else best.kept)
    run.report.dropped_batches = list(best.dropped)
    return (None if best.dropped else result), best.launches, best.seconds
