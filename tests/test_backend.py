"""The torch.compile backend, registered by entry point, end to end on CPU."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch
import torch.nn as nn

from optimus_eqsat.backend import make_backend
from optimus_eqsat.demo import DemoRecModel


def test_entry_point_registers_backend():
    from torch._dynamo import list_backends

    assert "optimus_eqsat" in list_backends(exclude_tags=())


def test_eval_and_training_step_match_eager():
    torch.manual_seed(0)
    model = DemoRecModel(features=4)
    (x,) = model.example_inputs(batch=16)
    backend = make_backend(inductor=False)  # the optimized graph itself, run eagerly: fast
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    compiled(x).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model(x).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-5)
    assert backend.reports and not backend.reports[-1].fell_back


def test_measured_training_step_updates_batch_norm_statistics_once():
    """The measured choice times steps on the first call: the running statistics it writes
    are copies, so the user's buffers see that call's update alone, as in eager."""
    import copy

    class SplitScaleCat(nn.Module):  # the pre-grad pass rewrites it, so the choice times it
        def __init__(self) -> None:
            super().__init__()
            self.a, self.bn, self.b = nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.bn(self.a(x)))
            return self.b(torch.cat([p * 2 for p in torch.split(h, 4, dim=1)], dim=1))

    torch.manual_seed(0)
    model = SplitScaleCat().train()
    reference = copy.deepcopy(model)
    backend = make_backend(measure_budget_s=0.05)
    torch._dynamo.reset()
    x = torch.randn(32, 8)
    with torch._inductor.config.patch(force_disable_caches=True):
        torch.compile(model, backend=backend)(x).sum().backward()
    reference(x).sum().backward()
    assert backend.reports[-1].measured is not None and backend.reports[-1].measured.rounds > 0
    for (name, a), b in zip(model.named_buffers(), reference.buffers()):
        torch.testing.assert_close(a, b, msg=name)


def test_training_step_with_only_its_masks_recomputed_is_compiled_once_untimed():
    """Nothing to batch (a ReLU MLP): the only change is the bool masks recomputed from saved
    tensors, which costs no memory, so the step is Inductor's one compile, not timed."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4)).train()
    backend = make_backend(measure_budget_s=0.05)
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        torch.compile(model, backend=backend)(torch.randn(32, 8)).sum().backward()
    report = backend.reports[-1]
    assert report.recomputed_masks >= 1
    assert report.measured is not None and report.measured.rounds == 0 and not report.measured.compile_s
    assert "no rewrite that needs timing" in report.measured.reason


def test_backend_compiles_through_inductor():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    x = torch.randn(4, 8)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="optimus_eqsat")
    torch.testing.assert_close(compiled(x), model(x))


def test_torch_compile_mode_and_options_reach_the_backend(monkeypatch):
    """``torch.compile(backend="optimus_eqsat", mode=..., options=...)``: our options go to
    make_backend, Inductor configs and the mode's reach every compile_fx call."""
    import torch._inductor.compile_fx as compile_fx_module

    from optimus_eqsat import backend as backend_module

    seen: list[dict] = []
    real = compile_fx_module.compile_fx

    def recording(gm, example_inputs, config_patches=None, **kwargs):
        # (compile_fx calls itself again under its patches: the config in force counts)
        seen.append(
            {
                key: (config_patches or {}).get(key, torch._inductor.config.get_config_copy()[key])
                for key in ("cpp.simdlen", "max_autotune")
            }
        )
        return real(gm, example_inputs, config_patches=config_patches, **kwargs)

    monkeypatch.setattr(compile_fx_module, "compile_fx", recording)
    monkeypatch.setattr(backend_module, "_MADE", {})
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    x = torch.randn(4, 8)
    torch._dynamo.reset()
    compiled = torch.compile(
        model, backend="optimus_eqsat", options={"measure": False, "extractor": "greedy", "cpp.simdlen": 0}
    )
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    assert seen and all(p.get("cpp.simdlen") == 0 for p in seen)
    (made,) = backend_module._MADE.values()
    assert made.reports and made.reports[-1].extractor.startswith("greedy")

    seen.clear()
    torch._dynamo.reset()  # (torch.compile takes a mode or options, not both)
    compiled = torch.compile(model, backend="optimus_eqsat", mode="max-autotune-no-cudagraphs")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    assert seen and all(p.get("max_autotune") is True for p in seen)

    seen.clear()
    torch._dynamo.reset()  # a backend of ours made by hand: its options, the mode's on top
    made = make_backend(measure=False, extractor="greedy", inductor_config={"cpp.simdlen": 0})
    compiled = torch.compile(model, backend=made, mode="max-autotune-no-cudagraphs")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    assert seen and all(p.get("max_autotune") is True and p.get("cpp.simdlen") == 0 for p in seen)
    assert made.reports and made.reports[-1].extractor.startswith("greedy")

    assert backend_module.backend_options("reduce-overhead", {"freezing": True, "measure": False}) == {
        "measure": False,
        "inductor_config": {"triton.cudagraphs": True, "freezing": True},
    }
    with pytest.raises(ValueError, match="unknown option 'bogus'"):
        backend_module.backend_options(None, {"bogus": 1})
    with pytest.raises(ValueError, match="not Inductor configs"):
        make_backend(inductor_config={"bogus": 1})


