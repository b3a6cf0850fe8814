"""The wall-clock budget of one optimization (``time_limit_s``): what each phase may spend.

The phases run in order: translate, load, saturate (and batch, saturate again),
export, extract, rebuild, verify, refine. Saturation, the ILP and refine can stop
early; translation, export, rebuild and the cost model's predictions cannot, and
take time in proportion to the graph. So the budget keeps a reserve for them:
saturation stops where the reserve begins, the ILP and refine get what is left of
the budget less what follows them, and when the reserve alone no longer fits before
translating (the graph's ops give the reserve then), before loading or while loading, the run
returns the original graph (:class:`~optimus_eqsat.saturate.TimeLimitReached`).

The reserve grows with the graph: AFTER_S_PER_NODE seconds per FX node. On the
synthetic generators (benchmarks/synthetic.py) at 10,000 nodes, on a 2-core machine
shared with other jobs, export, extraction, rebuild and the two predictions take
0.13 to 1 ms of wall clock per node; the constant is near the common case, so a
budget holds within about a second on such graphs, not to the millisecond. (The
translation's time was tried as the gauge: the first optimization in a process pays
seconds of one-off costs there, and the reserve it implied left small graphs no
saturation at all.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from optimus_eqsat.saturate import TimeLimitReached

AFTER_S_PER_NODE = 4e-4
# The ILP after a greedy extraction and refine's variants are the phases that can be
# cut; each is given this share of what is left (the rest is for rebuild and verify).
EXTRACT_SHARE = 0.5
# "auto" extracts greedily when the ILP's share is below this: reducing the e-graph and
# building the model come before the solver's own time limit (about a second at 12,500
# nodes), so a shorter ILP overruns the budget and finds nothing.
MIN_ILP_S = 2.0
# Kept back for what no phase times (checking the options, copying the result, the
# report): 5% of the budget.
MARGIN_SHARE = 0.05
# The backend's default budget grows with the graph, as Inductor's own compile does (it
# lowers and generates code node by node): BACKEND_BASE_S plus BACKEND_S_PER_OP per FX op,
# at most BACKEND_MAX_S. Small graphs finish well inside the base; graphs of thousands of
# ops get the saturation they need instead of a cut at a fixed 20 s.
BACKEND_BASE_S = 10.0
BACKEND_S_PER_OP = 4e-3
BACKEND_MAX_S = 60.0


def backend_time_limit(ops: int) -> float:
    """The backend's ``time_limit_s`` for a graph of ``ops`` FX ops (when the user set none)."""
    return min(BACKEND_MAX_S, BACKEND_BASE_S + BACKEND_S_PER_OP * ops)


@dataclass
class Budget:
    """``limit_s`` seconds of wall clock from ``start`` (``time.perf_counter()``)."""

    limit_s: float
    start: float = field(default_factory=time.perf_counter)
    fx_nodes: int = 0  # the graph's size (its ops, then its translated nodes): scales the reserve

    @property
    def deadline(self) -> float:
        return self.start + self.limit_s

    def left(self) -> float:
        """Seconds left (negative past the deadline)."""
        return self.deadline - time.perf_counter()

    @property
    def reserve(self) -> float:
        """Seconds the phases after saturation are expected to take."""
        return AFTER_S_PER_NODE * self.fx_nodes + MARGIN_SHARE * self.limit_s

    def saturation_deadline(self) -> float:
        """The ``time.perf_counter()`` by which saturation must stop."""
        return self.deadline - self.reserve

    def check(self, before: str) -> None:
        """Raise :class:`TimeLimitReached` when saturation's time is already spent ``before``
        a phase (then only the original fits: copying it is one of the phases the reserve
        holds time for)."""
        if time.perf_counter() > self.saturation_deadline():
            raise TimeLimitReached(f"time limit ({self.limit_s:g} s) reached before {before}")

    def check_fits(self) -> None:
        """Raise :class:`TimeLimitReached` when the reserve for a graph of ``fx_nodes`` ops
        alone leaves saturation no time: the graph is not even translated, and the reason
        says which budget would do."""
        if time.perf_counter() > self.saturation_deadline():
            after_s = AFTER_S_PER_NODE * self.fx_nodes
            raise TimeLimitReached(
                f"time limit ({self.limit_s:g} s) too short for a graph of {self.fx_nodes} ops: the phases "
                f"after saturation alone take about {after_s:.0f} s ({AFTER_S_PER_NODE * 1e3:g} ms per op); "
                f"time_limit_s must be well above {after_s / (1 - MARGIN_SHARE):.0f} s (translating, loading and "
                "saturating come first) for it to be optimized"
            )

    def extractor(self, name: str, ilp_limit_s: float) -> tuple[str, float]:
        """The extractor to run for ``name`` ("auto", "greedy", "ilp") and the ILP's time limit."""
        ilp_s = self.share(ilp_limit_s)
        return ("greedy" if name == "auto" and ilp_s < MIN_ILP_S else name), ilp_s

    def share(self, limit_s: float) -> float:
        """A phase that can stop early (ILP, refine): its own ``limit_s`` or its share of
        what is left, the smaller (0 once the budget is spent)."""
        return max(0.0, min(limit_s, EXTRACT_SHARE * self.left()))
