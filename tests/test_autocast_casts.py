"""Autocast's casts written into a torch-level graph (optimus_eqsat/autocast_casts.py): the
copy computes without autocast what the graph computes under it, and a rebuilt graph that
autocast would still cast is not kept."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import optimus_eqsat.api
from optimus_eqsat import optimize_graph
from optimus_eqsat.autocast_casts import autocast_casts_in, with_explicit_casts
from optimus_eqsat.fxvocab.symbolic import DeclinedGraph

BF16 = [("cpu", torch.bfloat16)]


class Mixed(nn.Module):
    """A linear (autocast casts its input, weight and bias to bf16), a cat of its bf16 output
    with a float32 input (autocast casts the first up), a layer norm and an add (cast nothing)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 6)
        self.norm = nn.LayerNorm(10)

    def forward(self, x, y):
        return self.norm(torch.cat([self.linear(x), y], 1)) + y.sum()


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g)


def _dynamo_graph(model, inputs, autocast: bool):
    captured = []

    def capture(gm, example_inputs):
        captured.append(gm)
        return gm

    torch._dynamo.reset()
    with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        torch.compile(model, backend=capture, fullgraph=True)(*inputs)
    torch._dynamo.reset()
    return captured[0]


def _parameters(model):
    return [p.detach() for p in model.parameters()]


def _run(gm, model, inputs, autocast: bool):
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        return gm(*_parameters(model)[:2], *inputs, *_parameters(model)[2:])[0]


def _placeholder_order(gm):
    return [n.name for n in gm.graph.nodes if n.op == "placeholder"]


def test_the_copy_computes_without_autocast_what_the_graph_computes_under_it():
    torch.manual_seed(0)
    model, inputs = Mixed(), _inputs()
    gm = _dynamo_graph(model, inputs, autocast=True)
    assert "linear" in _placeholder_order(gm)[0]  # (the weights come first: see _run)
    found = autocast_casts_in(gm, BF16)
    # the linear's three inputs (not the cat's bf16 member: cat promotes it to float32 alike)
    assert len(found) == 3, found
    explicit = with_explicit_casts(gm, BF16).gm
    casts = [n for n in explicit.graph.nodes if n.op == "call_method" and n.target == "to"]
    assert [str(n.args[1]) for n in casts] == ["torch.bfloat16"] * 3
    assert autocast_casts_in(explicit, BF16) == []
    want = _run(gm, model, inputs, autocast=True)
    for autocast in (False, True):
        got = _run(explicit, model, inputs, autocast=autocast)
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert autocast_casts_in(gm, BF16) == found  # (the graph itself is left as it was)


def test_meta_made_without_autocast_does_not_hide_a_cast():
    """A graph traced with autocast off says the linear gives float32; under autocast it gives
    bf16, and the cat casts it back up. The casts are read off the graph run under autocast."""
    torch.manual_seed(0)
    model, inputs = Mixed(), _inputs()
    gm = _dynamo_graph(model, inputs, autocast=False)
    explicit = with_explicit_casts(gm, BF16).gm
    assert len([n for n in explicit.graph.nodes if n.op == "call_method" and n.target == "to"]) == 3
    want = _run(gm, model, inputs, autocast=True)
    got = _run(explicit, model, inputs, autocast=False)
    assert got.dtype == want.dtype and torch.equal(got, want)


def test_a_graph_whose_casts_cannot_be_told_is_declined():
    class Leaf(nn.Module):
        def forward(self, x):
            return F.linear(x, torch.ones(3, x.shape[1]))

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.leaf = Leaf()

        def forward(self, x):
            return self.leaf(x)

    class KeepLeaf(torch.fx.Tracer):
        def is_leaf_module(self, m, qualname):
            return isinstance(m, Leaf) or super().is_leaf_module(m, qualname)

    outer = Outer()
    gm = torch.fx.GraphModule(outer, KeepLeaf().trace(outer))
    next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"] = torch.randn(2, 4)
    try:
        with_explicit_casts(gm, BF16)
    except DeclinedGraph as exc:
        assert "calls a module" in str(exc)
    else:
        raise AssertionError("a module call was not declined")


