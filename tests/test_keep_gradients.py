"""A parameter whose last reader a rewrite removed still gets a (zero) gradient in training."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from optimus_eqsat import optimize_graph
from optimus_eqsat.backend import make_backend


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


def test_inference_adds_nothing():
    model = SlicesOneTower()
    gm = torch.fx.symbolic_trace(model)
    optimized = optimize_graph(gm, (torch.randn(3, 4),), mode="inference", raise_on_error=True)
    assert optimized.meta["optimus_eqsat"].kept_gradient_inputs == []
    assert not any(n.op == "get_attr" and n.target.startswith("b") for n in optimized.graph.nodes)
