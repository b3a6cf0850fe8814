"""Unchanged nodes keep their meta, an unchanged program its prediction (node_computations)."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx

from benchmarks.synthetic import residual_adds
from optimus_eqsat import api, optimize_graph
from optimus_eqsat.fx_graphs import copy_module
from optimus_eqsat.node_computations import same_program
from optimus_eqsat.rebuild import propagate_meta
from tests.test_propagate_meta import _dynamo_graph, _no_fallback, _reference, _snapshot


def _chain(mul=operator.mul, scale=2.0) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(torch.relu, (x,))
    b = graph.call_function(mul, (a, scale))
    graph.output(graph.call_function(torch.sin, (b,)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_same_program_compares_names_ops_and_arguments():
    gm = _chain()
    assert same_program(copy_module(gm), gm)
    assert same_program(_chain(mul=torch.mul), gm)  # one op, two spellings
    assert not same_program(_chain(scale=3.0), gm)
    assert not same_program(_chain(mul=torch.add), gm)
    assert not same_program(_two_branches(relu_first=False), _two_branches(relu_first=True))


def _two_branches(relu_first: bool) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    ops = [("relu", torch.relu), ("sin", torch.sin)]
    made = {name: graph.call_function(op, (x,), name=name) for name, op in (ops if relu_first else ops[::-1])}
    graph.output((made["relu"], made["sin"]))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


class Chain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x):
        a = self.lin(x.t().t()).relu()  # (views, then values that require grad in training)
        b = a * 2
        c = b.t()
        return c + 1


@pytest.mark.parametrize("grad", [False, True])
def test_rebuilt_nodes_that_compute_what_they_did_keep_their_values(monkeypatch, grad):
    gm, example_inputs = _dynamo_graph(Chain(), torch.randn(4, 6), grad=grad)  # (Dynamo's meta)
    changed = copy_module(gm)
    mul = next(n for n in changed.graph.nodes if n.op == "call_function" and n.target is operator.mul)
    with changed.graph.inserting_before(mul):
        narrow = changed.graph.call_function(torch.narrow, (mul.args[0], 1, 0, 3))
    mul.args = (narrow, 2)  # b = a[:, :3] * 2: b, c and the output change shape
    linear = next(n for n in changed.graph.nodes if n.target is torch._C._nn.linear)
    with changed.graph.inserting_before(linear):  # a new view just before a kept value
        changed.graph.call_function(torch.t, (linear.args[0],))
    changed.recompile()
    _no_fallback(monkeypatch)
    with torch.set_grad_enabled(grad):
        assert propagate_meta(changed, reference=gm)
        ref = _reference(changed, example_inputs)
    assert _snapshot(changed, placeholder_grad=False) == ref[1]
    before = {n.name: n.meta["example_value"] for n in gm.graph.nodes if "example_value" in n.meta}
    after = {n.name: n.meta.get("val") for n in changed.graph.nodes}
    order = list(changed.graph.nodes)
    for k, n in enumerate(order):
        if n.op == "call_function" and n.name in before:  # kept above the change, run again below it
            old, new = before[n.name], after[n.name]
            kept = new is old or (old.requires_grad and _same_storage(new, old))  # (or detached)
            assert kept == (k < order.index(mul)), n.name


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata and a.stride() == b.stride()


def test_an_unchanged_program_is_predicted_once(monkeypatch):
    gm, _ = residual_adds(60)
    calls = []
    predict = api.predict
    monkeypatch.setattr(api, "predict", lambda *a, **k: calls.append(a[0]) or predict(*a, **k))
    out = optimize_graph(gm, raise_on_error=True)
    report = out.meta["optimus_eqsat"]
    assert len(calls) == 1 and not report.fell_back
    assert (report.launches_after, report.cost_after) == (report.launches_before, report.cost_before)
    x = torch.randn(2, 16)
    torch.testing.assert_close(out(x), gm(x))
