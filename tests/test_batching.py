"""Batching family: each pattern as a torch module; op counts after optimization,
and forward and gradients against eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from optimus_eqsat import optimize_graph
from optimus_eqsat.api import OptimizationRun, OptimizeOptions
from optimus_eqsat.fxvocab import canonical_name
from tests.helpers import assert_same_numerics, op_counts, optimize_and_check

FEATURES, WIDTH = 6, 8


class Towers(nn.Module):
    """Per-feature linear + relu on slices of one dense block, concatenated back."""

    def __init__(self, bias: bool = True):
        super().__init__()
        self.towers = nn.ModuleList(nn.Linear(WIDTH, 5, bias=bias) for _ in range(FEATURES))

    def forward(self, x):
        pieces = torch.split(x, WIDTH, dim=1)
        return torch.cat([torch.relu(self.towers[i](pieces[i])) for i in range(FEATURES)], dim=1)


class SharedInput(nn.Module):
    """Linears of different widths reading one input (Inductor's batch_linear_lhs)."""

    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(WIDTH, 3 + i) for i in range(4))

    def forward(self, x):
        return tuple(torch.sigmoid(h(x)) for h in self.heads)


class Norms(nn.Module):
    def __init__(self):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(WIDTH) for _ in range(FEATURES))
        for n in self.norms:  # non-trivial affine parameters
            nn.init.normal_(n.weight)
            nn.init.normal_(n.bias)

    def forward(self, x):
        pieces = torch.split(x, WIDTH, dim=1)
        return torch.cat([self.norms[i](pieces[i]) for i in range(FEATURES)], dim=1)


def pointwise(a, b, c, d):
    return torch.tanh(a) + torch.tanh(b), torch.tanh(c) * 2.0 + torch.tanh(d) * 2.0


def chain(x, w1, w2):
    return F.linear(F.linear(x, w1), w2)


class RaggedTowers(nn.Module):
    """Per-feature layer norm and linear to one output width, feature widths cycling 4/8/16
    (a dynamic-schema block): same-shape batching leaves one bmm per width."""

    WIDTHS = (4, 8, 16, 4, 8, 16, 4)

    def __init__(self):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(w) for w in self.WIDTHS)
        self.projs = nn.ModuleList(nn.Linear(w, 6) for w in self.WIDTHS)

    def forward(self, x):
        pieces = torch.split(x, list(self.WIDTHS), dim=1)
        return torch.cat([torch.relu(self.projs[i](self.norms[i](pieces[i]))) for i in range(len(self.WIDTHS))], dim=1)


def inputs(*shapes):
    return tuple(torch.randn(*s) for s in shapes)


def test_same_shape_linears_become_one_matmul():
    # On the CPU profile; on GPU profiles the grouped-GEMM call (no weight stacking) is
    # cheaper still: tests/test_group_linear_batching.py.
    optimized = optimize_and_check(Towers(), *inputs((4, FEATURES * WIDTH)), profile="cpu")
    counts = op_counts(optimized)
    assert counts["linear"] == 0 and counts["matmul"] == 1 and counts["relu"] == 1, dict(counts)
    assert optimized.meta["optimus_eqsat"].batched.get("batch-linear") == FEATURES


def test_linears_without_bias():
    optimized = optimize_and_check(Towers(bias=False), *inputs((4, FEATURES * WIDTH)), profile="cpu")
    assert op_counts(optimized)["matmul"] == 1


def launch_count_cost(c, node):
    """A cost under which batching always wins: every kernel 1, cats and views free."""
    if node.ctor in ("Leaf", "Slice", "Reshape", "Permute", "Expand", "TNil", "TCons", "Cat"):
        return 0.0 if node.ctor == "Leaf" else 1e-6
    return 1.0


def batched_program(fn, *example, cost=launch_count_cost):
    """The batched alternative itself, extracted under ``cost`` (launch_count_cost)."""
    run = OptimizationRun(torch.fx.symbolic_trace(fn), example, OptimizeOptions(raise_on_error=True))
    run.saturate()
    run.extract(cost=cost)
    program = run.build()
    assert_same_numerics(fn, program, example)
    return program, run.report


@pytest.mark.parametrize(
    "module, shape, op, kind",
    [
        (Towers(), (4, FEATURES * WIDTH), "matmul", "batch-linear"),
        (SharedInput(), (4, WIDTH), "linear", "batch-linear_lhs"),
        (Norms(), (4, FEATURES * WIDTH), "layer_norm", "batch-layer_norm"),
    ],
)
def test_batched_alternative_is_correct(module, shape, op, kind):
    program, report = batched_program(module, torch.randn(*shape))
    assert report.batched.get(kind), report.batched
    assert op_counts(program)[op] == 1, dict(op_counts(program))


