"""The post-grad pass: the optimizer on AOTAutograd's forward and backward aten graphs.

Fast tests run the pass on captured aten graphs without compiling them
(optimus_eqsat.postgrad.capture); one compiles a small model end to end through
Inductor; the slow full-zoo sweep compiles every zoo model.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn

from optimus_eqsat import optimize_graph
from optimus_eqsat.inductor_count import capture_dynamo_graph
from optimus_eqsat.postgrad import PostGradPass, graph_pass, graph_role, optimize_aten_graph
from optimus_eqsat.postgrad.capture import aot_eager_with_pass, aten_graphs

RTOL, ATOL = 1e-5, 1e-6


class TinyExperts(nn.Module):
    """Same-shaped experts (linear, relu, linear), a layer norm and an activation per
    head (sigmoid / tanh), a softmax gate: what the post-grad batch kinds are for."""

    def __init__(self, experts: int = 4, width: int = 12, hidden: int = 16) -> None:
        super().__init__()
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 8)) for _ in range(experts)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(8) for _ in range(experts))
        self.gate = nn.Linear(width, experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        for k, (expert, norm) in enumerate(zip(self.experts, self.norms)):
            y = norm(expert(x))
            outs.append(torch.sigmoid(y) if k % 2 else torch.tanh(y))
        weights = torch.softmax(self.gate(x), dim=-1)
        return (weights.unsqueeze(-1) * torch.stack(outs, dim=1)).sum(dim=1)


def _model_and_inputs() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return TinyExperts(), (torch.randn(6, 12),)


def _step(fn, inputs, wrt):
    out = fn(*inputs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    seeds = [torch.randn_like(o, generator=torch.Generator().manual_seed(k)) for k, o in enumerate(outs)]
    return outs, torch.autograd.grad(outs, wrt, seeds)


def _assert_step_matches(reference, candidate, inputs, wrt) -> None:
    out_e, grad_e = _step(reference, inputs, wrt)
    out_o, grad_o = _step(candidate, inputs, wrt)
    for a, e in zip(out_o, out_e):
        torch.testing.assert_close(a, e, rtol=RTOL, atol=ATOL)
    for a, e in zip(grad_o, grad_e):
        torch.testing.assert_close(a, e, rtol=RTOL, atol=ATOL)


def test_pass_on_captured_aten_graphs_matches_eager():
    model, inputs = _model_and_inputs()
    gm, example = capture_dynamo_graph(model, inputs)
    leaves = [
        t.detach().clone().requires_grad_(t.is_floating_point()) if not isinstance(t, nn.Parameter) else t
        for t in example
    ]
    wrt = [t for t in leaves if t.requires_grad]
    optimizer = PostGradPass(profile="cpu", raise_on_error=True)
    seen: list[torch.fx.GraphModule] = []
    compiled = aot_eager_with_pass(gm, leaves, optimizer, seen)
    _assert_step_matches(gm, compiled, leaves, wrt)
    for graph_module in seen:  # only ops Inductor lowers, or that it falls back on undecomposed
        _assert_inductor_lowers(graph_module.graph)
    roles = {role: report for role, report in optimizer.reports}
    assert set(roles) == {"forward", "backward"}
    for role, report in roles.items():
        assert not report.fell_back, (role, report.fallback_reason)
        assert report.launches_after < report.launches_before, role
    backward = roles["backward"].batched
    assert backward.get("batch-matmul", 0) + backward.get("batch-linear", 0) > 0, backward
    assert backward.get("batch-reduction", 0) > 0, backward


def _assert_inductor_lowers(graph: torch.fx.Graph) -> None:
    import operator

    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.lowering import lowerings

    decompositions = select_decomp_table()
    for node in graph.nodes:
        if node.op == "call_function" and node.target is not operator.getitem:
            assert isinstance(node.target, torch._ops.OpOverload), node.format_node()
            assert node.target in lowerings or node.target not in decompositions, node.format_node()


def test_graph_role_tells_backward_by_its_tangents():
    model, inputs = _model_and_inputs()
    gm, example = capture_dynamo_graph(model, inputs)
    forward, backward = aten_graphs(gm, example)
    assert graph_role(forward.graph) == "forward" and graph_role(backward.graph) == "backward"


def test_multi_output_op_is_emitted_once():
    """var_mean's two items used by different ops: after batching two of them, one batched
    var_mean (not one per item) in the rebuilt graph."""

    def f(a, b):
        va, ma = torch.ops.aten.var_mean.correction(a, [1], correction=0, keepdim=True)
        vb, mb = torch.ops.aten.var_mean.correction(b, [1], correction=0, keepdim=True)
        return (a - ma) * torch.rsqrt(va + 1e-5), (b - mb) * torch.rsqrt(vb + 1e-5)

    a, b = torch.randn(4, 8), torch.randn(4, 8)
    gm = torch.fx.symbolic_trace(f)
    opt = optimize_graph(gm, (a, b), raise_on_error=True, profile="cpu")
    var_means = [n for n in opt.graph.nodes if n.target is torch.ops.aten.var_mean.correction]
    assert opt.meta["optimus_eqsat"].batched.get("batch-reduction") == 4
    assert len(var_means) == 1
    for got, want in zip(opt(a, b), f(a, b)):
        torch.testing.assert_close(got, want)


def test_native_layer_norm_items_read_once():
    """AOTAutograd without Inductor's decompositions: native_layer_norm's three items are
    one term each; the rebuilt graph computes it once."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w, b):
        out, mean, rstd = torch.ops.aten.native_layer_norm.default(x, [8], w, b, 1e-5)
        return out * 2, mean + rstd

    args = (torch.randn(4, 8), torch.randn(8), torch.randn(8))
    gm = make_fx(f)(*args)
    opt = optimize_graph(gm, args, raise_on_error=True, profile="cpu")
    assert not opt.meta["optimus_eqsat"].opaque_nodes
    assert sum(n.target is torch.ops.aten.native_layer_norm.default for n in opt.graph.nodes) == 1
    for got, want in zip(opt(*args), f(*args)):
        torch.testing.assert_close(got, want)


