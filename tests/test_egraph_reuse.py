"""Prepared e-graphs (saturate.py ``_PreparedEGraphs``): a session given back is reused by
the next one of the same rule sets, which starts as a fresh e-graph would (no facts, no
unions, no rule run), so a run on it saturates, extracts and rebuilds exactly as before."""

from __future__ import annotations

from benchmarks.synthetic import split_cat_chain
from optimus_eqsat import optimize_graph
from optimus_eqsat.rulesets import select_rulesets
from optimus_eqsat.saturate import EGraphSession, Limits
from optimus_eqsat.translate import translate


def _saturated(session: EGraphSession, n: int) -> tuple[int, int, str]:
    translation = translate(split_cat_chain(n)[0], None)
    session.load(translation.facts, fx_nodes=len(translation.nodes))
    sat = session.saturate(Limits(max_iterations=30))
    return sat.enodes, sat.iterations, sat.stop_reason.value


def test_a_session_given_back_is_reused_and_starts_empty():
    rulesets = select_rulesets(("splitcat", "algebraic"), ())
    fresh = EGraphSession(rulesets)
    empty = fresh.enode_count()
    first = _saturated(fresh, 40)
    assert fresh.enode_count() > empty
    egraph = fresh.egraph
    fresh.release()
    assert fresh.egraph is None  # a released session cannot be used again
    reused = EGraphSession(rulesets)
    assert reused.egraph is egraph  # the prepared e-graph, not a new one
    assert reused.enode_count() == empty  # the last run's facts and rewrites are gone
    assert _saturated(reused, 40) == first
    other = EGraphSession(select_rulesets(("splitcat",), ()))
    assert other.egraph is not egraph  # another choice of rule sets is prepared apart
    reused.release()
    other.release()


def test_optimize_graph_gives_the_same_program_on_a_reused_e_graph():
    gm, inputs = split_cat_chain(30)
    runs = [optimize_graph(gm, inputs) for _ in range(3)]  # the second and third reuse the first's
    codes = {run.code for run in runs}
    assert len(codes) == 1
    reports = [run.meta["optimus_eqsat"] for run in runs]
    assert len({(r.launches_after, r.eclasses, tuple(sorted(r.rules_fired.items()))) for r in reports}) == 1
    assert reports[0].nodes_after < reports[0].nodes_before


def test_an_e_graph_given_back_to_a_full_pool_is_dropped_without_restoring_it():
    from optimus_eqsat.saturate import _PreparedEGraphs

    class Recording:
        def __init__(self) -> None:
            self.commands = 0

        def run_program(self, *commands) -> None:
            self.commands += 1

    pool, key = _PreparedEGraphs(), (("(ruleset r)", "r"),)
    graphs = [Recording() for _ in range(pool.MAX_IDLE + 1)]
    for graph in graphs:
        pool.give_back(key, graph)
    assert [g.commands for g in graphs] == [1] * pool.MAX_IDLE + [0]  # (the pop, or nothing)
    assert pool.take(key) is graphs[pool.MAX_IDLE - 1]  # (the last one kept, taken first)
