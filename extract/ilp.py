"""Optimal DAG extraction as a 0-1 integer program, solved by HiGHS (:class:`IlpExtractor`).

The steps: compact the e-graph; return the greedy program at once when it
meets the trivial lower bound; reduce (extract/ilp_reduce.py, on the need
sets of extract/ilp_needs.py); build the model (extract/ilp_model.py, where
the formulation is written out); divide the costs by the smallest positive
cost; solve (:func:`_solve`: highspy, a declared dependency, up to
``highspy_max_nodes`` reduced e-nodes, scipy ``milp`` beyond or without it);
decode and re-verify the program (acyclic, complete). The greedy program is
the floor and the fallback: it is returned when the solver finds nothing,
nothing cheaper, or something that does not decode.

Costs are scaled because real costs are seconds (views 1e-9, kernels 1e-6),
below HiGHS's absolute tolerances, which made it stop at non-optimal points
and report them optimal.

Why the model and the solver settings are what they are, what was tried and
measured, and how to check a change: docs/ilp.md. The underscore names of
extract/ilp*.py are private to these four modules together, not to one file.
"""

from __future__ import annotations

import math
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from scipy.optimize import Bounds, LinearConstraint

from optimus_eqsat.extract.egraph import (
    CompactGraph,
    Extraction,
    ExtractionError,
    ExtractionGraph,
    compact,
    dag_cost,
)
from optimus_eqsat.extract.greedy import GreedyDagExtractor
from optimus_eqsat.extract.ilp_model import build_model, decode_choice
from optimus_eqsat.extract.ilp_reduce import reduce_for_ilp

__all__ = ["IlpExtractor", "reduce_for_ilp"]


class IlpExtractor:
    """Optimal extractor for small/medium e-graphs, with greedy as a floor.

    ``time_limit`` (s, default 10); ``mip_rel_gap`` (HiGHS relative gap at
    which to stop; default 1e-6 so "optimal" means optimal for
    launch-count-sized costs); ``presolve`` (True, False or None = auto: off
    when a class has more than ``presolve_max_users`` users, where HiGHS's
    presolve ignores the time limit and goes superlinear; chains of cycles
    need it on).

    ``need_rows_max_nodes`` (default 20,000) and ``conflict_rows_max_nodes``
    (5,000): the need rows and the cycle-conflict rows (extract/ilp_model.py)
    are added only up to this many reduced e-nodes; on larger (synthetic)
    graphs they did not move the bound and slowed HiGHS down. Root needs are
    fixed to 1 regardless.

    ``give_up_after_s`` (default None: never) and ``give_up_gap`` (0.3): past
    this many seconds, stop once the gap between the best program known (the
    solver's or greedy's) and the bound is still above ``give_up_gap``: a proof
    is then out of reach in the time left; once the solver has found nothing
    cheaper than greedy by 1% (``FIND_MOVE``: the search earns its time by what it finds;
    tested from half of ``give_up_after_s``, ``IDLE_FRACTION``);
    or once neither moved by 0.5% of the greedy cost in the last
    ``give_up_after_s`` seconds (:class:`_Stall`). Without highspy (no callback
    to watch the gap) the time limit itself is cut to ``give_up_after_s``.

    ``max_reach_arcs`` (default 20,000): acyclicity by reach rows while their
    hubs' sets hold this many class arcs in all; the components past it get
    the big-M order rows (on larger reach models HiGHS's presolve ran far past
    the time limit).

    ``highspy_max_nodes`` (default 5,000): up to this many reduced e-nodes
    the MIP goes to highspy when it is installed (it proves models that
    scipy's bundled HiGHS does not within the limit); above, to scipy
    ``milp``, faster on large synthetic graphs.

    The measurements behind each default: docs/ilp.md, "Options and their
    defaults".
    """

    name = "ilp"

    def __init__(
        self,
        time_limit: float = 10.0,
        mip_rel_gap: float = 1e-6,
        presolve: bool | None = None,
        presolve_max_users: int = 2000,
        need_rows_max_nodes: int = 20_000,
        conflict_rows_max_nodes: int = 5_000,
        highspy_max_nodes: int = 5_000,
        give_up_after_s: float | None = None,
        give_up_gap: float = 0.3,
        max_reach_arcs: int = 20_000,
    ) -> None:
        self.time_limit = time_limit
        self.max_reach_arcs = max_reach_arcs
        self.give_up_after_s = give_up_after_s
        self.give_up_gap = give_up_gap
        self.highspy_max_nodes = highspy_max_nodes
        self.need_rows_max_nodes = need_rows_max_nodes
        self.conflict_rows_max_nodes = conflict_rows_max_nodes
        self.mip_rel_gap = mip_rel_gap
        self.presolve = presolve
        self.presolve_max_users = presolve_max_users

    def extract(self, graph: ExtractionGraph) -> Extraction:
        """Extract all roots together; never costlier than the greedy result."""
        t0 = time.perf_counter()
        cg = compact(graph)
        ext = self.extract_compact(graph, cg, GreedyDagExtractor().extract_compact(cg))
        ext.seconds = time.perf_counter() - t0
        return ext

    def extract_compact(self, graph: ExtractionGraph, cg: CompactGraph, greedy: Extraction) -> Extraction:
        """Solve on a pruned graph; ``greedy`` is the upper bound and fallback."""
        t0 = time.perf_counter()
        info: dict[str, object] = {"classes": cg.n_classes, "nodes": cg.n_nodes, "greedy_cost": greedy.cost}
        # Trivial lower bound: every root pays at least its cheapest node.
        lower = max(min(cg.node_cost[n] for n in cg.class_nodes[r]) for r in cg.roots)
        if greedy.cost <= lower:
            info["stop"] = "greedy meets lower bound"
            return Extraction(greedy.choice, greedy.cost, "greedy", True, 0.0, info=info)

        cg = reduce_for_ilp(cg)
        info.update(ilp_classes=cg.n_classes, ilp_nodes=cg.n_nodes, reduce_s=time.perf_counter() - t0)
        need_rows = cg.n_nodes <= self.need_rows_max_nodes
        conflict_rows = cg.n_nodes <= self.conflict_rows_max_nodes
        objective, integrality, bounds, constraints, n_x = build_model(
            cg, need_rows, conflict_rows, self.max_reach_arcs, info
        )
        info.update(need_rows=need_rows, conflict_rows=conflict_rows)
        positive = objective[objective > 0]
        unit = float(positive.min()) if positive.size else 1.0
        objective = objective / unit  # HiGHS tolerances are absolute: keep costs O(1) and up
        presolve = self.presolve
        if presolve is None:
            users = np.diff(constraints.A.tocsc().indptr)[n_x : n_x + cg.n_classes]
            presolve = bool(users.max(initial=0) <= self.presolve_max_users + 1)
        remaining = max(0.1, self.time_limit - (time.perf_counter() - t0))
        give_up = None
        if self.give_up_after_s is not None:
            # (within a shorter time limit, its idle test comes at half that limit)
            after = min(self.give_up_after_s, self.time_limit)
            give_up = (max(0.1, after - (time.perf_counter() - t0)), self.give_up_gap, greedy.cost / unit)
        res = _solve(
            objective,
            integrality,
            bounds,
            constraints,
            {"time_limit": remaining, "mip_rel_gap": self.mip_rel_gap, "presolve": presolve},
            use_highspy=cg.n_nodes <= self.highspy_max_nodes,
            give_up=give_up,
        )
        info.update(presolve=presolve, solver=res.solver)
        info.update(stop=res.message, status=int(res.status), build_and_solve_s=time.perf_counter() - t0)
        dual = getattr(res, "mip_dual_bound", None)
        if dual is not None:
            dual = float(dual) * unit  # back to the caller's units
        if res.x is None:
            return _fallback(greedy, info, dual)
        try:
            choice, _ = cg.to_choice(decode_choice(cg, res.x, n_x))
            cost = dag_cost(graph, choice)  # re-verify: acyclic and complete
        except (ExtractionError, IndexError) as err:  # solver tolerance surprises
            info["decode_error"] = str(err)
            return _fallback(greedy, info, dual)
        if cost > greedy.cost:
            return _fallback(greedy, info, dual)
        optimal = res.status == 0
        gap = 0.0 if optimal else _gap(cost, dual, getattr(res, "mip_gap", None))
        return Extraction(choice, cost, "ilp", optimal, gap, info=info)


