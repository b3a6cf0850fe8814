"""Grad-mode and autocast regions inside a forward: written out (casts, detaches) so their ops
batch at their own precision and without gradients; no-op regions ignored."""

from __future__ import annotations

import copy
import operator

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


def test_a_no_grad_regions_experts_batch_and_their_parameters_get_no_gradient():
    """Its reads written as detaches (optimus_eqsat/no_grad_regions.py), the frozen experts batch
    with the training ones; outputs and gradients are the graph's, and the frozen experts'
    parameters get none, as in eager."""
    model, x = Experts(torch.no_grad), torch.randn(32, 16)
    gm, inputs = _dynamo_graph(model, x)
    changes = state_changes(gm)
    assert len(changes) == 4 and all("needs a gradient with grad mode off" in c for c in changes)  # the 4 experts
    optimized = optimize_graph(gm, mode="training")
    report = optimized.meta["optimus_eqsat"]
    assert not report.fell_back and report.batched["batch-linear"] == 8, report.fallback_reason
    assert state_changes(optimized) == []
    (want,), (got,) = gm(*inputs), optimized(*inputs)
    torch.testing.assert_close(got, want)
    trained = [t for t in inputs if t.requires_grad]
    want_grads = torch.autograd.grad(want.sum(), trained, allow_unused=True)
    got_grads = torch.autograd.grad(got.sum(), trained, allow_unused=True)
    assert sum(g is None for g in want_grads) == 8  # (the frozen experts' weights and biases)
    for a, b in zip(got_grads, want_grads):
        assert (a is None) == (b is None)
        if b is not None:
            torch.testing.assert_close(a, b)


def test_the_backend_leaves_a_no_grad_regions_parameters_without_gradients():
    model, x = Experts(torch.no_grad), torch.randn(32, 16)
    ours = copy.deepcopy(model)
    backend = make_backend(measure=False)
    torch._dynamo.reset()
    torch.compile(ours, backend=backend)(x).sum().backward()
    model(x).sum().backward()
    assert [p.grad is None for p in ours.parameters()] == [p.grad is None for p in model.parameters()]
    for p, q in zip(model.parameters(), ours.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad)
    report = backend.reports[0]
    assert not report.fell_back and report.batched["batch-linear"] == 8, report.fallback_reason


