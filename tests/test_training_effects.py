"""Training code as libraries write it: effects instead of one total order, batch norms in
training, dropout and checkpointed regions (translate.py, decompose.py, dropout_draws.py,
checkpoint_regions.py). Outputs, gradients and running statistics against eager (or against
Inductor where eager itself differs: a checkpointed norm updates its statistics twice in
eager), and what was batched."""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from optimus_eqsat import optimize_graph
from optimus_eqsat.backend import make_backend
from optimus_eqsat.checkpoint_regions import checkpoint_calls, inline_checkpoints
from optimus_eqsat.dropout_draws import shared_draw_groups
from optimus_eqsat.fxvocab import canonical_name
from optimus_eqsat.inductor_count import capture_dynamo_graph
from optimus_eqsat.translate import translate


class Experts(nn.Module):
    """Experts of (Linear -> BatchNorm1d -> ReLU -> Dropout) x 2 on one input, summed: the
    layer as torch-rechub's MLP writes it."""

    def __init__(
        self, n: int = 4, width: int = 12, p: float = 0.0, momentum: float | None = 0.1, checkpointed: bool = False
    ):
        super().__init__()
        self.checkpointed = checkpointed

        def layer(d: int, h: int) -> list[nn.Module]:
            return [nn.Linear(d, h), nn.BatchNorm1d(h, momentum=momentum), nn.ReLU(), nn.Dropout(p)]

        self.experts = nn.ModuleList(nn.Sequential(*layer(8, width), *layer(width, width)) for _ in range(n))
        for m in self.modules():
            if isinstance(m, nn.BatchNorm1d):  # affine and statistics far from the identity
                nn.init.normal_(m.weight)
                nn.init.normal_(m.bias)

    def forward(self, x):
        run = (lambda e: checkpoint(e, x, use_reentrant=False)) if self.checkpointed else (lambda e: e(x))
        return torch.stack([run(e) for e in self.experts], 1).sum(1)


def unknown(t: torch.Tensor) -> torch.Tensor:
    """An op the optimizer does not know (kept as a call by symbolic_trace)."""
    return t + 1


torch.fx.wrap("unknown")


def _backend(**options):
    torch._dynamo.reset()
    return make_backend(inductor=False, measure=False, raise_on_error=True, profile="h200", **options)