def _solve(
    objective: np.ndarray,
    integrality: np.ndarray,
    bounds: Bounds,
    constraints: LinearConstraint,
    options: dict[str, float | bool],
    use_highspy: bool = True,
    give_up: tuple[float, float, float] | None = None,
) -> SimpleNamespace:
    """Solve the MIP with highspy if asked and installed, else scipy ``milp`` (its result's fields).

    ``give_up`` = (seconds, gap, upper): past ``seconds``, stop while the gap of
    the best of the solver's incumbent and ``upper`` to the bound exceeds ``gap``
    (highspy's MIP interrupt callback); scipy, without a callback, stops at
    ``seconds``. Which one is faster depends on the graph (docs/ilp.md, "Solver").
    """
    try:
        if not use_highspy:
            raise ImportError
        import highspy
    except ImportError:
        if give_up is not None:
            options = {**options, "time_limit": min(float(options["time_limit"]), give_up[0])}
        from scipy.optimize import (
            milp,  # (imported where used: scipy is slow to import)
        )

        res = milp(
            objective,
            integrality=integrality,
            bounds=bounds,
            constraints=constraints,
            options={**options, "disp": False},
        )
        return SimpleNamespace(
            x=res.x,
            status=int(res.status),
            message=res.message,
            solver="scipy",
            mip_dual_bound=getattr(res, "mip_dual_bound", None),
            mip_gap=getattr(res, "mip_gap", None),
        )
    # The bare core class: highspy.Highs() prints a banner to stdout when created.
    h = getattr(getattr(highspy, "_core", None), "_Highs", highspy.Highs)()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(options["time_limit"]))
    h.setOptionValue("mip_rel_gap", float(options["mip_rel_gap"]))
    h.setOptionValue("presolve", "on" if options["presolve"] else "off")
    # Branch on pseudocosts at once instead of strong-branching every candidate
    # first: most of the proof's LP iterations went there (docs/ilp.md, "Solver").
    h.setOptionValue("mip_pscost_minreliable", 0)
    a = constraints.A.tocsr()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = a.shape[1], a.shape[0]
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = objective, bounds.lb, bounds.ub
    lp.row_lower_, lp.row_upper_ = constraints.lb, constraints.ub
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
    kinds = (highspy.HighsVarType.kContinuous, highspy.HighsVarType.kInteger)
    lp.integrality_ = [kinds[int(k)] for k in integrality]
    h.passModel(lp)
    hopeless = _GiveUp(*give_up) if give_up is not None else None
    if hopeless is not None:

        def interrupt(_kind, _message, out, into, _data) -> None:
            if hopeless(out.running_time, out.mip_primal_bound, out.mip_dual_bound):
                into.user_interrupt = True

        h.setCallback(interrupt, None)
        h.startCallback(highspy.cb.HighsCallbackType.kCallbackMipInterrupt)
    h.run()
    status, info = h.getModelStatus(), h.getInfo()
    has_x = info.primal_solution_status == 2  # kSolutionStatusFeasible
    return SimpleNamespace(
        x=np.array(h.getSolution().col_value) if has_x else None,
        status=0 if status == highspy.HighsModelStatus.kOptimal else 1,
        message=h.modelStatusToString(status) + (f" ({hopeless.reason})" if hopeless and hopeless.reason else ""),
        solver="highspy",
        mip_dual_bound=info.mip_dual_bound,
        mip_gap=info.mip_gap,
    )


