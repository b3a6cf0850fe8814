"""The extractor registry: one narrow interface, three names.

``get_extractor("greedy")`` is fast on any size, ``"ilp"`` is optimal (within a
time limit), ``"auto"`` uses the ILP when the pruned e-graph is small enough
and never returns something costlier than greedy.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

from optimus_eqsat.extract.egraph import Extraction, ExtractionGraph, compact
from optimus_eqsat.extract.greedy import GreedyDagExtractor
from optimus_eqsat.extract.ilp import IlpExtractor

__all__ = ["Extractor", "AutoExtractor", "get_extractor", "EXTRACTORS"]


@runtime_checkable
class Extractor(Protocol):
    """Anything that turns an e-graph into one acyclic program for all roots."""

    name: str

    def extract(self, graph: ExtractionGraph) -> Extraction: ...


class AutoExtractor:
    """Greedy always; then the ILP if the pruned graph has <= ``max_ilp_nodes``.

    The size cut-off keeps the ILP within its ``time_limit`` on typical graphs (docs/ilp.md
    has the solve times by size). The ILP gets at most ``max_ilp_seconds`` (default 8) of
    that limit, and gives up after ``give_up_after_s`` (default 1.5) while its gap is above
    0.3 (``IlpExtractor``; the check runs at HiGHS's MIP interrupts, which can be seconds
    apart, so a longer give-up time overshoots by more). A graph whose optimum is greedy's
    program then returns that program, unproven, instead of spending the limit on the
    proof; a flat limit made the result depend on the machine's load.
    """

    name = "auto"

    def __init__(
        self,
        max_ilp_nodes: int = 50_000,
        time_limit: float = 10.0,
        paid_rounds: int = 3,
        max_ilp_seconds: float = 8.0,
        give_up_after_s: float = 1.5,
    ) -> None:
        self.max_ilp_nodes = max_ilp_nodes
        self.greedy = GreedyDagExtractor(paid_rounds=paid_rounds)
        self.ilp = IlpExtractor(time_limit=min(time_limit, max_ilp_seconds), give_up_after_s=give_up_after_s)

    def extract(self, graph: ExtractionGraph) -> Extraction:
        """Extract all roots together; raises ``ExtractionError`` if impossible."""
        t0 = time.perf_counter()
        cg = compact(graph)
        ext = self.greedy.extract_compact(cg)
        if cg.n_nodes <= self.max_ilp_nodes:
            ext = self.ilp.extract_compact(graph, cg, ext)
        else:
            ext.info["stop"] = f"ilp skipped: {cg.n_nodes} nodes > max_ilp_nodes={self.max_ilp_nodes}"
        ext.seconds = time.perf_counter() - t0
        return ext


EXTRACTORS = {"greedy": GreedyDagExtractor, "ilp": IlpExtractor, "auto": AutoExtractor}


def get_extractor(name: str, **options: object) -> Extractor:
    """Build the extractor ``name`` ("greedy", "ilp" or "auto") with ``options``."""
    try:
        cls = EXTRACTORS[name]
    except KeyError:
        raise ValueError(f"unknown extractor {name!r}; choose from {sorted(EXTRACTORS)}") from None
    return cls(**options)  # type: ignore[arg-type]
