"""Grad-mode and autocast regions inside a forward: never batched across, no-op regions ignored."""

from __future__ import annotations

import copy

import torch
from torch import nn

from optimus_eqsat import optimize_graph
from optimus_eqsat.backend import make_backend
from optimus_eqsat.fxvocab.global_state import state_changes, traced_state


class Experts(nn.Module):
    """Eight same-shaped experts of one input, the last four under a region (``region``: a context
    manager factory, or None for none), stacked and summed."""

    def __init__(self, region=None):
        super().__init__()
        self.region = region
        self.experts = nn.ModuleList(nn.Linear(16, 8) for _ in range(8))

    def forward(self, x):
        outs = [e(x).relu() for e in self.experts[:4]]
        if self.region is None:
            outs += [e(x).relu() for e in self.experts[4:]]
        else:
            with self.region():
                outs += [e(x).relu() for e in self.experts[4:]]
        return torch.stack([o.float() for o in outs]).sum(0)


def _dynamo_graph(model, x):
    captured = []

    def capture(gm, example_inputs):
        captured.append((gm, example_inputs))
        return gm

    torch._dynamo.reset()
    torch.compile(model, backend=capture, fullgraph=True)(x)
    return captured[0]


def _bf16_autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def _autocast_off():
    return torch.autocast("cpu", enabled=False)


def test_a_no_grad_region_is_not_batched_with_the_experts_that_train():
    model, x = Experts(torch.no_grad), torch.randn(32, 16)
    gm, inputs = _dynamo_graph(model, x)
    assert [c.split(":")[0] for c in state_changes(gm)] == ["_set_grad_enabled", "_set_grad_enabled_1"]
    optimized = optimize_graph(gm, mode="training")
    report = optimized.meta["optimus_eqsat"]
    assert report.fell_back and "grad-mode or autocast regions" in report.fallback_reason


def test_the_backend_leaves_a_no_grad_regions_parameters_without_gradients():
    model, x = Experts(torch.no_grad), torch.randn(32, 16)
    ours = copy.deepcopy(model)
    backend = make_backend(measure=False)
    torch._dynamo.reset()
    torch.compile(ours, backend=backend)(x).sum().backward()
    model(x).sum().backward()
    assert [p.grad is None for p in ours.parameters()] == [p.grad is None for p in model.parameters()]
    assert any(r.fallback_reason and "grad-mode" in r.fallback_reason for r in backend.reports)


def test_an_autocast_region_keeps_its_precision():
    model, x = Experts(_bf16_autocast), torch.randn(32, 16)
    gm, inputs = _dynamo_graph(model, x)
    assert state_changes(gm) and "autocast cpu on" in state_changes(gm)[0]
    optimized = optimize_graph(gm, mode="training")
    assert optimized.meta["optimus_eqsat"].fell_back
    torch.testing.assert_close(optimized(*inputs), gm(*inputs), rtol=0, atol=0)


def test_a_region_that_changes_nothing_is_still_optimized():
    """``autocast(enabled=False)`` (Hugging Face's rotary embeddings) outside any autocast."""
    model, x = Experts(_autocast_off), torch.randn(32, 16)
    gm, inputs = _dynamo_graph(model, x)
    assert state_changes(gm) == []
    optimized = optimize_graph(gm, mode="training")
    report = optimized.meta["optimus_eqsat"]
    assert not report.fell_back and sum(report.batched.values()) > 0
    torch.testing.assert_close(optimized(*inputs), gm(*inputs))


def test_the_state_in_force_decides_what_a_region_changes():
    """Under the caller's bf16 autocast, a bf16 region is no change and an ``enabled=False``
    region is one."""
    x = torch.randn(32, 16)
    with _bf16_autocast():
        same, _ = _dynamo_graph(Experts(_bf16_autocast), x)
        off, _ = _dynamo_graph(Experts(_autocast_off), x)
        assert state_changes(same) == []
        assert state_changes(off) and "autocast cpu off" in state_changes(off)[0]
    assert state_changes(same) and "autocast cpu on" in state_changes(same)[0]


def test_the_program_cache_keys_on_the_autocast_state_of_every_device():
    outside = traced_state()
    with _bf16_autocast():
        inside = traced_state()
    with torch.no_grad():
        no_grad = traced_state()
    assert len({outside, inside, no_grad}) == 3


def test_a_region_inside_a_checkpointed_function_is_seen():
    """The optimizer inlines checkpoint bodies; a no-grad region in one must decline too."""
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Experts(torch.no_grad)

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False)

    gm, _ = _dynamo_graph(Checkpointed(), torch.randn(32, 16))
    assert any("grad mode off" in c for c in state_changes(gm))


def test_stack_parameters_leaves_a_model_with_a_no_grad_region_alone():
    from optimus_eqsat import stack_parameters
    from optimus_eqsat.stacking import stacked_groups

    model, x = Experts(torch.no_grad), torch.randn(32, 16)
    names = [n for n, _ in model.named_parameters()]
    stack_parameters(model, (x,))
    assert stacked_groups(model) == [] and [n for n, _ in model.named_parameters()] == names