def test_inductor_failure_on_the_optimized_graph_falls_back_to_the_original(monkeypatch, caplog):
    import torch._inductor.compile_fx as cfx

    calls = []

    def flaky_compile_fx(gm, example_inputs, **_kwargs):  # compile_fx also takes config_patches
        calls.append(gm)
        if len(calls) == 1:
            raise RuntimeError("Inductor pattern failure")
        return gm.forward

    monkeypatch.setattr(cfx, "compile_fx", flaky_compile_fx)
    model = DemoRecModel(features=4).eval()
    (x,) = model.example_inputs(batch=8)
    backend = make_backend()
    torch._dynamo.reset()
    with caplog.at_level("WARNING", logger="optimus_eqsat"):
        out = torch.compile(model, backend=backend)(x)
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    assert len(calls) == 2 and "compiling the original" in caplog.text
    assert backend.reports[-1].fell_back


class MaskedWriteBack(nn.Module):
    """Towers whose outputs are then overwritten where a mask says, as deepctr's DIEN writes its
    interest states back (``zero_outputs[mask] = outputs``): the backward of that bool-mask
    ``index_put`` needs ``nonzero``, which Inductor cannot compile (a data-dependent shape)."""

    def __init__(self):
        super().__init__()
        self.towers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def forward(self, x, mask, value):
        out = torch.cat([torch.relu(tower(x)) for tower in self.towers], 1)
        out[mask] = value
        return out


def test_an_op_inductor_cannot_compile_is_left_to_dynamo_without_a_warning(caplog):
    """Inductor raises on the original as on ours, and Dynamo splits the graph as it does for
    Inductor alone: our fallback to the original is no news, logged at INFO."""
    torch.manual_seed(0)
    model = MaskedWriteBack()
    x, mask = torch.randn(6, 4), torch.tensor([True, False, True, True, False, True])
    value = torch.randn(4, 12, requires_grad=True)
    torch._dynamo.reset()
    with caplog.at_level("WARNING", logger="optimus_eqsat"):
        out = torch.compile(model, backend=make_backend(measure=False))(x, mask, value)
        out.sum().backward()
    want = model(x, mask, value.detach())
    torch.testing.assert_close(out, want)
    assert torch.equal(value.grad, torch.ones(4, 12))
    assert not caplog.records, caplog.text