class SharedInputExperts(nn.Module):
    """Same-shaped experts reading one input (an MMoE's), mixed by a weighted sum."""

    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(WIDTH, 5) for _ in range(4))

    def forward(self, x):
        return sum(torch.relu(e(x)) * (i + 1) for i, e in enumerate(self.experts))


def bmm_over_lhs_cost(c, node):
    """launch_count_cost, with a linear of concatenated weights priced out: the experts take the bmm."""
    if node.ctor in ("Op2", "Op3") and node.args and str(node.args[0]).startswith("linear"):
        return 10.0
    return launch_count_cost(c, node)


def test_experts_reading_one_input_batch_over_a_view_of_it():
    # Stacked n times, the shared input would be copied n times and saved for the backward
    # (6 experts at batch 256: 590 KB per step for 96 features); its expand is a view.
    program, report = batched_program(SharedInputExperts(), torch.randn(4, WIDTH), cost=bmm_over_lhs_cost)
    assert report.batched.get("batch-linear"), report.batched
    counts = op_counts(program)
    assert counts["matmul"] == 1 and counts["expand"] == 1, dict(counts)
    copies = [n for n in program.graph.nodes if n.op == "call_function" and canonical_name(n) in ("stack", "cat")]
    assert not any(len(n.args[0]) > 1 and len(set(n.args[0])) == 1 for n in copies), [n.format_node() for n in copies]


def test_ragged_input_widths_become_one_padded_matmul():
    """Linears of one output width and different input widths: one bmm over zero-padded
    stacks (forward and gradients of inputs and parameters against eager)."""
    torch.manual_seed(0)
    module = RaggedTowers()

    def pads_fuse(c, node):  # a pad fuses into its neighbours: a fraction of a launch
        fused = node.ctor == "Op1" and str(node.args[0]).startswith("pad")
        return 0.1 if fused else launch_count_cost(c, node)

    program, report = batched_program(module, torch.randn(5, sum(RaggedTowers.WIDTHS)), cost=pads_fuse)
    assert report.batched.get("batch-linear_padk") == len(RaggedTowers.WIDTHS)
    counts = op_counts(program)
    assert counts["matmul"] == 1 and counts["linear"] == 0, dict(counts)
    assert counts["pad"] >= 1, dict(counts)
    params = dict(module.named_parameters())
    x = torch.randn(5, sum(RaggedTowers.WIDTHS))
    expected = torch.autograd.grad(module(x).square().sum(), list(params.values()))
    got = torch.autograd.grad(program(x).square().sum(), [program.get_parameter(n) for n in params])
    for name, e, g in zip(params, expected, got):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5, msg=name)


def test_ragged_linears_of_one_width_are_not_padded():
    program, report = batched_program(Towers(), torch.randn(4, FEATURES * WIDTH))
    assert "batch-linear_padk" not in report.batched, report.batched


def test_padded_matmul_wins_on_the_cpu_profile():
    optimized = optimize_and_check(RaggedTowers(), *inputs((5, sum(RaggedTowers.WIDTHS))), profile="cpu")
    report = optimized.meta["optimus_eqsat"]
    counts = op_counts(optimized)
    assert counts["matmul"] == 1 and counts["linear"] == 0, dict(counts)  # one bmm for all three widths
    assert report.launches_after < report.launches_before


def test_elementwise_alternative_is_correct():
    program, report = batched_program(pointwise, *inputs((3, 4), (3, 4), (3, 4), (3, 4)))
    assert report.batched.get("batch-elementwise", 0) >= 4  # the four tanh (and the two scalar muls)
    assert op_counts(program)["tanh"] == 1


def test_cost_model_keeps_what_inductor_already_fuses():
    """Layer norms over slices of one tensor already fuse into one kernel: batching
    (which must stack the affine parameters) would add launches, so it is declined."""
    module = Norms()
    optimized = optimize_and_check(module, *inputs((4, FEATURES * WIDTH)))
    report = optimized.meta["optimus_eqsat"]
    assert report.batched.get("batch-layer_norm") == FEATURES
    assert report.launches_after <= report.launches_before


def test_dependent_linears_are_not_batched():
    optimized = optimize_and_check(chain, *inputs((4, 6), (6, 6), (6, 6)))
    counts = op_counts(optimized)
    assert counts["linear"] == 2 and counts["matmul"] == 0, dict(counts)
    assert not optimized.meta["optimus_eqsat"].batched.get("batch-linear")