def test_failure_inside_the_pass_leaves_the_graph_as_it_was(monkeypatch, caplog):
    model, inputs = _model_and_inputs()
    gm, example = capture_dynamo_graph(model, inputs)
    forward = aten_graphs(gm, example)[0]
    before = forward.code

    def broken(*_a, **_k):
        raise RuntimeError("retrace failed")

    monkeypatch.setattr(graph_pass, "lower_to_aten", broken)
    optimizer = PostGradPass(profile="cpu")
    with caplog.at_level(logging.WARNING, logger="optimus_eqsat"):
        optimizer(forward.graph)
    forward.recompile()
    assert forward.code == before
    assert "leaving the graph as it was" in caplog.text
    ((_, report),) = optimizer.reports
    assert report.fell_back and "retrace failed" in report.fallback_reason


def test_a_role_not_asked_for_is_left_alone_and_reported(caplog):
    """The backend optimizes only the backward of a program its pre-grad pass rewrote (by
    design: reported, logged at DEBUG only, not as news of a fallback)."""
    model, inputs = _model_and_inputs()
    gm, example = capture_dynamo_graph(model, inputs)
    forward = aten_graphs(gm, example)[0]
    before = forward.code
    optimizer = PostGradPass(profile="cpu", roles=("backward",))
    with caplog.at_level(logging.INFO, logger="optimus_eqsat"):
        optimizer(forward.graph)
    assert "not among those" not in caplog.text
    forward.recompile()
    assert forward.code == before
    ((role, report),) = optimizer.reports
    assert role == "forward" and report.fell_back and "not among those to optimize" in report.fallback_reason
    assert optimizer.uuid() != PostGradPass(profile="cpu").uuid()  # a cached program keys on the roles