def test_a_rebuilt_op_that_autocast_would_cast_sends_the_optimizer_back_to_the_original(monkeypatch):
    """A rewrite that brought in an op autocast casts (a float32 matmul) would change what
    precision a value is computed in: the original is kept, and the report says why."""
    rebuild = optimus_eqsat.api.rebuild

    def with_a_float32_matmul(*args, **kwargs):
        result = rebuild(*args, **kwargs)
        graph = result.graph
        x = next(n for n in graph.nodes if n.op == "placeholder" and n.meta["example_value"].dtype == torch.float32)
        output = next(n for n in graph.nodes if n.op == "output")
        with graph.inserting_before(output):
            graph.call_function(torch.mm, (x, graph.call_method("t", (x,))))
        result.recompile()
        return result

    monkeypatch.setattr(optimus_eqsat.api, "rebuild", with_a_float32_matmul)
    torch.manual_seed(0)
    experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
    model = nn.Module()
    model.experts = experts
    model.forward = lambda x: sum(torch.relu(e(x)) for e in experts)
    x = torch.randn(6, 8)
    gm = _dynamo_graph(model, (x,), autocast=True)
    with torch.autocast("cpu", torch.bfloat16):
        report = optimize_graph(gm, mode="training", refine_batches=False).meta["optimus_eqsat"]
    assert report.fell_back and "autocast would cast an op of the rebuilt graph" in report.fallback_reason


def test_checkpointed_regions_are_inlined_and_their_casts_recomputed_with_them():
    from torch.utils.checkpoint import checkpoint

    from optimus_eqsat.checkpoint_regions import checkpoint_calls

    class Checkpointed(nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(3))

        def forward(self, x):
            return sum(checkpoint(e, x, use_reentrant=False) for e in self.experts)

    torch.manual_seed(0)
    model, x = Checkpointed(), torch.randn(4, 8, requires_grad=True)
    gm = _dynamo_graph(model, (x,), autocast=True)
    assert len(checkpoint_calls(gm)) == 3
    explicit = with_explicit_casts(gm, BF16).gm
    assert not checkpoint_calls(explicit)
    casts = [n for n in explicit.graph.nodes if n.op == "call_method" and n.target == "to"]
    assert len(casts) == 9  # each linear's input, weight and bias
    assert all(n.meta.get("recompute") is not None and "ac_graph_id" in n.meta for n in casts)
    assert autocast_casts_in(explicit, BF16) == []


class Regions(nn.Module):
    """A bf16 autocast region holding a linear and, nested in it, a float32 region (autocast
    off) holding another; the linears then meet in an add (which promotes to float32 by itself)."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = self.first(x)
            with torch.autocast("cpu", enabled=False):
                z = self.second(y.float())
            w = y + z
        return w.relu()


def _state_switches(gm):
    names = ("_enter_autocast", "_exit_autocast")
    return [n for n in gm.graph.nodes if getattr(n.target, "__name__", "") in names]


def test_an_autocast_regions_casts_are_written_and_the_region_dropped():
    model, x = Regions(), torch.randn(5, 8)
    gm = _dynamo_graph(model, (x,), autocast=False)
    assert len(_state_switches(gm)) == 4 and autocast_casts_in(gm, []) != []  # (the bf16 region's linear)
    explicit = with_explicit_casts(gm, []).gm
    assert _state_switches(explicit) == [] and autocast_casts_in(explicit, []) == []
    casts = [n.args[1] for n in explicit.graph.nodes if n.op == "call_method" and n.target == "to"]
    assert list(map(str, casts)) == ["torch.bfloat16"] * 3  # (the first linear's x, weight and bias)
    with torch.no_grad():
        want, got = model(x), explicit(*_parameters(model)[:2], x, *_parameters(model)[2:])[0]
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_region_turning_autocast_off_inside_autocast_in_force_runs_the_copy_with_it_off():
    """Dropped, the region's float32 linear would be cast to bf16 by the autocast around it: the
    copy is marked to run with autocast off, and wrapped so, computes under it what it must."""
    from optimus_eqsat.autocast_casts import without_autocast

    model, x = Regions(), torch.randn(5, 8)
    with torch.autocast("cpu", torch.bfloat16):
        gm = _dynamo_graph(model, (x,), autocast=True)  # (the bf16 region is no change here)
    explicit = with_explicit_casts(gm, BF16)
    assert explicit.needs_autocast_off and autocast_casts_in(explicit.gm, BF16) != []
    without_autocast(explicit.gm, ["cpu"])
    assert autocast_casts_in(explicit.gm, BF16) == []
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        want = model(x)
        got = explicit.gm(*_parameters(model)[:2], x, *_parameters(model)[2:])[0]
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not with_explicit_casts(_dynamo_graph(model, (x,), autocast=False), []).needs_autocast_off


def test_an_autocast_region_that_does_not_close_in_the_graph_is_declined():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.randn(2, 4)
    graph.call_function(torch.amp.autocast_mode._enter_autocast, ("cpu", torch.bfloat16, True, None))
    graph.output(graph.call_function(torch.nn.functional.linear, (x, graph.get_attr("weight"))))
    root = nn.Module()
    root.weight = nn.Parameter(torch.randn(3, 4))
    try:
        with_explicit_casts(torch.fx.GraphModule(root, graph), [])
    except DeclinedGraph as exc:
        assert "does not close" in str(exc)
    else:
        raise AssertionError("an unclosed region was not declined")