def test_an_autocast_regions_experts_batch_among_themselves_and_keep_its_precision():
    """The region's casts are written into the graph and the region dropped: its four bf16
    experts batch with one another, the four float32 ones apart; outputs and gradients are the
    graph's (float rounding apart), far closer to it than the model run all in float32 is."""
    model, x = Experts(_bf16_autocast), torch.randn(32, 16)
    gm, inputs = _dynamo_graph(model, x)
    assert state_changes(gm) and "autocast cpu on" in state_changes(gm)[0]
    optimized = optimize_graph(gm, mode="training")
    report = optimized.meta["optimus_eqsat"]
    assert not report.fell_back and report.batched["batch-linear"] == 8, report.fallback_reason
    assert state_changes(optimized) == []
    trained = [t for t in inputs if t.requires_grad]
    (want,), (got,) = gm(*inputs), optimized(*inputs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    float32 = Experts()
    float32.load_state_dict(model.state_dict())
    assert (float32(x) - want).abs().max() > 100 * (got - want).abs().max()
    for a, b in zip(torch.autograd.grad(got.sum(), trained), torch.autograd.grad(want.sum(), trained)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


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


def test_experts_of_a_float32_region_inside_autocast_batch_apart_from_the_bf16_ones():
    """``autocast(enabled=False)`` around half the experts inside the caller's bf16 autocast:
    every cast written out, the rebuilt graph runs as a whole with autocast off (dropped, the
    region's float32 linears would be cast); both halves batch, each at its precision."""
    from optimus_eqsat.autocast_casts import autocast_casts_in

    model, x = Experts(_autocast_off), torch.randn(32, 16)
    with _bf16_autocast():
        gm, inputs = _dynamo_graph(model, x)
        assert state_changes(gm) and "autocast cpu off" in state_changes(gm)[0]
        optimized = optimize_graph(gm, mode="training")
        (want,), (got,) = gm(*inputs), optimized(*inputs)
    report = optimized.meta["optimus_eqsat"]
    assert not report.fell_back and report.batched["batch-linear"] == 8, report.fallback_reason
    assert autocast_casts_in(optimized, [("cpu", torch.bfloat16)]) == []
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    bf16 = Experts(_bf16_autocast)  # (every expert in bf16: the float32 half's precision matters)
    bf16.load_state_dict(model.state_dict())
    with _bf16_autocast():
        assert (bf16(x) - want).abs().max() > 100 * (got - want).abs().max()
    trained = [t for t in inputs if t.requires_grad]
    for a, b in zip(torch.autograd.grad(got.sum(), trained), torch.autograd.grad(want.sum(), trained)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_the_backend_compiles_a_program_run_with_autocast_off_as_a_whole():
    """The rebuilt graph's own region (autocast off around everything) goes through AOTAutograd
    and Inductor: output and gradients as the original program's under Inductor."""
    torch.manual_seed(0)
    model = Experts(_autocast_off)
    ours = copy.deepcopy(model)
    backend = make_backend(measure=False)
    x = torch.randn(32, 16)
    torch._dynamo.reset()
    with _bf16_autocast():
        want, got = torch.compile(model)(x), torch.compile(ours, backend=backend)(x)
    torch._dynamo.reset()
    report = backend.reports[0]
    assert not report.fell_back and report.batched["batch-linear"] == 8, report.fallback_reason
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    want.sum().backward()
    got.sum().backward()
    for p, q in zip(model.parameters(), ours.parameters()):  # (bf16 weights' gradients: bf16's rounding)
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-2, atol=1e-2)


def test_the_program_cache_keys_on_the_autocast_state_of_every_device():
    outside = traced_state()
    with _bf16_autocast():
        inside = traced_state()
    with torch.no_grad():
        no_grad = traced_state()
    assert len({outside, inside, no_grad}) == 3


def test_a_region_inside_a_checkpointed_function_is_seen():
    """The optimizer inlines checkpoint bodies; a no-grad region in one is seen, and its reads
    are detached there too."""
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Experts(torch.no_grad)

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False)

    model = Checkpointed()
    gm, inputs = _dynamo_graph(model, torch.randn(32, 16))
    assert any("grad mode off" in c for c in state_changes(gm))
    optimized = optimize_graph(gm, mode="training")  # (inlined, then its reads detached)
    report = optimized.meta["optimus_eqsat"]
    assert not report.fell_back and report.batched["batch-linear"] == 8, report.fallback_reason
    trained = [t for t in inputs if t.requires_grad]
    want = torch.autograd.grad(gm(*inputs)[0].sum(), trained, allow_unused=True)
    got = torch.autograd.grad(optimized(*inputs)[0].sum(), trained, allow_unused=True)
    assert [g is None for g in got] == [g is None for g in want] and sum(g is None for g in want) == 8


def test_stack_parameters_leaves_a_model_with_a_no_grad_region_alone():
    """The program batches the frozen experts with the training ones; stacked, the frozen ones
    would take the stack's (zero) gradient, and weight decay, where eager gives them none."""
    from optimus_eqsat import stack_parameters
    from optimus_eqsat.stacking import stacked_groups

    model, x = Experts(torch.no_grad), torch.randn(32, 16)
    names = [n for n, _ in model.named_parameters()]
    stack_parameters(model, (x,))
    assert stacked_groups(model) == [] and [n for n, _ in model.named_parameters()] == names


class NoGradRotary(nn.Module):
    """Hugging Face's rotary embedding: a ``@torch.no_grad()`` method reading position ids and a
    buffer (nothing that needs a gradient), its cos and sin scaling the experts' input."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (100 ** (torch.arange(0, 8).float() / 8)), persistent=False)
        self.experts = nn.ModuleList(nn.Linear(16, 8) for _ in range(8))

    @torch.no_grad()
    def rotary(self, x):
        angles = torch.arange(x.shape[0], dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((angles, angles), dim=-1)
        return emb.cos(), emb.sin()

    def forward(self, x):
        cos, sin = self.rotary(x)
        y = x * cos + x * sin
        return torch.stack([e(y).relu() for e in self.experts]).sum(0)


def test_a_no_grad_region_that_reads_nothing_needing_a_gradient_is_optimized():
    model, x = NoGradRotary(), torch.randn(32, 16)
    gm, inputs = _dynamo_graph(model, x)
    assert any(n.target is torch._C._set_grad_enabled for n in gm.graph.nodes) and state_changes(gm) == []
    optimized = optimize_graph(gm, mode="training")
    report = optimized.meta["optimus_eqsat"]
    assert not report.fell_back and report.batched.get("batch-linear", 0) > 0
    assert state_changes(optimized) == []
    want, got = gm(*inputs)[0], optimized(*inputs)[0]
    torch.testing.assert_close(got, want)
    params = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    torch.testing.assert_close(torch.autograd.grad(got.sum(), params), torch.autograd.grad(want.sum(), params))


def test_an_op_needing_a_gradient_inside_a_no_grad_region_is_found():
    """What the check of a rebuilt graph looks for: an op moved into a no-grad region."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["example_value"] = torch.randn(2, 2, requires_grad=True)
    graph.call_function(torch._C._set_grad_enabled, (False,))
    y = graph.call_function(torch.relu, (x,))
    graph.call_function(torch._C._set_grad_enabled, (True,))
    graph.output(y)
    gm = torch.fx.GraphModule(nn.Module(), graph)
    assert [c.split(":")[0] for c in state_changes(gm)] == ["relu"]
    x.meta["example_value"] = torch.randn(2, 2)  # (nothing needs a gradient: no change)
    assert state_changes(gm) == []


class Towers(nn.Module):
    """Three linear -> ReLU -> linear towers of one input, concatenated: batched, the towers' linears
    become matmuls of stacked weights plus separate bias adds, which autocast casts otherwise."""

    def __init__(self):
        super().__init__()
        self.towers = nn.ModuleList(nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4)) for _ in range(3))

    def forward(self, x):
        return torch.cat([t(x) for t in self.towers], -1)