def _train_steps(model: nn.Module, x: torch.Tensor, run=None, steps: int = 2) -> tuple[list[torch.Tensor], dict]:
    """Outputs of ``steps`` SGD steps of ``model`` (called through ``run``, a compiled
    ``model``, when given), and the gradients of the last."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    outs = []
    for _ in range(steps):
        opt.zero_grad()
        out = (model if run is None else run)(x)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        opt.step()
        outs.append(out.detach())
    return outs, {n: p.grad.clone() for n, p in model.named_parameters()}


def _assert_trained_alike(
    reference: nn.Module, ours: nn.Module, x: torch.Tensor, run_reference=None, run_ours=None
) -> None:
    """Outputs and gradients of two SGD steps and the buffers (statistics, counters) after them
    equal; ``run_*`` (the modules themselves by default) are what is called, compiled or not."""
    want, want_grads = _train_steps(reference, x, run_reference)
    got, got_grads = _train_steps(ours, x, run_ours)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    # (the biases before a norm have gradients of float noise around zero: compared on the
    # scale of the largest gradient)
    scale = max(g.abs().max().item() for g in want_grads.values())
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, rtol=1e-4, atol=1e-5 * scale, msg=name)
    for (name, a), b in zip(reference.named_buffers(), ours.buffers()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)


# ---------------------------------------------------------------- effects


def test_effects_are_ordered_only_on_shared_memory():
    """Writes to different buffers keep no order; two writes to one buffer (through a view)
    keep theirs; an unknown op is ordered against everything."""

    def f(a, b, x):
        a.add_(1)
        b.add_(1)
        a.view(-1).mul_(2)
        y = unknown(x)
        b.add_(y.sum())
        return x * 2

    gm = torch.fx.symbolic_trace(f)
    t = translate(gm, (torch.zeros(4), torch.zeros(4), torch.randn(4)))
    ids = {n.name: i for i, n in enumerate(t.nodes)}
    deps = {t.nodes[i].name: {t.nodes[d].name for d in before} for i, before in t.effect_deps.items()}

    def after(name: str) -> set[str]:  # every effect ``name`` waits for
        seen, work = set(), list(deps[name])
        while work:
            if (n := work.pop()) not in seen:
                seen.add(n)
                work.extend(deps[n])
        return seen

    assert deps["add_"] == set() and deps["add__1"] == set()  # a's and b's first writes: unordered
    assert after("mul_") == {"view", "add_"}  # a again, through its view; nothing of b's
    assert {"mul_", "add__1"} <= deps["unknown"]  # the last effect on each memory
    assert deps["add__2"] == {"unknown"}
    assert ids["mul"] not in t.ordered


def test_random_ops_are_unordered_unless_fallback_random():
    def f(x):
        return F.dropout(x, 0.5) + torch.rand_like(x) + torch.randn_like(x)

    gm = torch.fx.symbolic_trace(f)
    x = torch.randn(4, 4)
    assert not translate(gm, (x,)).ordered
    with torch._inductor.config.patch(fallback_random=True):
        t = translate(gm, (x,))
    assert len(t.ordered) == 3 and len(t.effect_deps[max(t.ordered)]) == 1


# ---------------------------------------------------------------- batch norms in training


@pytest.mark.parametrize("momentum", [0.1, 0.3])
def test_experts_with_training_norms_batch_and_train_as_eager(momentum):
    torch.manual_seed(0)
    model = Experts(momentum=momentum).train()
    ours = copy.deepcopy(model)
    backend = _backend()
    _assert_trained_alike(model, ours, torch.randn(16, 8), run_ours=torch.compile(ours, backend=backend))
    report = backend.reports[0]
    assert report.batched.get("batch-linear", 0) >= 8 and report.batched.get("batch-reduction", 0) >= 8
    assert not report.fell_back, report.fallback_reason
    assert report.launches_after < report.launches_before


def _run_under_bf16_autocast(make: Callable[[], nn.Module], inside: bool = False) -> tuple:
    """(the model ``make`` builds, seeded, in training; its compiled copy; eager's output; ours;
    our backend) of one call under bf16 autocast; the outputs checked bf16 and within bf16's
    rounding of each other. ``inside``: the autocast is entered inside the compiled function
    (a region of Dynamo's graph), else around the call."""
    torch.manual_seed(0)
    model = make().train()
    ours = copy.deepcopy(model)
    x = torch.randn(16, 8)
    backend = _backend()

    def step(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return ours(x)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(x)
        if not inside:
            got = torch.compile(ours, backend=backend)(x)
    if inside:
        got = torch.compile(step, backend=backend)(x)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2)
    return model, ours, want, got, backend


def test_experts_with_training_norms_batch_under_bf16_autocast():
    """Under autocast a norm gets a bf16 input and float32 statistics and parameters: decomposed,
    it computes in float32 and casts back, as eager's kernel does, so the norms still batch;
    output bf16 and statistics eager's, both within bf16's rounding of the linears before them."""
    model, ours, want, got, backend = _run_under_bf16_autocast(Experts)
    for (name, a), b in zip(model.named_buffers(), ours.buffers()):
        assert b.dtype == a.dtype
        torch.testing.assert_close(b.double(), a.double(), rtol=2e-2, atol=2e-3, msg=name)
    report = backend.reports[0]
    assert not report.fell_back, report.fallback_reason
    assert report.batched.get("batch-reduction", 0) >= 8  # the norms' var_mean, in float32


def test_checkpointed_experts_batch_under_bf16_autocast():
    """Checkpointed regions are inlined before autocast's casts are written in (the casts tagged
    with their region): the experts batch under autocast too, outputs and gradients within
    bf16's rounding of eager's."""
    model, ours, want, got, backend = _run_under_bf16_autocast(lambda: Experts(checkpointed=True))
    weights = torch.linspace(-1, 1, want.numel()).view_as(want)
    (want.float() * weights).sum().backward()
    (got.float() * weights).sum().backward()
    scale = max(p.grad.abs().max().item() for p in model.parameters())
    for (name, p), q in zip(model.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=5e-2, atol=3e-2 * scale, msg=name)
    report = backend.reports[0]
    assert not report.fell_back, report.fallback_reason
    assert report.batched.get("batch-linear", 0) >= 8


def test_experts_under_an_autocast_region_of_the_compiled_step_batch():
    """``with torch.autocast(...)`` inside the compiled function (a training step written so):
    the region's casts are written into the graph and the region dropped, so the experts, their
    norms and towers batch as under autocast around the call; outputs, statistics and gradients
    within bf16's rounding of eager's."""
    model, ours, want, got, backend = _run_under_bf16_autocast(Experts, inside=True)
    report = backend.reports[0]
    assert not report.fell_back, report.fallback_reason
    assert report.batched.get("batch-linear", 0) >= 8 and report.batched.get("batch-reduction", 0) >= 8
    for (name, a), b in zip(model.named_buffers(), ours.buffers()):
        torch.testing.assert_close(b.double(), a.double(), rtol=2e-2, atol=2e-3, msg=name)
    want.float().square().sum().backward()
    got.float().square().sum().backward()
    scale = max(p.grad.abs().max().item() for p in model.parameters())
    for (name, p), q in zip(model.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=5e-2, atol=3e-2 * scale, msg=name)


class SequenceNorms(nn.Module):
    """Norms of rank-3 inputs (batch, channels, length), and one norm module called twice (its
    statistics are not its own alone: updated where it was, in order)."""

    def __init__(self):
        super().__init__()
        self.seq = nn.ModuleList(nn.Conv1d(4, 6, 1) for _ in range(3))
        self.norms = nn.ModuleList(nn.BatchNorm1d(6) for _ in range(3))
        self.shared = nn.BatchNorm1d(6)

    def forward(self, x):
        outs = [n(c(x)).relu() for c, n in zip(self.seq, self.norms)]
        return self.shared(outs[0]) + self.shared(outs[1]) + outs[2]


def test_norms_of_sequences_and_shared_statistics_train_as_eager():
    """Rank-3 inputs, and one norm module called twice (:class:`SequenceNorms`)."""
    torch.manual_seed(0)
    model = SequenceNorms().train()
    ours = copy.deepcopy(model)
    _assert_trained_alike(model, ours, torch.randn(5, 4, 7), run_ours=torch.compile(ours, backend=_backend()))


def test_training_norms_batch_with_a_symbolic_batch():
    """Under a symbolic batch size (``dynamic=True``, or Dynamo's automatic dynamic shapes after a
    last batch of another size) the norms still batch: the running variance takes the batch's
    unbiased variance directly (``n / (n - 1)`` is no number there). One graph serves batches of
    16 and 10, outputs, gradients and statistics as eager's."""
    reports = []
    # (floats specialized as Inductor's restart of such a trace specializes them; sequences
    # (batch, channels, length) and a norm called twice, updating in place, too)
    for make, shape, batches in ((Experts, (8,), (16, 10)), (SequenceNorms, (4, 7), (5, 3))):
        torch.manual_seed(0)
        model = make().train()
        ours = copy.deepcopy(model)
        backend = _backend()
        with torch._dynamo.config.patch(specialize_float=True):
            run = torch.compile(ours, backend=backend, dynamic=True)
            for batch in batches:
                _assert_trained_alike(model, ours, torch.randn(batch, *shape), run_ours=run)
        assert len(backend.reports) == 1
        reports.append(backend.reports[0])
    report = reports[0]
    assert not report.fell_back, report.fallback_reason
    assert report.batched.get("batch-linear", 0) >= 8 and report.batched.get("batch-reduction", 0) >= 8


def test_norms_without_momentum_train_as_eager():
    """``momentum=None`` (a cumulative average) is left to the norm itself."""
    torch.manual_seed(0)
    model = Experts(n=2, momentum=None).train()
    ours = copy.deepcopy(model)
    _assert_trained_alike(model, ours, torch.randn(16, 8), run_ours=torch.compile(ours, backend=_backend()))


# ---------------------------------------------------------------- dropout


def test_dropouts_of_one_depth_share_a_draw():
    torch.manual_seed(0)
    gm, _ = capture_dynamo_graph(Experts(p=0.2).train(), (torch.randn(16, 8),))
    groups = shared_draw_groups(gm)
    assert sorted(len(g) for g in groups) == [4, 4]  # one draw per layer, the experts' four
    first, second = ({n.name for n in g} for g in groups)
    assert not first & second


def test_batched_dropout_keeps_p_and_scales_by_one_over_one_minus_p():
    """Without fallback_random the experts' dropouts draw from one tensor: the fraction dropped
    is p, and what is kept is scaled by 1 / (1 - p)."""
    p = 0.3

    class Towers(nn.Module):
        def __init__(self):
            super().__init__()
            self.towers = nn.ModuleList(nn.Linear(32, 64) for _ in range(4))

        def forward(self, x):
            hidden = [t(x) for t in self.towers]
            return torch.stack([F.dropout(h, p, training=True) for h in hidden], 0), torch.stack(hidden, 0)

    torch.manual_seed(0)
    model = Towers()
    backend = _backend()
    out, hidden = torch.compile(model, backend=backend)(torch.randn(256, 32))
    assert any("rand" in name for name in backend.reports[0].opaque_nodes)  # the shared draw
    dropped = (out == 0).float().mean().item()
    assert abs(dropped - p) < 0.01, dropped
    kept = out != 0
    torch.testing.assert_close(out[kept], hidden[kept] / (1 - p))
    per_tower = (out == 0).float().mean(dim=(1, 2))
    assert (per_tower - p).abs().max() < 0.02  # every member drops its share


def test_dropout_under_fallback_random_is_eagers_stream():
    torch.manual_seed(0)
    model = Experts(p=0.25).train()
    ours = copy.deepcopy(model)
    x = torch.randn(16, 8)
    with torch._inductor.config.patch(fallback_random=True):
        compiled = torch.compile(ours, backend=_backend())
        torch.manual_seed(5)
        want = model(x)
        torch.manual_seed(5)
        got = compiled(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


class GatedExperts(nn.Module):
    """One layer of (Linear -> BatchNorm1d -> ReLU -> Dropout) experts mixed by a softmax gate."""

    def __init__(self, n: int = 3, width: int = 12):
        super().__init__()
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(8, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Dropout(0.25)) for _ in range(n)
        )
        self.gate = nn.Linear(8, n)

    def forward(self, x):
        mixed = torch.stack([e(x) for e in self.experts], 1)
        return torch.bmm(torch.softmax(self.gate(x), -1).unsqueeze(1), mixed).squeeze(1)


def test_dropout_under_fallback_random_and_dynamic_shapes_keeps_its_symbolic_p():
    """Under ``dynamic=True`` Dynamo passes a dropout's p as a SymFloat: the dropout copied in
    eager's order gets it as it is (it was made contiguous, which fails on a float)."""
    torch.manual_seed(0)
    model = GatedExperts().train()
    ours = copy.deepcopy(model)
    with torch._inductor.config.patch(fallback_random=True):
        compiled = torch.compile(ours, backend=_backend(), dynamic=True)
        for batch in (16, 9):
            x = torch.randn(batch, 8)
            torch.manual_seed(batch)
            want = model(x)
            torch.manual_seed(batch)
            got = compiled(x)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- checkpointed regions


def test_checkpointed_regions_are_inlined_with_recompute_tags():
    gm, _ = capture_dynamo_graph(Experts(n=3, checkpointed=True).train(), (torch.randn(16, 8),))
    assert len(checkpoint_calls(gm)) == 3
    inlined = copy.deepcopy(gm)
    assert inline_checkpoints(inlined) == 3
    calls = [n for n in inlined.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
    regions = {n.meta["ac_graph_id"] for n in calls if "recompute" in n.meta}
    assert len(regions) == 3 and not any(isinstance(n.target, torch._ops.HigherOrderOperator) for n in calls)


def test_checkpointed_experts_batch_and_train_as_inductor():
    """Checkpointed experts (norms in training inside) batch, their batched ops still tagged
    for recomputation; outputs, gradients and statistics are Inductor's (eager's checkpoint
    updates a norm's statistics a second time when it recomputes)."""
    torch.manual_seed(0)
    model = Experts(checkpointed=True).train()
    ours = copy.deepcopy(model)
    backend = _backend()
    programs = []

    def recorded(gm, example_inputs):
        programs.append(backend(gm, example_inputs))
        return programs[-1]

    torch._dynamo.reset()
    reference = torch.compile(model, backend="aot_eager")  # (AOTAutograd's regions, no optimizer)
    _assert_trained_alike(
        model, ours, torch.randn(16, 8), run_reference=reference, run_ours=torch.compile(ours, backend=recorded)
    )
    report = backend.reports[0]
    assert report.batched.get("batch-linear", 0) >= 8 and not report.fell_back, report.fallback_reason
    [program] = programs
    linears = [n for n in program.graph.nodes if canonical_name(n) in ("linear", "matmul", "bmm", "baddbmm")]
    assert any(canonical_name(a) in ("cat", "stack") for n in linears for a in n.all_input_nodes)  # batched
    assert linears and all("recompute" in n.meta for n in linears)  # recomputed in the backward


def test_random_ops_under_fallback_random_keep_their_inputs_layout():
    """A cat of a permute's splits is the permute (a view): the dropout reading it draws its
    numbers in memory order, so under fallback_random it reads a contiguous copy, as eager."""

    def f(x):
        p = x.permute(1, 0, 2)
        whole = torch.cat(p.split([3, 3, 2], dim=1), dim=1)
        return F.dropout(whole, 0.25, training=True) * 2

    gm = torch.fx.symbolic_trace(f)
    x = torch.randn(8, 4, 3)
    with torch._inductor.config.patch(fallback_random=True):
        optimized = optimize_graph(gm, (x,), raise_on_error=True, never_worse=False)
    assert "cat" not in optimized.code  # the cat of all the splits is gone
    torch.manual_seed(3)
    want = f(x)
    torch.manual_seed(3)
    torch.testing.assert_close(optimized(x), want)