class _GiveUp:
    """Whether to stop the search early (``IlpExtractor``'s ``give_up_after_s``): past
    ``after`` seconds, when the gap of the best program known (the solver's or ``upper``,
    greedy's cost) to the bound is above ``max_gap`` (no proof in reach); when the solver
    has found nothing cheaper than greedy by ``FIND_MOVE`` (the search earns its time by
    what it finds: on a large training graph the bound can creep for seconds and the
    search still end on greedy's program), a test that starts at
    ``IDLE_FRACTION`` of ``after``; or when the search has stalled (:class:`_Stall`).
    ``reason`` says which."""

    def __init__(self, after: float, max_gap: float, upper: float):
        self.after, self.max_gap, self.upper = after, max_gap, upper
        self.stalled = _Stall(after, upper)
        self.reason = ""

    def __call__(self, now: float, primal: float, dual: float) -> bool:
        best = min(primal, self.upper)
        idle = best > self.upper * (1 - FIND_MOVE)
        if now < self.after:
            if idle and now >= IDLE_FRACTION * self.after:
                self.reason = "nothing found beyond greedy"
            return bool(self.reason)
        if best > 0 and (best - dual) / best > self.max_gap:
            self.reason = "gap too wide"
        elif idle:
            self.reason = "nothing found beyond greedy"
        elif self.stalled(now, best, dual):
            self.reason = "stalled"
        return bool(self.reason)


# A search that has found nothing beyond greedy by half its time rarely does later: on the
# zoo's batching models it then ended on greedy's program or on a gain below FIND_MOVE that
# measured no faster.
IDLE_FRACTION = 0.5


class _Stall:
    """Whether the search has stalled: past ``after`` seconds, neither the best program nor the
    bound moved by ``STALL_MOVE`` of the greedy cost in the last ``after`` seconds. Priced in
    step time, a graph's cost is mostly work no rewrite changes (its GEMMs' device time), so
    the gap stays small in relative terms while the bound creeps for seconds after the best
    program was found, without changing what is extracted."""

    def __init__(self, after: float, upper: float):
        self.after, self.upper = after, upper
        self.marks: list[tuple[float, float, float]] = []  # (time, best, bound), oldest first

    def __call__(self, now: float, best: float, bound: float) -> bool:
        self.marks.append((now, best, bound))
        while len(self.marks) > 1 and self.marks[1][0] <= now - self.after:
            self.marks.pop(0)
        then, old_best, old_bound = self.marks[0]
        if now < self.after or then > now - self.after or not math.isfinite(old_bound):
            return False
        moved = max(old_best - best, bound - old_bound)
        return moved < STALL_MOVE * self.upper


STALL_MOVE = 0.005
# A program found by the search must beat greedy's by this much to keep it searching past
# ``give_up_after_s``: a smaller predicted gain is within the cost model's error (the
# backend's min_gain is 1%).
FIND_MOVE = 0.01


def _gap(cost: float, dual: float | None, reported: float | None) -> float | None:
    if dual is not None and math.isfinite(dual):
        return max(0.0, (cost - dual) / max(abs(cost), 1e-12)) if cost else 0.0
    return reported


def _fallback(greedy: Extraction, info: dict[str, object], dual: float | None) -> Extraction:
    """Return the greedy program, with the solver's bound if it proved one."""
    gap = _gap(greedy.cost, dual, None)
    optimal = gap is not None and gap <= 1e-9
    return Extraction(greedy.choice, greedy.cost, "greedy", optimal, gap, info=info)
