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
alternatives and picks the winner; it receives the functions that build and price a
variant, so the pipeline above (``optimus_eqsat.refine_run``) drives it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch.fx

from optimus_eqsat.extract.egraph import ENode, ExtractionGraph
from optimus_eqsat.term import CTORS, Role

log = logging.getLogger("optimus_eqsat")

# A class whose batched alternative refine forbids keeps these (the member's slice of
# another group's result, a cat of views): only the batched computation itself goes.
_KEPT_WHEN_BANNED = frozenset(
    c.name for c in CTORS.values() if c.output == "Tensor" and c.role in (Role.LEAF, Role.VIEW, Role.CAT)
)

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
        return sorted(
            (k for k, ids in self.batch_outputs.items() if any(class_of.get(i) in choice for i in ids)),
            key=_refine_priority,
        )

    @staticmethod
    def variants(kinds: Sequence[str]) -> list[tuple[str, ...]]:
        """The kinds to drop, variant by variant: each alone, then all together."""
        return [(k,) for k in kinds] + ([tuple(kinds)] if len(kinds) > 1 else [])

    def without(self, kinds: Sequence[str], graph: ExtractionGraph) -> ExtractionGraph:
        """``graph`` with the batched alternatives of ``kinds`` forbidden (their classes
        keep only views and cats). Shares every other class's nodes: re-pricing all of
        them took a second on the 2,000-feature graph."""
        eg, banned = self.egraph, set[int]()
        for kind in kinds:
            banned.update(eg.class_of_id[i] for i in self.batch_outputs.get(kind, ()) if i in eg.class_of_id)
        classes = list(graph.classes)
        for c in banned:
            classes[c] = [
                node if term.ctor in _KEPT_WHEN_BANNED else ENode(node.op, node.children, math.inf)
                for node, term in zip(graph.classes[c], eg.classes[c])
            ]
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

    def run(
        self,
        choice: Mapping[int, int],
        first: Variant[T],
        report: Any,
        build: Callable[[tuple[str, ...]], tuple[T, torch.fx.GraphModule]],
        predict: Callable[[torch.fx.GraphModule], tuple[int, float]],
    ) -> Variant[T] | None:
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
                log.info(
                    "optimus_eqsat: refine stopped: a variant (about %.1f s) would overrun its time limit (%.1f s)",
                    variant_s,
                    self.time_limit_s,
                )
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