def test_dynamo_signals_pass_through(monkeypatch):
    from torch._dynamo.exc import RestartAnalysis

    def restart(*_a, **_k):
        raise RestartAnalysis("restart")

    monkeypatch.setattr(graph_pass, "optimize_graph", restart)
    model, inputs = _model_and_inputs()
    gm, example = capture_dynamo_graph(model, inputs)
    forward = aten_graphs(gm, example)[0]
    with pytest.raises(RestartAnalysis):
        PostGradPass()(forward.graph)


def test_uuid_is_stable_and_follows_the_options():
    a, b = PostGradPass(profile="cpu"), PostGradPass(profile="cpu")
    assert a.uuid() == b.uuid()
    assert PostGradPass(profile="h100").uuid() != a.uuid()
    assert PostGradPass(profile="cpu", rulesets=("splitcat",)).uuid() != a.uuid()
    assert graph_pass.source_files()  # our sources key the cache
    assert any(f.endswith(".egg") for f in graph_pass.source_files())


def test_unknown_option_is_an_error_when_the_pass_is_made():
    with pytest.raises(TypeError):
        PostGradPass(no_such_option=1)


def test_skips_graphs_with_symbolic_shapes():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = None
    graph.output(graph.call_function(torch.ops.aten.relu.default, (x,)))
    assert optimize_aten_graph(graph) is None


def test_a_model_with_a_sparse_embedding_trains_as_eager():
    """``Embedding(sparse=True)`` makes its gradient a sparse tensor in the backward graph,
    whose storage Inductor's checks of a rewritten graph cannot read ("Cannot access storage
    of SparseTensorImpl" before): the post-grad pass leaves such a graph alone, the pre-grad
    rewrite of the rest stays."""
    from optimus_eqsat.backend import make_backend

    class SparseFM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(50, 8, sparse=True)
            self.dnn = nn.Sequential(nn.Linear(11, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 1))
            self.lin = nn.Linear(3, 1)

        def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
            e = torch.stack([self.emb(ids[:, 0])], 1)
            fm = 0.5 * ((e.sum(1) ** 2) - (e**2).sum(1)).sum(1, keepdim=True)
            return (self.lin(dense) + fm + self.dnn(torch.cat([e.flatten(1), dense], 1))).squeeze(1)

    torch.manual_seed(0)
    model, ids, dense = SparseFM(), torch.randint(0, 50, (32, 4)), torch.randn(32, 3)
    target = torch.randint(0, 2, (32,)).float()
    grads = []
    backend = make_backend(measure=False)
    torch._dynamo.reset()
    for step_model in (torch.compile(model, backend=backend), model):
        nn.functional.binary_cross_entropy_with_logits(step_model(ids, dense), target).backward()
        grads.append([p.grad.to_dense() for p in model.parameters()])
        model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    assert model.emb.weight.grad is None
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert backend.reports and backend.reports[0].changed  # the pre-grad rewrite was kept


def _compile_step(model: nn.Module, inputs, backend):
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend=backend)
        params = list(model.parameters())
        leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
        got = _step(compiled, leaves, leaves + params)
        want = _step(model, leaves, leaves + params)
    finally:
        torch._dynamo.reset()
    return got, want


def test_backend_post_grad_end_to_end_matches_eager_and_restores_config():
    from torch._inductor import config
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen

    from optimus_eqsat.backend import make_backend

    seen, inplace = [], []

    def users_pass(graph):
        seen.append(graph_role(graph))

    def users_post_pass(graph):  # runs after ours, inside the same compile
        inplace.append(config.inplace_buffers)

    model, inputs = _model_and_inputs()
    backend = make_backend(pre_grad=False, post_grad=True, measure=False, profile="cpu", raise_on_error=True)
    with config.patch(
        post_grad_custom_pre_pass=users_pass, post_grad_custom_post_pass=users_post_pass, fx_graph_cache=False
    ):
        (out_o, grad_o), (out_e, grad_e) = _compile_step(model, inputs, backend)
        assert config.post_grad_custom_pre_pass is users_pass  # ours was patched around our compile only
    assert config.post_grad_custom_pre_pass is None
    # the graphs our pass rewrote compile with the user's in-place buffers (the alias fix is
    # installed for the process instead: inductor_compat)
    assert inplace == [True, True] and config.inplace_buffers is True
    assert getattr(PythonWrapperCodegen.can_reuse, "_optimus_eqsat_wrapped", False)
    for a, e in zip([*out_o, *grad_o], [*out_e, *grad_e]):
        torch.testing.assert_close(a, e, rtol=RTOL, atol=ATOL)
    assert sorted(seen) == ["backward", "forward"]  # the user's pass still ran
    roles = [role for role, _ in backend.post_grad_reports]
    assert sorted(roles) == ["backward", "forward"]
    assert all(not r.fell_back for _, r in backend.post_grad_reports)


