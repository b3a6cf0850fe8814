"""Batching linears of different shapes into one grouped-GEMM call (issue #4, group_linear).

The cost model decides. On the CPU profile the call runs one F.linear per
member and never pays. On GPU profiles it is one launch, but its measured host
time (cost_model.DeviceProfile.grouped_host_s*, from an H200 run) makes it lose
to plain linears too; ``CHEAP_HOST`` is an H100 profile whose grouped call has
a negligible host path (what a C++ dispatcher would give), under which it is
extracted, so the rewrite, the rebuild and the numerics are still exercised.
"""

from __future__ import annotations

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

from optimus_eqsat import optimize_graph
from optimus_eqsat.extract.cost_model import get_profile
from optimus_eqsat.extract.fx_cost import predict_kernels
from optimus_eqsat.kernels import grouped_linear
from tests.helpers import assert_same_numerics, op_counts, optimize_and_check

SHAPES = [(8, 3), (16, 5), (4, 7), (8, 2)]  # (in, out) per head: all different
WIDTH = sum(k for k, _ in SHAPES)
CHEAP_HOST = get_profile("h100", grouped_host_s=0.0, grouped_host_s_per_member=2e-7)


class Heads(nn.Module):
    """Independent heads of different shapes on slices of one dense block (with and without bias)."""

    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(k, n, bias=i % 2 == 0) for i, (k, n) in enumerate(SHAPES))

    def forward(self, x):
        pieces = torch.split(x, [k for k, _ in SHAPES], dim=1)
        return tuple(torch.sigmoid(self.heads[i](pieces[i])) for i in range(len(SHAPES)))


class Chain(nn.Module):
    """Linears that depend on each other: never one group."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 6), nn.Linear(6, 4), nn.Linear(4, 3)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


class StackedExperts(nn.Module):
    """Same-shaped linears whose weights are slices of one 3-D parameter: stacking them is free,
    so the bmm alternative costs less than the grouped call and wins even on a GPU profile."""

    def __init__(self, n: int = 6):
        super().__init__()
        self.n = n
        self.w = nn.Parameter(torch.randn(n, 5, 8))

    def forward(self, x):
        return torch.stack([F.linear(x[:, i], self.w[i]) for i in range(self.n)], 1)


def grouped_calls(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is grouped_linear)


def test_measured_host_time_keeps_plain_linears_on_h100():
    optimized = optimize_and_check(Heads(), torch.randn(4, WIDTH), profile="h100")
    assert grouped_calls(optimized) == 0
    assert op_counts(optimized)["linear"] == len(SHAPES)


def test_different_shapes_become_one_grouped_call_on_gpu_profiles():
    optimized = optimize_and_check(Heads(), torch.randn(4, WIDTH), profile=CHEAP_HOST)
    report = optimized.meta["optimus_eqsat"]
    assert report.batched.get("batch-group_linear") == len(SHAPES), report.batched
    assert grouped_calls(optimized) == 1
    assert op_counts(optimized)["linear"] == 0, dict(op_counts(optimized))
    # 4 addmm + 4 sigmoid kernels before; one grouped call + the sigmoids after
    assert report.launches_before == 2 * len(SHAPES)
    assert report.launches_after < report.launches_before
    kernels = predict_kernels(optimized, (torch.randn(4, WIDTH),), CHEAP_HOST)
    assert sum(1 for k in kernels if k.note.startswith("grouped_linear")) == 1


def test_grouped_call_is_not_chosen_on_cpu():
    optimized = optimize_and_check(Heads(), torch.randn(4, WIDTH), profile="cpu")
    report = optimized.meta["optimus_eqsat"]
    assert "batch-group_linear" not in report.batched  # cannot pay on the CPU: not even built
    assert grouped_calls(optimized) == 0
    assert op_counts(optimized)["linear"] == len(SHAPES), dict(op_counts(optimized))


def test_dependent_linears_are_not_grouped():
    optimized = optimize_and_check(Chain(), torch.randn(4, 8), profile=CHEAP_HOST)
    assert grouped_calls(optimized) == 0
    assert not optimized.meta["optimus_eqsat"].batched.get("batch-group_linear")


def test_same_shape_prefers_bmm_when_its_stacks_are_free():
    optimized = optimize_and_check(StackedExperts(), torch.randn(4, 6, 8), profile=CHEAP_HOST)
    report = optimized.meta["optimus_eqsat"]
    assert report.batched.get("batch-group_linear") == 6 and report.batched.get("batch-linear") == 6
    assert grouped_calls(optimized) == 0 and op_counts(optimized)["matmul"] == 1, dict(op_counts(optimized))


def test_dynamo_graph_forward_and_gradients():
    model = Heads()
    x = torch.randn(4, WIDTH)
    captured = []

    def backend(gm, example_inputs):
        captured.append((gm, list(example_inputs)))
        return gm

    torch._dynamo.reset()
    torch.compile(model, backend=backend, fullgraph=True)(x)
    gm, example = captured[0]
    optimized = optimize_graph(gm, example, profile=CHEAP_HOST, raise_on_error=True)
    assert grouped_calls(optimized) == 1
    assert not any(n.target is F.linear for n in optimized.graph.nodes)
    # parameters are graph inputs in Dynamo graphs: their gradients are compared too
    assert_same_numerics(gm, optimized, tuple(t.detach() for t in example))


def test_grouped_call_is_priced_as_one_launch_on_gpu_and_per_member_on_cpu():
    def fn(a, b, c, wa, wb, wc, ba):
        return grouped_linear([a, b, c], [wa, wb, wc], [ba, None, None])

    example = (
        torch.randn(4, 8),
        torch.randn(4, 16),
        torch.randn(2, 3, 4),
        torch.randn(3, 8),
        torch.randn(5, 16),
        torch.randn(7, 4),
        torch.randn(3),
    )
    gm = torch.fx.symbolic_trace(fn)
    gpu = predict_kernels(gm, example, CHEAP_HOST)
    cpu = predict_kernels(gm, example, "cpu")
    assert len(gpu) == 1 and gpu[0].flops == 2.0 * (4 * 3 * 8 + 4 * 5 * 16 + 6 * 7 * 4)
    assert len(cpu) == 3
    plain = torch.fx.symbolic_trace(
        lambda a, b, c, wa, wb, wc, ba: (F.linear(a, wa, ba), F.linear(b, wb), F.linear(c, wc))
    )
    assert sum(k.seconds for k in cpu) > sum(k.seconds for k in predict_kernels(plain, example, "cpu"))
    assert gpu[0].seconds < sum(k.seconds for k in predict_kernels(plain, example, CHEAP_HOST))
