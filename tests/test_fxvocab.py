"""The FX vocabulary: op tables, op names, and the one way to read a graph's shapes;
and the seams of the cost model built on it (strategies, pricing)."""

from __future__ import annotations

import functools
import logging
import operator

import pytest
import torch
import torch.fx as fx
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

from optimus_eqsat.extract.classify import graph_infos
from optimus_eqsat.extract.cost_model import KernelKind as K
from optimus_eqsat.extract.fx_cost import plan_kernels, predict_kernels, strategy_for
from optimus_eqsat.fxvocab import (
    ALIASING_OPS,
    SHAPE_META,
    VIEW_OPS,
    ExampleInputError,
    TensorInfo,
    canonical_name,
    node_tensor_infos,
    node_values,
    op_kind,
    target_name,
)
from optimus_eqsat.fxvocab.meta import meta_value


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        a, b = x.split(4, dim=1)
        n = x.size(0)
        return torch.relu(self.lin(torch.cat([b, a], dim=1))).reshape(n, 8)


def _mine(x):
    return x


def _node(gm: fx.GraphModule, name: str) -> fx.Node:
    return next(n for n in gm.graph.nodes if n.name == name)


def test_op_tables():
    assert op_kind("relu") is K.POINTWISE and op_kind("relu_") is K.POINTWISE  # in-place as plain
    assert op_kind("broadcast_to") is K.VIEW and op_kind("empty_like") is K.VIEW
    assert op_kind("grouped_linear") is K.MATMUL and op_kind("no_such_op") is None
    assert VIEW_OPS < ALIASING_OPS and "dropout" in ALIASING_OPS - VIEW_OPS


def test_names():
    add = torch.ops.aten.add.Tensor
    assert target_name(add) == "add" and target_name(add, qualified=True) == "aten.add.Tensor"
    assert target_name(torch.ops.aten.add) == "add" and target_name("relu") == "relu"
    partial = functools.partial(torch.add, alpha=2)
    assert target_name(partial) == "partial" and target_name(partial, qualified=True) == repr(partial)
    g = fx.Graph()
    x = g.placeholder("x")
    assert canonical_name(g.call_function(operator.add, (x, x))) == "add"
    assert canonical_name(g.call_method("swapaxes", (x, 0, 1))) == "transpose"
    assert canonical_name(g.call_function(_mine, (x,))) is None  # not a torch function


def test_node_values_run_the_inputs_where_meta_is_missing():
    gm = fx.symbolic_trace(Net())
    values = node_values(gm, (torch.randn(2, 8),))
    assert values[_node(gm, "lin")].shape == (2, 8) and values[_node(gm, "lin")].device.type == "meta"
    split = values[_node(gm, "split")]
    assert isinstance(split, tuple) and [t.shape for t in split] == [(2, 4), (2, 4)]
    assert values[_node(gm, "size")] is None  # holds no tensor
    assert all(v is None for v in node_values(gm).values())  # no meta, no inputs


def test_node_values_read_meta_and_run_nothing_when_it_is_complete():
    gm = fx.symbolic_trace(nn.Sequential(nn.Linear(8, 8), nn.ReLU()))
    ShapeProp(gm).propagate(torch.randn(2, 8))
    wrong = (torch.randn(3, 5),)  # would not run: meta is enough
    values = node_values(gm, wrong)
    assert tuple(values[_node(gm, "_0")].shape) == (2, 8)
    # ShapeProp leaves no meta on a node holding no tensor (x.size(0)): then the inputs run
    traced = fx.symbolic_trace(Net())
    ShapeProp(traced).propagate(torch.randn(2, 8))
    with pytest.raises(ExampleInputError, match="do not run through the graph: at 'lin'"):
        node_values(traced, wrong)


def test_node_values_run_nothing_for_nodes_that_hold_no_tensor():
    """A grad-mode switch or an in-place foreach op (no meta: it holds no tensor) does not make
    the inputs run: a compile would otherwise run the whole graph for nothing (ResNet's
    ``num_batches_tracked`` increments are one foreach op after decomposition)."""
    graph = fx.Graph()
    x, counters = graph.placeholder("x"), graph.placeholder("counters")
    graph.call_function(torch._C._set_grad_enabled, (False,))
    relu = graph.call_function(torch.relu, (x,))
    graph.call_function(torch._C._set_grad_enabled, (True,))
    increment = graph.call_function(torch._foreach_add_, ([counters], 1))
    graph.output(relu)
    gm = fx.GraphModule(nn.Module(), graph)
    ShapeProp(gm).propagate(torch.randn(2, 8), torch.zeros(()))
    increment.meta.clear()  # (as the decomposition leaves the op it adds)
    no_meta = [n.name for n in gm.graph.nodes if n.op == "call_function" and meta_value(n) is None]
    assert no_meta == ["_set_grad_enabled", "_set_grad_enabled_1", "_foreach_add_"]
    wrong = (None, None)  # would not run: meta is enough
    values = node_values(gm, wrong)
    assert tuple(values[relu].shape) == (2, 8)
    assert values[increment] is None