def test_a_graph_no_pass_rewrites_compiles_with_the_users_inductor_settings():
    """Nothing rewritten: the program is Inductor's own (in-place buffers stay on)."""
    from torch._inductor import config

    from optimus_eqsat.backend import make_backend

    inplace = []
    model, inputs = nn.Linear(8, 4), (torch.randn(3, 8),)
    backend = make_backend(measure=False, profile="cpu")
    with config.patch(
        post_grad_custom_post_pass=lambda graph: inplace.append(config.inplace_buffers), fx_graph_cache=False
    ):
        _compile_step(model, inputs, backend)
    assert all(r.fell_back or not r.changed for _, r in backend.post_grad_reports)
    assert inplace == [True, True]


def _inductor_training_step(model: nn.Module, inputs):
    """One training step of ``model`` compiled through Inductor with both passes, and eager's:
    (outputs, gradients of float inputs and parameters) of each, and the backend."""
    from optimus_eqsat.backend import make_backend

    backend = make_backend(measure=False, profile="cpu")
    torch._dynamo.reset()
    try:
        # caches off: a hit in Inductor's FX graph cache (another process compiled the same
        # graphs with the same pass) skips the post-grad passes, ours with them
        with torch._inductor.config.patch(force_disable_caches=True):
            compiled = torch.compile(model, backend=backend)
            float_inputs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
            wrt = [x for x in float_inputs if x.requires_grad] + list(model.parameters())
            got = _step(compiled, float_inputs, wrt)
        want = _step(model, float_inputs, wrt)
    finally:
        torch._dynamo.reset()
    return got, want, backend


@pytest.mark.slow
def test_batch_normed_ple_training_step_matches_eager():
    """A PLE written as recommendation libraries write it, at batch 32: Inductor's in-place
    kernel outputs overwrote a piece of a concatenation in its batched backward of then
    (gradients off by up to 0.3; inductor_compat's alias fix)."""
    from tests.models import BatchNormPLE

    torch.manual_seed(0)
    got, want, backend = _inductor_training_step(BatchNormPLE().train(), (torch.randn(32, 16),))
    scale = max(g.abs().max().item() for g in want[1])
    for a, e in zip([*got[0], *got[1]], [*want[0], *want[1]]):
        torch.testing.assert_close(a, e, rtol=RTOL, atol=1e-5 * scale)
    # a batched program was compiled: by the pre-grad pass (whose backward autograd batches)
    # or, where that one left the graph, by the post-grad pass
    assert any(r.changed for r in backend.reports) or any(r.changed for _, r in backend.post_grad_reports)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dlrm", "mmoe", "ple", "deepfm", "dcnv2", "transformer", "dynamic_schema"])
def test_zoo_training_step_with_post_grad_matches_eager(name):
    """Every zoo model compiled through Inductor with the post-grad pass (pre-grad too):
    outputs and gradients of inputs and parameters equal eager's (fp32, relative 1e-5)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.zoo import MODELS

    spec = MODELS[name]
    got, want, backend = _inductor_training_step(spec.build().train(), spec.inputs(8, 0))
    for a, e in zip([*got[0], *got[1]], [*want[0], *want[1]]):
        torch.testing.assert_close(a, e, rtol=RTOL, atol=1e-5)
    assert backend.post_grad_reports