class HookedTowers(nn.Module):
    """Towers over one input whose gradient a hook registered in the forward doubles (as users
    scale or log an activation's gradient)."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(8, 8)
        self.towers = nn.ModuleList(nn.Linear(8, 4) for _ in range(3))

    def forward(self, x):
        h = self.inner(x)
        if h.requires_grad:
            h.register_hook(lambda g: g * 2)
        return torch.cat([torch.relu(tower(h)) for tower in self.towers], 1)


def test_a_graph_registering_a_gradient_hook_is_declined_quietly(caplog):
    """The hook's tensor must receive the whole gradient, which a rewrite of its readers could
    route around: the graph is left as it is (it failed the run for shapes with a warning)."""
    torch.manual_seed(0)
    model = HookedTowers()
    reference = copy.deepcopy(model)
    x = torch.randn(5, 8)
    backend = make_backend(measure=False)
    torch._dynamo.reset()
    with caplog.at_level("WARNING", logger="optimus_eqsat"):
        torch.compile(model, backend=backend)(x).sum().backward()
    reference(x).sum().backward()
    assert not caplog.records, caplog.text
    assert any("gradient hooks" in (r.fallback_reason or "") for r in backend.reports)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_dynamo_restart_signals_pass_through_the_backend(monkeypatch):
    import torch._inductor.compile_fx as cfx
    from torch._dynamo.exc import TensorifyScalarRestartAnalysis

    def restarting_compile_fx(gm, example_inputs, **_kwargs):
        raise TensorifyScalarRestartAnalysis()  # empty message, as Inductor raises it

    monkeypatch.setattr(cfx, "compile_fx", restarting_compile_fx)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    gm = torch.fx.symbolic_trace(model)
    backend = make_backend()
    with pytest.raises(TensorifyScalarRestartAnalysis):
        backend(gm, [torch.randn(4, 8)])


def test_fallback_message_of_an_empty_exception_does_not_crash(monkeypatch, caplog):
    import torch._inductor.compile_fx as cfx

    calls = []

    def failing_once(gm, example_inputs, **_kwargs):
        calls.append(gm)
        if len(calls) == 1:
            raise RuntimeError()  # no message at all
        return gm.forward

    monkeypatch.setattr(cfx, "compile_fx", failing_once)
    from tests.models import SplitTowers

    model = SplitTowers(towers=4, width=8).eval()  # a graph the optimizer changes: compiled first
    gm = torch.fx.symbolic_trace(model)
    with caplog.at_level("WARNING", logger="optimus_eqsat"), torch.no_grad():
        compiled = make_backend()(gm, [torch.randn(4, 32)])
        assert "RuntimeError" in caplog.text and len(calls) == 2
        x = torch.randn(4, 32)
        torch.testing.assert_close(compiled(x), model(x))


def test_dynamic_true_compile_of_a_tower_model_matches_eager():
    # Inductor raises TensorifyScalarRestartAnalysis on this graph under dynamic=True
    from tests.models import SplitTowers

    model = SplitTowers(towers=6, width=8)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="optimus_eqsat", dynamic=True)
    for batch in (16, 7):
        x = torch.randn(batch, 48)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


def test_frozen_inference_folds_the_weight_stacks_of_a_batched_program():
    """Under Inductor's freezing the optimizer prices parameter stacks as built once, and
    Inductor folds them: the compiled program copies no weights per step."""
    from torch._inductor.utils import run_and_get_code

    from tests.models import SplitTowers

    model = SplitTowers(towers=6, width=8).eval()
    x = torch.randn(16, 48)
    backend = make_backend(measure=False, profile="h100")  # priced as on a GPU, where batching pays
    torch._dynamo.reset()
    with torch.no_grad(), torch._inductor.config.patch(freezing=True):
        compiled = torch.compile(model, backend=backend)
        out, codes = run_and_get_code(lambda: compiled(x))
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    report = backend.reports[-1]
    assert report.mode == "inference" and any(k.startswith("batch-") for k in report.batched), report.summary()
    code = "\n".join(codes)
    assert "bmm" in code  # the batched linears run as one bmm ...
    stacked = sum(p.numel() for p in model.parameters() if p.dim() == 2)  # 6 x 8 x 8 weights
    buffers = re.findall(r"empty_strided_cpu\(\(([\d, ]+)\)", code)
    sizes = [math.prod(int(d) for d in shape.split(",") if d.strip()) for shape in buffers]
    assert stacked not in sizes, buffers  # ... on weights stacked once, not copied every step (unfrozen: (48, 8))


def test_a_cached_program_runs_uncached_on_a_call_at_compile_time():
    """DDPOptimizer runs each compiled piece once on fake tensors: a program behind the parameter
    cache must not pack fake parameters (nor read their data pointers) then."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from optimus_eqsat.backend import CompileTimeSafe
    from optimus_eqsat.parameter_cache import CachedParameterWork

    cached_calls = []

    class Cached(CachedParameterWork):
        def __init__(self):  # (the attributes run_at_compile_time reads; no graph to cut)
            self.prologue = lambda w0, w1: (torch.stack([w0, w1]),)
            self.main = lambda stacked, x, w0, w1: torch.einsum("ki,koi->ko", x, stacked)
            self.param_positions, self.n_values = (1, 2), 1

        def __call__(self, *args):
            cached_calls.append(args)
            return self.main(*self.prologue(args[1], args[2]), *args)

    program = CompileTimeSafe(Cached())
    with FakeTensorMode() as mode:
        x, w0, w1 = (mode.from_tensor(t) for t in (torch.randn(2, 3), torch.randn(4, 3), torch.randn(4, 3)))
        assert program(x, w0, w1).shape == (2, 4)
    assert not cached_calls and program.first  # run uncached; the first real call is still to come
    real = (torch.randn(2, 3), torch.randn(4, 3), torch.randn(4, 3))
    program(*real)
    assert len(cached_calls) == 1 and not program.first


