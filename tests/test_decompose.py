"""Rewrites before translation (optimus_eqsat/decompose.py): private in-place ops made
out-of-place and eval-mode batch norms made elementwise, so MLP experts written as the
recommendation libraries write them (Linear, BatchNorm1d, ReLU(inplace=True)) batch;
numerics and gradients against eager, and the cases that must stay as they are."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from optimus_eqsat import optimize_graph
from optimus_eqsat.backend import make_backend
from optimus_eqsat.decompose import before_translation
from optimus_eqsat.inductor_count import capture_dynamo_graph
from tests.helpers import optimize_and_check


class Experts(nn.Module):
    """Experts of Linear -> BatchNorm1d -> ReLU(inplace=True) -> Dropout, twice, stacked."""

    def __init__(self, n: int = 4, width: int = 8, dropout: float = 0.1):
        super().__init__()
        self.experts = nn.ModuleList(
            nn.Sequential(
                nn.Linear(16, width),
                nn.BatchNorm1d(width),
                nn.ReLU(inplace=True),
                nn.Dropout(dropout),
                nn.Linear(width, width),
                nn.BatchNorm1d(width),
                nn.ReLU(inplace=True),
            )
            for _ in range(n)
        )
        for m in self.modules():
            if isinstance(m, nn.BatchNorm1d):  # statistics far from the identity
                nn.init.normal_(m.weight)
                nn.init.normal_(m.bias)
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return torch.stack([e(x) for e in self.experts], 1)


def _compiled(model: nn.Module, **options):
    backend = make_backend(inductor=False, measure=False, raise_on_error=True, **options)
    torch._dynamo.reset()
    return torch.compile(model, backend=backend), backend


@pytest.mark.parametrize("profile", ["h200", "cpu"])
def test_library_style_experts_batch_in_inference(profile):
    torch.manual_seed(0)
    model = Experts().eval()
    x = torch.randn(6, 16)
    compiled, backend = _compiled(copy.deepcopy(model), profile=profile)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
    [report] = backend.reports
    assert not report.opaque_nodes, report.opaque_nodes  # nothing left opaque by the ReLUs or norms
    assert report.batched.get("batch-linear", 0) >= 8 and report.launches_after < report.launches_before


def test_experts_train_with_their_gradients():
    """Training mode: the batch norms use batch statistics and update their running ones (kept
    as they are); the in-place ReLUs after them are made out-of-place; gradients match eager."""
    torch.manual_seed(0)
    model = Experts(dropout=0.0).train()  # (random masks are drawn in another order when compiled)
    ours = copy.deepcopy(model)
    x = torch.randn(6, 16)
    compiled, backend = _compiled(ours, profile="h200")
    torch.manual_seed(1)
    want = model(x)
    torch.manual_seed(1)
    got = compiled(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    seed = torch.randn_like(want)
    want.backward(seed)
    got.backward(seed)
    # (the gradients of the biases before a norm are zero up to float noise: compared on the
    # scale of the largest gradient)
    scale = max(p.grad.abs().max().item() for p in model.parameters())
    for p, q in zip(model.parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6 * scale)
    for p, q in zip(model.buffers(), ours.buffers()):  # running statistics updated alike
        torch.testing.assert_close(q, p)
    # A training norm writes its statistics, not its result: the ReLU writing into that result
    # is private, so nothing but the statistics' updates stays opaque, and the experts batch.
    [report] = backend.reports
    assert all(
        why == "reads or writes mutated memory" and name.startswith("_foreach")
        for name, why in report.opaque_nodes.items()
    ), report.opaque_nodes
    assert report.batched.get("batch-linear", 0) >= 8 and report.launches_after < report.launches_before


def _targets(gm: torch.fx.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method")]


def test_in_place_ops_that_others_could_observe_stay():
    """A write into a graph input, into a view of a value read again, or into a value another
    node reads: all visible, all kept in place (and the optimized program stays right)."""

    def f(x, y):
        a = x * 2.0
        v = a[:, :4]
        v.relu_()  # writes into a through a view: a is read below
        b = y + 1.0
        c = torch.relu(b)
        b.sigmoid_()  # b is read by c before: not private
        x.tanh_()  # a graph input
        return a + c.sum() + b.sum()

    x, y = torch.randn(3, 8), torch.randn(3, 8)
    gm, ex = capture_dynamo_graph(f, (x.clone(), y.clone()))
    assert before_translation(gm) is gm
    got_x, got_y = x.clone(), y.clone()
    optimized = optimize_graph(gm, [got_x, got_y], raise_on_error=True)
    want_x = x.clone()
    want = f(want_x, y.clone())
    out = optimized(x.clone(), y.clone())
    torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, want)


def test_private_in_place_spellings_become_out_of_place():
    def f(x):
        a = torch.relu_(x * 2.0)
        b = (a + 1.0).sigmoid_()
        c = F.relu(b - 0.5, inplace=True)
        return F.hardtanh(c * 3.0, -1.0, 1.0, True)

    x = torch.randn(4, 5)
    gm, _ = capture_dynamo_graph(f, (x,))
    rewritten = before_translation(gm)
    assert rewritten is not gm and _targets(gm) != _targets(rewritten)
    assert torch.relu_ not in _targets(rewritten) and "sigmoid_" not in _targets(rewritten)
    assert all(not n.kwargs.get("inplace") for n in rewritten.graph.nodes)
    torch.testing.assert_close(rewritten(x)[0], f(x.clone()))
    assert _targets(before_translation(gm)) == _targets(rewritten)


def test_augmented_assignment_into_a_private_tensor_becomes_out_of_place():
    """``y += b`` on a fresh tensor nothing else reads is ``y + b`` (deepctr's PredictionLayer
    adds its bias so); where ``+`` would promote the dtype, the in-place op stays."""
    import operator

    def f(x, b, h):
        y = torch.mm(x, x.t())
        y += b
        z = (x * 2.0).half()
        z += h  # z + h would be float32: z += h stays half
        return torch.sigmoid(y), z

    x, b, h = torch.randn(4, 5), torch.randn(4), torch.randn(4, 5)
    gm, _ = capture_dynamo_graph(f, (x, b, h))
    rewritten = before_translation(gm)
    assert _targets(rewritten).count(operator.iadd) == 1 and operator.add in _targets(rewritten)
    for got, want in zip(rewritten(x, b, h), f(x, b, h)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)


def test_in_place_methods_without_a_known_out_of_place_twin_stay():
    """requires_grad_'s twin is an attribute and resize_'s a deprecated alias: not rewritten."""

    def f(x):
        return (x * 2.0).requires_grad_(), (x + 1.0).resize_(4)

    gm = torch.fx.symbolic_trace(f)
    assert before_translation(gm) is gm


def test_symbolic_trace_in_place_relu_module():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 4), nn.ReLU(inplace=True))
    optimize_and_check(model, torch.randn(3, 4))
    gm = torch.fx.symbolic_trace(model)
    assert [n.op for n in before_translation(gm).graph.nodes].count("call_module") == 2  # the linears


def test_batch_norms_that_stay():
    """An eval-mode norm of rank 3 and a training-mode norm with nothing to batch with keep
    their batch norm; training-mode norms of one shape become their normalization and the
    in-place updates of their statistics."""

    class Norms(nn.Module):
        def __init__(self):
            super().__init__()
            self.no_stats = nn.BatchNorm1d(4, track_running_stats=False)
            self.seq = nn.BatchNorm1d(4)

        def forward(self, x, s):
            return self.no_stats(x), self.seq(s)

    model = Norms().eval()
    gm, _ = capture_dynamo_graph(model, (torch.randn(3, 4), torch.randn(3, 4, 5)))
    targets = _targets(before_translation(gm))
    assert targets.count(F.batch_norm) == 2 and torch._foreach_add_ not in targets
    gm, _ = capture_dynamo_graph(Experts().train(), (torch.randn(3, 16),))
    targets = _targets(before_translation(gm))
    # the 8 norms' statistics: one scaling, one update of the means and one of the variances;
    # their num_batches_tracked: one increment
    assert F.batch_norm not in targets and targets.count(torch.var_mean) == 8
    assert targets.count(torch._foreach_mul_) == 1 and targets.count(torch._foreach_add_) == 3