def test_a_run_on_fake_inputs_makes_fake_tensors_from_nothing_and_takes_real_constants():
    """A compile's inputs are fake (DDPOptimizer's pieces come without meta): a dropout's mask
    drawn from nothing and a real constant of the graph must meet them as fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    class Drawn(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.full((4,), 2.0))

        def forward(self, x):
            mask = torch.rand(3, 4) < 0.5  # (a factory: no tensor input)
            return x * mask * self.scale

    gm = fx.symbolic_trace(Drawn())
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.randn(3, 4))
    values = node_values(gm, (x,))
    assert tuple(values[_node(gm, "mul_1")].shape) == (3, 4)
    assert torch.equal(gm.scale, torch.full((4,), 2.0))  # (the run left the module's buffer alone)


def test_shape_meta_counts_only_when_asked():
    gm = fx.symbolic_trace(Net())
    for n in gm.graph.nodes:
        n.meta[SHAPE_META] = TensorInfo((2, 8), 4)
    assert node_values(gm)[_node(gm, "lin")] is None
    assert node_values(gm, shape_meta=True)[_node(gm, "lin")] == TensorInfo((2, 8), 4)
    assert node_tensor_infos(_node(gm, "lin")) == [TensorInfo((2, 8), 4)]


def test_cost_model_predicts_without_shapes_when_inputs_do_not_run(caplog):
    gm = fx.symbolic_trace(Net())
    with caplog.at_level(logging.WARNING):
        infos = graph_infos(gm, (torch.randn(3, 5),))
    assert all(v is None for v in infos.values()) and "did not run" in caplog.text
    assert predict_kernels(gm, (torch.randn(3, 5),))  # still a prediction


def test_fake_inputs_a_graph_reads_values_of_are_no_warning(caplog):
    """Under dynamic shapes the backend's inputs are fake: a graph calling ``.item()`` cannot
    run on them, which is expected (logged at INFO), not the caller's mistake."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    gm = fx.symbolic_trace(lambda x: x * x.sum().item())
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.randn(3, 5))
    with caplog.at_level(logging.INFO):
        graph_infos(gm, (fake,))
    assert "did not run" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_run_for_shapes_restores_state_it_wrote_and_leaves_alone_what_it_did_not(caplog):
    """The module's buffers are put back after a run for shapes; one the run left alone is not
    written, so an input sharing its version counter (a weight moved into a stack of the
    parameter cache is a view of it) is not reported as written by the run."""
    from optimus_eqsat.fxvocab.meta import record_shapes

    class Stacked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn = nn.BatchNorm1d(4)
            self.register_buffer("stack", torch.randn(2, 4, 4))

        def forward(self, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return self.bn(x @ w + x @ self.stack[1])

    model = Stacked().train()
    tracer = fx.Tracer()
    tracer.proxy_buffer_attributes = True  # (the stack read in the graph, not folded as a constant)
    gm = fx.GraphModule(model, tracer.trace(model))
    running = gm.bn.running_mean.clone()
    view = gm.stack[0]  # shares the stack's version counter
    before = view._version
    with caplog.at_level(logging.WARNING):
        record_shapes(gm, (view, torch.randn(8, 4)))
    assert torch.equal(gm.bn.running_mean, running)  # the batch norm's update was undone
    assert view._version == before and "wrote to input" not in caplog.text


def test_strategies_and_pricing_seam():
    with pytest.raises(ValueError, match="unknown code generator"):
        strategy_for("tpu")
    gm = fx.symbolic_trace(Net())
    inputs = (torch.randn(2, 8),)
    for profile in ("h100", "cpu"):
        plans, pricing = plan_kernels(gm, inputs, profile)
        kernels = predict_kernels(gm, inputs, profile)
        # pricing keeps what the fusion model decided: one kernel per plan, same nodes, kind, note
        assert [(p.kind, p.nodes, p.note) for p in plans] == [(k.kind, k.nodes, k.note) for k in kernels]
        assert [k for p in plans for k in pricing.price(p)] == kernels


class _ConvBlock(nn.Module):
    """ResNet's pattern: conv -> training BatchNorm2d -> ReLU twice (two num_batches_tracked
    increments, one foreach op after the decomposition)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).relu()


class _Experts(nn.Module):
    """Three linears, each on its own input: batched into one bmm, whose weights' and biases'
    stacks are new nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([e(part).relu() for e, part in zip(self.experts, x.unbind(0))], 1).sum(1)


class _NormExperts(nn.Module):
    """rechub's expert: linear -> training batch norm -> ReLU, three over one input: the rebuilt
    program computes the norms' statistics with one batched ``var_mean`` (a tuple op, whose
    items the rebuild gives shapes)."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU()) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(e(x) for e in self.experts)


@pytest.mark.parametrize(
    "make",
    [
        lambda: (_ConvBlock(), torch.randn(2, 3, 6, 6)),
        lambda: (_Experts(), torch.randn(3, 4, 8)),
        lambda: (_NormExperts(), torch.randn(4, 8)),
    ],
    ids=["conv", "experts", "norm_experts"],
)
def test_optimizing_a_dynamo_graph_runs_nothing_on_its_inputs(make, monkeypatch: pytest.MonkeyPatch):
    """Dynamo's meta and the rebuild's shapes are enough: the optimizer predicts the original and
    the rebuilt programs without running either on the example inputs (each run is a forward)."""
    from optimus_eqsat import optimize_graph
    from optimus_eqsat.fxvocab import meta as meta_module
    from optimus_eqsat.inductor_count import capture_dynamo_graph

    module, x = make()
    gm, example_inputs = capture_dynamo_graph(module.train(), (x,))
    runs = []
    record = meta_module.record_shapes
    monkeypatch.setattr(meta_module, "record_shapes", lambda *a: runs.append(1) or record(*a))
    result = optimize_graph(gm, example_inputs)
    assert "verify" in result.meta["optimus_eqsat"].phase_seconds  # (both programs were predicted)
    assert runs == []