def test_same_shape_linears_on_gpu_take_bmm_or_grouped_call_by_host_cost():
    """With the grouped call's measured host time (h100) it cannot pay, is not even
    built, and the bmm wins; with a negligible host path both alternatives exist and
    the grouped call (no weight stack) wins."""
    from optimus_eqsat.extract.cost_model import get_profile
    from optimus_eqsat.kernels import grouped_linear

    measured = optimize_and_check(Towers(), *inputs((4, FEATURES * WIDTH)), profile="h100")
    assert "batch-group_linear" not in measured.meta["optimus_eqsat"].batched  # cannot pay: not built
    assert not any(n.target is grouped_linear for n in measured.graph.nodes)
    assert op_counts(measured)["linear"] == 0 and op_counts(measured)["matmul"] == 1

    cheap = get_profile("h100", grouped_host_s=0.0, grouped_host_s_per_member=2e-7)
    optimized = optimize_and_check(Towers(), *inputs((4, FEATURES * WIDTH)), profile=cheap)
    report = optimized.meta["optimus_eqsat"]
    assert report.batched.get("batch-linear") == FEATURES and report.batched.get("batch-group_linear") == FEATURES
    assert sum(n.target is grouped_linear for n in optimized.graph.nodes) == 1
    assert op_counts(optimized)["linear"] == 0 and op_counts(optimized)["matmul"] == 0


def test_batching_can_be_switched_off():
    optimized = optimize_and_check(Towers(), *inputs((4, FEATURES * WIDTH)), rulesets=("splitcat",))
    assert op_counts(optimized)["linear"] == FEATURES


def test_group_linear_is_built_only_where_it_can_pay():
    from optimus_eqsat.extract.cost_model import get_profile
    from optimus_eqsat.rewrites.batching import group_linear_can_pay

    assert group_linear_can_pay(None, 2)
    assert not group_linear_can_pay("cpu", 100)  # the fallback runs every member
    assert not group_linear_can_pay("h100", 100)  # 0.3 ms + 17 us a member > 99 launches
    cheap = get_profile("h100", grouped_host_s=0.0, grouped_host_s_per_member=2e-7)
    assert group_linear_can_pay(cheap, 2) and group_linear_can_pay(cheap, 1000)


def test_refine_tries_variants_within_its_time_limit():
    torch.manual_seed(0)
    x = torch.randn(4, FEATURES * WIDTH)
    gm = torch.fx.symbolic_trace(Towers())
    refined = optimize_graph(gm, (x,), raise_on_error=True).meta["optimus_eqsat"]
    assert refined.refine_tried, "the extraction batches, so refine compares variants without each kind"
    assert all(kinds for kinds in refined.refine_tried)
    # no variant can end within 0 s: none is started, and the result is the first extraction's
    hurried = optimize_graph(gm, (x,), raise_on_error=True, refine_time_limit_s=0.0).meta["optimus_eqsat"]
    assert hurried.refine_tried == []
    assert hurried.dropped_batches == []


def test_second_saturation_has_its_own_iteration_limit():
    x = torch.randn(4, FEATURES * WIDTH)
    gm = torch.fx.symbolic_trace(Towers())
    first = optimize_graph(gm, (x,), raise_on_error=True, batch_iterations=0).meta["optimus_eqsat"]
    both = optimize_graph(gm, (x,), raise_on_error=True, batch_iterations=2).meta["optimus_eqsat"]
    assert both.iterations - first.iterations in (1, 2)  # the second saturation ran, at most 2 rounds


def test_report_describes_the_extraction_refine_kept():
    x = torch.randn(4, FEATURES * WIDTH)
    run = OptimizationRun(torch.fx.symbolic_trace(Towers()), (x,), OptimizeOptions(raise_on_error=True))
    run.saturate()
    run.extract()
    run.finish()
    assert run.report.refine_tried  # variants ran (greedy), then one extraction was kept
    kept = run.extraction
    assert (run.report.extractor, run.report.extraction_cost, run.report.optimal) == (
        kept.extractor,
        kept.cost,
        kept.optimal,
    )


def test_layer_norms_of_bf16_inputs_with_float32_scales_are_not_batched():
    """Autocast's mixed precision: ``F.layer_norm`` of a bf16 input with float32 scale and shift
    gives bf16; the batched form's separate multiply by the stacked scale would give float32."""
    module = Norms()
    x = torch.randn(4, FEATURES * WIDTH).bfloat16()
    optimized = optimize_graph(torch.fx.symbolic_trace(module), (x,), mode="inference")
    assert not optimized.meta["optimus_eqsat"].batched.get("batch-layer_norm")
    with torch.no_grad():
        assert optimized(x).dtype == module(x).dtype == torch.bfloat16


def test_batched_bf16_linears_keep_the_bias_inside_the_product():
    """In bf16 a product rounded before a separate bias add is rounded twice; the batched linears
    are one baddbmm, the bias inside it as in each linear: eager's outputs to the bit here."""
    torch.manual_seed(0)
    module = Towers().bfloat16()
    x = torch.randn(16, FEATURES * WIDTH).bfloat16()
    program, report = batched_program(module, x)
    counts = op_counts(program)
    assert report.batched.get("batch-linear") == FEATURES
    assert counts["baddbmm"] == 1 and counts["matmul"] == 0 and counts["linear"] == 0, dict(counts)
    with torch.no_grad():
        assert torch.equal(program(x), module(x))
