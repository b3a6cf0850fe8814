"""Adversarial graphs (benchmarks/synthetic.py) stay linear: the e-graph grows by a bounded
number of e-nodes per FX node, no rule's firings grow faster than the graph, no limit but
the iteration limit stops saturation, and the result matches eager. The 10,000 / 100,000-node timings are benchmarks/bench_pipeline.py's
(--generator), not the suite's.
"""

from __future__ import annotations

import pytest

from benchmarks.synthetic import GENERATORS
from optimus_eqsat.api import OptimizationRun
from optimus_eqsat.options import OptimizeOptions
from tests.helpers import optimize_and_check

# E-nodes per FX node. Measured at 1,000 nodes: at most 9 (unary_runs_splitcat); before
# chain folding onto the root, scalar_chain reached 142 (142,563 e-nodes, 70 s).
ENODES_PER_NODE = 20
SIZE = 300


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_generator_stays_linear(name):
    gm, inputs = GENERATORS[name](SIZE)
    fx_nodes = len(gm.graph.nodes)
    optimized = optimize_and_check(gm, *inputs, extractor="greedy")
    report = optimized.meta["optimus_eqsat"]
    assert not report.fell_back, report.fallback_reason
    assert report.stop_reason in ("saturated", "iteration_limit"), report.stop_reason
    assert report.enodes <= ENODES_PER_NODE * fx_nodes, (report.enodes, fx_nodes)
    assert not report.backoff_bans, report.backoff_bans  # the rules stay linear without bans


def test_generators_are_deterministic_and_sized():
    for name, generate in GENERATORS.items():
        gm, (x,) = generate(500)
        gm2, (x2,) = generate(500)
        assert abs(len(gm.graph.nodes) - 500) <= 16, (name, len(gm.graph.nodes))
        assert gm.code == gm2.code and (x == x2).all(), name


def test_scalar_chain_folds_onto_its_root():
    # a chain of 8 muls, 8 divs, 8 adds, 8 subs, ... folds to one mul and one add per
    # 32 ops (the mul/div and add/sub runs meet); with split/cat round trips between them too
    for name in ("scalar_chain", "scalar_chain_splitcat"):
        gm, inputs = GENERATORS[name](200)
        optimized = optimize_and_check(gm, *inputs, extractor="greedy")
        ops = [n for n in optimized.graph.nodes if n.op == "call_function"]
        assert len(ops) <= 2 * (200 // 32 + 1), (name, len(ops))


# Firings at GROWTH times the nodes may be at most GROWTH + 1 times those at the small size,
# plus one per FX node of the large graph (a rule firing a few times on the small graph may
# fire once per node on the large one). A rule whose matches grow as the square of a chain
# (issue 29: mul-root-down 60,780 firings at 1,250 nodes, 993,030 at 5,000) exceeds it
# 3x over. 200 -> 800 nodes: past the small-size transients (chains cut by round trips
# join within the first iterations), and about a second a generator.
GROWTH = 4
SMALL = 200


def _firings(name: str, size: int) -> tuple[int, dict[str, int]]:
    """FX nodes and matches per rule of the saturation (split/cat and algebraic: the
    families whose chains the generators build) of generator ``name`` at ``size``."""
    gm, _ = GENERATORS[name](size)
    run = OptimizationRun(gm, None, OptimizeOptions(extractor="greedy", rulesets=("splitcat", "algebraic")))
    run.saturate()
    assert run.saturation.stop_reason.value in ("saturated", "iteration_limit"), run.saturation.stop_reason
    return len(gm.graph.nodes), dict(run.saturation.rule_matches)


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_rule_firings_grow_linearly(name):
    small_nodes, small = _firings(name, SMALL)
    big_nodes, big = _firings(name, GROWTH * SMALL)
    assert big_nodes >= (GROWTH - 0.5) * small_nodes, (small_nodes, big_nodes)
    too_many = {rule: (small.get(rule, 0), n) for rule, n in big.items()
                if n > (GROWTH + 1) * small.get(rule, 0) + big_nodes}
    assert not too_many, f"firings at {small_nodes} -> {big_nodes} nodes: {too_many}"
