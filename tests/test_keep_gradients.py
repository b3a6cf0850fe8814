"""A parameter whose last reader a rewrite removed still gets a (zero) gradient in training,
and one no output depended on gets none, as in eager, though a rewrite batched its layer."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from optimus_eqsat import optimize_graph
from optimus_eqsat.backend import OptimusBackend, make_backend


class SlicesOneTower(nn.Module):
    """Two towers concatenated, then only the first one's columns kept: split/cat rules read
    ``a`` alone, and ``b`` no longer takes part (eager gives it zero gradients)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        return torch.cat([self.a(x), self.b(x)], dim=1).narrow(1, 0, 4) * 2.0


def _grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    return {name: p.grad for name, p in model.named_parameters()}


def test_a_dropped_parameter_gets_zero_gradients_through_the_backend():
    torch.manual_seed(0)
    model, twin = SlicesOneTower(), None
    twin = copy.deepcopy(model)
    x = torch.randn(3, 4)
    backend = make_backend(measure=False, profile="h100", raise_on_error=True)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    compiled(x).sum().backward()
    twin(x).sum().backward()
    ours, eager = _grads(model), _grads(twin)
    assert eager["b.weight"] is not None and not eager["b.weight"].any()
    for name, grad in eager.items():
        assert ours[name] is not None, name
        torch.testing.assert_close(ours[name], grad)
    assert any(r.kept_gradient_inputs for r in backend.reports)


def _dnn(i: int, o: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(i, o), nn.BatchNorm1d(o), nn.ReLU(inplace=True))


class UnusedSharedGate(nn.Module):
    """A multi-task model's last extraction level (deepctr's PLE): the shared experts and the
    shared gate read the same input through same-shaped layers; the gate's result goes unused
    there, but its batch norm still updates its statistics (so the layer stays in the graph).
    ``write_back``: the gate's result is added in place into a tensor an output reads."""

    def __init__(self, write_back: bool = False) -> None:
        super().__init__()
        self.write_back = write_back
        self.bottom = _dnn(10, 16)
        self.experts = nn.ModuleList(_dnn(16, 16) for _ in range(2))
        self.shared_gate = _dnn(16, 16)
        self.gate_final = nn.Linear(16, 2, bias=False)
        self.tower = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.bottom(x)
        outs = [e(h) for e in self.experts]
        gate = self.gate_final(self.shared_gate(h)).softmax(1)
        shared = gate[:, :1] * outs[0] + gate[:, 1:] * outs[1]  # unused without write_back
        mixed = outs[0] + outs[1]
        if self.write_back:
            mixed.add_(shared)
        return torch.sigmoid(self.tower(mixed))


def _train_both(model: nn.Module, x: torch.Tensor) -> tuple[dict, dict, OptimusBackend]:
    twin = copy.deepcopy(model)
    backend = make_backend(measure=False, raise_on_error=True)
    torch._dynamo.reset()
    torch.compile(model, backend=backend)(x).sum().backward()
    torch._dynamo.reset()
    twin(x).sum().backward()
    return _grads(model), _grads(twin), backend


def test_a_layer_no_output_reads_gets_no_gradient_when_batched_with_live_ones():
    """Batched with the experts, the unused gate's linear took zero gradients where eager
    leaves None (weight decay and optimizer state then touch it)."""
    torch.manual_seed(0)
    ours, eager, backend = _train_both(UnusedSharedGate(), torch.randn(32, 10))
    assert eager["shared_gate.0.weight"] is None
    for name, grad in eager.items():
        assert (ours[name] is None) == (grad is None), name
        if grad is not None:
            torch.testing.assert_close(ours[name], grad, rtol=1e-4, atol=1e-5)
    assert backend.reports[0].changed and backend.reports[0].batched


class DetachedExperts(nn.Module):
    """Four same-shaped experts of one input, two of them detached (a stop-gradient branch):
    eager gives their parameters no gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        live = [e(x).relu() for e in self.experts[:2]]
        stopped = [e(x).detach().relu() for e in self.experts[2:]]
        return torch.stack(live + stopped).sum(0)


def test_a_detached_layer_gets_no_gradient_when_batched_with_live_ones():
    """A ``detach`` cuts the gradient where the edges still reach an output: batched with the
    live experts, the detached ones' weights took zero gradients where eager leaves None."""
    torch.manual_seed(0)
    ours, eager, backend = _train_both(DetachedExperts(), torch.randn(16, 8))
    assert eager["experts.2.weight"] is None and eager["experts.0.weight"] is not None
    for name, grad in eager.items():
        assert (ours[name] is None) == (grad is None), name
        if grad is not None:
            torch.testing.assert_close(ours[name], grad, rtol=1e-4, atol=1e-5)
    assert backend.reports[0].batched.get("batch-linear", 0) == 4