@pytest.mark.parametrize("optimizer", ["adam", "sgd_momentum"])
def test_a_compiled_optimizer_step_updates_once_per_call(optimizer):
    """``torch.compile(opt.step)``: Dynamo installs the parameters and the optimizer's state on
    the graph module, and the graph writes them. The measured choice used to time that graph
    on them (each round one more update), and the meta passes wrote Adam's ``step`` counters
    (``step += 1`` on the real 0-d tensors): the parameters and the state must match eager's."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)])
    reference = copy.deepcopy(model)

    def make(m: nn.Module) -> torch.optim.Optimizer:
        if optimizer == "adam":
            return torch.optim.Adam(m.parameters(), lr=1e-2)
        return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

    opt, reference_opt = make(model), make(reference)
    backend = make_backend()  # the measured choice on, as by default
    torch._dynamo.reset()
    step = torch.compile(opt.step, backend=backend)
    for k in range(2):
        for m in (model, reference):
            for p in m.parameters():
                p.grad = torch.full_like(p, 0.1 * (k + 1))
        reference_opt.step()
        step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)
        for key, value in reference_opt.state[q].items():
            torch.testing.assert_close(opt.state[p][key], value, msg=key)
    assert backend.reports and all(r.measured is None for r in backend.reports)


class _TwoTaskExperts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)) for _ in range(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([e(x) for e in self.experts], 1).sum(1)


def test_per_task_gradients_retain_the_graph_after_the_measured_choice():
    """PCGrad and GradNorm take each task's gradients with ``retain_graph=True``. AOTAutograd
    compiles a backward on its first use, for that use's kind; the measured choice's timing ran
    first with a backward that frees the graph, so the program kept refused the user's
    ``retain_graph=True`` (Inductor's "donated buffers" error), where Inductor alone lets the
    user's first backward decide. The gradients must equal eager's."""
    torch.manual_seed(0)
    model = _TwoTaskExperts()
    reference = copy.deepcopy(model)
    backend = make_backend(measure_budget_s=0.05)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(64, 16)

    def task_gradients(m: nn.Module, out: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
        losses = [out[:, :4].pow(2).sum(), out[:, 4:].abs().sum()]
        return [torch.autograd.grad(loss, list(m.parameters()), retain_graph=k == 0) for k, loss in enumerate(losses)]

    with torch._inductor.config.patch(force_disable_caches=True):
        got = task_gradients(model, compiled(x))
        again = task_gradients(model, compiled(x))  # (and on the calls after the first)
    assert backend.reports and backend.reports[0].measured is not None and backend.reports[0].measured.rounds
    expected = task_gradients(reference, reference(x))
    for run in (got, again):
        for task, want in zip(run, expected):
            for g, e in zip(task, want):
                torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


def test_a_symbolic_graph_no_pass_rewrites_is_compiled_once(monkeypatch):
    """Under dynamic shapes a graph the pre-grad pass leaves alone (here: nothing to batch) is
    one no pass of ours rewrites either; the measured choice compiled the original beside it
    anyway, a second forward-and-backward compile."""
    import torch._inductor.compile_fx as compile_fx_module

    calls: list[int] = []
    real = compile_fx_module.compile_fx

    def counting(gm, example_inputs, **kwargs):
        if "inner_compile" not in kwargs:  # (compile_fx calls itself again under its patches)
            calls.append(1)
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(compile_fx_module, "compile_fx", counting)
    model, backend = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)), make_backend()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    x = torch.randn(8, 16)
    compiled(x).sum().backward()
    assert calls == [1]
    assert all(r.measured is None for r in backend.reports)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)


def test_a_users_profiler_keeps_its_session_through_the_first_call():
    """The measured choice reads the CPU's peak memory with a profiler of its own; inside the
    user's profiler that ended the user's session (0 events recorded). It now times nothing
    there, keeps the optimizer's program, and says why."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = nn.Sequential(_TwoTaskExperts(), nn.Flatten(0))
    backend = make_backend(profile="h200")  # (measure on: the optimizer's program is a candidate)
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(16, 16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            compiled(x).sum().backward()
    assert len(prof.events()) > 100
    measured = [r.measured for r in backend.reports if r.measured is not None]
    assert measured and "a profiler is recording" in measured[0].reason