def test_autocast_in_force_batches_dynamos_graph_with_its_casts_written_in():
    """Under the caller's bf16 autocast, eager's output is bf16; batching the Dynamo graph's
    linears as they were (a float32 bias added apart) gave float32. With autocast's casts
    written in as ops, the batched program is bf16 like eager, within bf16's rounding of it."""
    from optimus_eqsat.fxvocab.global_state import ambient_autocast

    torch.manual_seed(0)
    model, x = Towers(), torch.randn(16, 32)
    ours = copy.deepcopy(model)
    with _bf16_autocast():
        gm, _ = _dynamo_graph(model, x)
        assert ambient_autocast(gm) == [("cpu", torch.bfloat16)]
        optimized = optimize_graph(gm, mode="training")
        report = optimized.meta["optimus_eqsat"]
        assert not report.fell_back and report.batched.get("batch-linear", 0) >= 3
        backend = make_backend(measure=False, profile="h200")
        torch._dynamo.reset()
        with torch._inductor.config.patch(force_disable_caches=True):  # (a cached program skips the pass)
            got = torch.compile(ours, backend=backend)(x)
        want = model(x)
    assert ambient_autocast(gm) == []  # (autocast off again)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    got.float().square().sum().backward()
    want.float().square().sum().backward()
    for p, q in zip(ours.parameters(), model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=5e-2, atol=5e-2)
    assert not backend.reports[0].fell_back and sum(backend.reports[0].batched.values())  # (Dynamo's graph)


def test_a_no_grad_region_calling_a_module_reading_a_tuple_or_left_open_is_declined():
    """A module call's parameters are read inside it (no input to detach); a graph ending with
    grad mode off would leave it off for the caller; a tuple's tensors read through a
    ``getitem`` in the region cannot be detached as one input."""
    from optimus_eqsat.fxvocab.symbolic import DeclinedGraph
    from optimus_eqsat.no_grad_regions import with_no_grad_regions_detached

    for body in ("module", "open", "tuple"):
        root = nn.Module()
        root.layer = nn.Linear(4, 4)
        graph = torch.fx.Graph()
        x = graph.placeholder("x")
        x.meta["val"] = torch.randn(2, 4, requires_grad=True)
        pieces = graph.call_method("chunk", (x, 2))
        pieces.meta["val"] = x.meta["val"].chunk(2)
        graph.call_function(torch._C._set_grad_enabled, (False,))
        if body == "module":
            y = graph.call_module("layer", (x,))
        elif body == "tuple":
            y = graph.call_function(operator.getitem, (pieces, 0))
        else:
            y = graph.call_method("relu", (x,))
        if body != "open":
            graph.call_function(torch._C._set_grad_enabled, (True,))
        graph.output(y)
        try:
            with_no_grad_regions_detached(torch.fx.GraphModule(root, graph))
        except DeclinedGraph as exc:
            want = {
                "module": "calls a module",
                "open": "grad mode is off at the end",
                "tuple": "a collection of tensors",
            }
            assert want[body] in str(exc)
        else:
            raise AssertionError(f"{body}: not declined")