def test_an_input_written_into_a_read_tensor_keeps_its_gradient():
    """The gate's result added in place into a tensor the output reads: the graph's edges do
    not show that dependence, so nothing is cut, and the gate's gradients are eager's."""
    torch.manual_seed(0)
    ours, eager, _ = _train_both(UnusedSharedGate(write_back=True), torch.randn(32, 10))
    assert eager["shared_gate.0.weight"] is not None
    for name, grad in eager.items():
        assert ours[name] is not None, name
        torch.testing.assert_close(ours[name], grad, rtol=1e-4, atol=1e-5)


def test_a_dropped_attribute_of_a_traced_graph_is_read_again_in_training():
    model = SlicesOneTower()
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(3, 4)
    optimized = optimize_graph(gm, (x,), mode="training", raise_on_error=True)
    report = optimized.meta["optimus_eqsat"]
    assert {"b.weight", "b.bias"} <= set(report.kept_gradient_inputs), report.kept_gradient_inputs
    optimized(x).sum().backward()
    assert model.b.weight.grad is not None and not model.b.weight.grad.any()  # the same Parameter
    torch.testing.assert_close(optimized(x), model(x))


class SlicesOneInput(nn.Module):
    """Two inputs concatenated, then only the first one's columns kept: ``y`` no longer takes
    part after the split/cat rules, and eager gives it a zero gradient."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x, y):
        return self.a(torch.cat([x, y], dim=1).narrow(1, 0, 4))


def test_a_dropped_input_of_a_traced_graph_without_meta_is_read_again_in_training():
    """symbolic_trace leaves placeholders without meta: the input's dtype is read from the
    example inputs (it was taken for non-float, and ``y`` got no gradient)."""
    gm = torch.fx.symbolic_trace(SlicesOneInput())
    assert not any(n.meta for n in gm.graph.nodes if n.op == "placeholder")
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    optimized = optimize_graph(gm, (x, y), mode="training", raise_on_error=True)
    assert "y" in optimized.meta["optimus_eqsat"].kept_gradient_inputs
    x.requires_grad_(), y.requires_grad_()
    optimized(x, y).sum().backward()
    assert y.grad is not None and not y.grad.any()
    torch.testing.assert_close(optimized(x, y), gm(x, y))


class CheckpointedLayer(nn.Module):
    """A layer called through activation checkpointing: kept whole as a module call."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.inner, x, use_reentrant=False)


class SlicesOneCheckpointedLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = CheckpointedLayer(), CheckpointedLayer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.a(x), self.b(x)], 1).narrow(1, 4, 4) * 2.0


def test_a_module_call_whose_result_went_unused_reads_no_parameter():
    """The rewrite leaves ``self.a(x)`` in the graph (a module call, run for what it may
    write) with no reader: it gives its parameters no gradient, so they are read again."""

    class Leaves(torch.fx.Tracer):
        def is_leaf_module(self, m: nn.Module, name: str) -> bool:
            return isinstance(m, CheckpointedLayer) or super().is_leaf_module(m, name)

    model = SlicesOneCheckpointedLayer()
    gm = torch.fx.GraphModule(model, Leaves().trace(model))
    x = torch.randn(3, 4)
    optimized = optimize_graph(gm, (x,), mode="training", raise_on_error=True, never_worse=False)
    assert {"a.inner.0.weight", "a.inner.0.bias"} <= set(optimized.meta["optimus_eqsat"].kept_gradient_inputs)
    optimized(x).sum().backward()
    assert model.a.inner[0].weight.grad is not None and not model.a.inner[0].weight.grad.any()
    assert model.b.inner[0].weight.grad is not None and model.b.inner[0].weight.grad.any()


def test_inference_adds_nothing():
    model = SlicesOneTower()
    gm = torch.fx.symbolic_trace(model)
    optimized = optimize_graph(gm, (torch.randn(3, 4),), mode="inference", raise_on_error=True)
    assert optimized.meta["optimus_eqsat"].kept_gradient_inputs == []
    assert not any(n.op == "get_attr" and n.target.startswith("b") for n in optimized.graph.nodes)


def test_only_local_writes_let_dependence_be_read_from_the_edges():
    """A write to a tensor nothing else reads is local; one through a conversion that may return
    its input (``x.float()`` on a float tensor), or to a tensor read again, is not."""
    from optimus_eqsat.keep_gradients import _writes_are_local

    class Local(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.relu(self.lin(x), inplace=True)

    assert _writes_are_local(torch.fx.symbolic_trace(Local()))
    assert not _writes_are_local(torch.fx.symbolic_trace(lambda x: x.float().relu_()))

    def read_again(x: torch.Tensor) -> torch.Tensor:
        h = x * 2
        h.add_(1)
        return h + 1

    assert not _writes_are_local(torch.fx.symbolic_trace(read_again))
