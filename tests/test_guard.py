"""The measured guard: time programs side by side, keep the optimized one only when faster."""

from __future__ import annotations

import contextlib
import copy
import time

import pytest
import torch
import torch.nn as nn

from optimus_eqsat.guard import (
    Deferred,
    FirstCallChoice,
    choose,
    measure_and_choose,
    mutated_placeholders,
    step_function,
    time_interleaved,
)


def _rounds(base: list[float], factor: list[float]) -> dict[str, list[float]]:
    return {"original": base, "optimized": [b * f for b, f in zip(base, factor)]}


def test_a_faster_candidate_that_needs_more_memory_is_not_kept():
    rounds = _rounds([1.0] * 9, [0.8] * 9)
    lean = choose(rounds, "original", "optimized", peak_bytes={"original": 10 << 20, "optimized": 10 << 20})
    assert lean.kept == "optimized"
    fat = choose(rounds, "original", "optimized", peak_bytes={"original": 10 << 20, "optimized": 12 << 20})
    assert fat.kept == "original" and fat.reason == "more peak memory"
    # the same 2 MiB more on top of 100 MiB of parameters and inputs the step holds anyway
    held = choose(
        rounds,
        "original",
        "optimized",
        peak_bytes={"original": 10 << 20, "optimized": 12 << 20},
        resident_bytes=100 << 20,
    )
    assert held.kept == "optimized" and "above 100.00 MiB of inputs" in held.summary()
    # a looser memory_slack trades the memory for the speed
    traded = choose(
        rounds,
        "original",
        "optimized",
        peak_bytes={"original": 10 << 20, "optimized": 12 << 20},
        memory_slack=(1.25, 0),
    )
    assert traded.kept == "optimized"


def test_a_faster_candidate_of_a_small_step_keeps_its_speed_for_kilobytes():
    """A step whose peak is a few hundred KiB (a small model at batch 32) is not held to 5% of
    it: tens of KiB more cannot cost a user a batch size, where 6% of the step's time is theirs."""
    rounds = _rounds([1.0] * 9, [0.94] * 9)
    small = choose(rounds, "original", "optimized", peak_bytes={"original": 70 << 10, "optimized": 160 << 10})
    assert small.kept == "optimized"
    strict = choose(
        rounds,
        "original",
        "optimized",
        peak_bytes={"original": 70 << 10, "optimized": 160 << 10},
        memory_slack=(1.0, 0),
    )
    assert strict.kept == "original" and strict.reason == "more peak memory"


def test_backend_checks_memory_slack_when_made():
    import pytest

    from optimus_eqsat.backend import make_backend

    make_backend(memory_slack=(1.5, 1 << 20))
    for bad in ((0.9, 0), (1.1, -1), "lots", (1.1,)):
        with pytest.raises(ValueError, match="memory_slack"):
            make_backend(memory_slack=bad)


def test_resident_bytes_count_each_storage_once():
    from optimus_eqsat.guard import resident_bytes

    w = torch.randn(64, 64)
    assert resident_bytes([w, w[0], w.t(), torch.randn(8), 3]) == w.nbytes + 8 * 4


def test_step_peak_memory_is_measured_on_the_cpu(capfd):
    """... without the lines torch's profiler prints to standard error as it starts and stops
    (``profiler_start``) reaching the user's output; what the step prints still does."""
    import sys

    from optimus_eqsat.guard import step_peak_bytes

    x = torch.randn(256, 256)
    small = step_peak_bytes(lambda: x + 1, on_cuda=False)
    big = step_peak_bytes(lambda: torch.cat([x] * 8) + 1, on_cuda=False)
    assert small >= x.numel() * 4 and big >= 8 * small
    step_peak_bytes(lambda: print("the step's own", file=sys.stderr, flush=True), on_cuda=False)
    err = capfd.readouterr().err
    assert "profiler_start" not in err and "profiler_stop" not in err and "the step's own" in err


def test_a_clearly_faster_candidate_is_kept():
    result = choose(_rounds([1.0] * 9, [0.8] * 9), "original", "optimized")
    assert result.kept == "optimized" and result.ratio == pytest.approx(0.8)
    assert result.ratio_p25 == result.ratio_p75 == pytest.approx(0.8)


@pytest.mark.parametrize(
    "factors", [[1.0] * 9, [0.995] * 9, [1.1] * 9, [0.7, 0.8, 0.9, 1.1, 1.2, 1.3, 0.95, 1.05, 1.02]]
)
def test_equal_slower_or_noisy_candidates_keep_the_original(factors):
    result = choose(_rounds([1.0 + 0.01 * k for k in range(9)], factors), "original", "optimized")
    assert result.kept == "original", result


def test_rounds_interleave_and_respect_their_bounds():
    calls: list[str] = []
    steps = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    rounds = time_interleaved(steps, budget_s=0.0, min_rounds=4, max_rounds=4, warmup=0)
    assert all(len(v) == 4 for v in rounds.values())
    timed = calls[3:]  # after the one-step probe of each
    firsts = {timed[i * len(timed) // 4] for i in range(4)}
    assert len(firsts) > 1  # the order rotates from round to round


class _Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x):
        self.steps.add_(1)  # a buffer the graph writes to
        return torch.relu(self.lin(x)) * torch.rand(4)


def test_measuring_leaves_gradients_buffers_and_rng_alone():
    model = _Counter()
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(3, 4)
    before = torch.get_rng_state()
    result = measure_and_choose({"original": gm, "optimized": gm}, gm, [x], training=True, budget_s=0.05)
    assert result.rounds >= 5
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), before)


def test_inputs_the_graph_writes_to_are_found_and_cloned():
    def writes_first(a, b):
        a.add_(1)
        return a * b

    gm = torch.fx.symbolic_trace(writes_first)
    assert mutated_placeholders(gm) == {0}
    a, b = torch.zeros(3), torch.ones(3)
    measure_and_choose({"original": gm, "optimized": gm}, gm, [a, b], training=False, budget_s=0.01)
    assert torch.equal(a, torch.zeros(3))


def test_a_batch_norms_running_statistics_are_written_inputs():
    import torch.nn.functional as F

    def norm(x, mean, var, training: bool):
        return F.batch_norm(x, mean, var, training=training)

    train = torch.fx.symbolic_trace(lambda x, mean, var: norm(x, mean, var, True))
    evaluate = torch.fx.symbolic_trace(lambda x, mean, var: norm(x, mean, var, False))
    assert mutated_placeholders(train) == {1, 2} and mutated_placeholders(evaluate) == set()
    x, mean, var = torch.randn(8, 3), torch.zeros(3), torch.ones(3)
    measure_and_choose({"original": train, "optimized": train}, train, [x, mean, var], training=False, budget_s=0.01)
    assert torch.equal(mean, torch.zeros(3)) and torch.equal(var, torch.ones(3))


def test_inputs_without_grad_are_copied_even_when_the_graph_hides_the_write():
    """A program that writes a buffer no analysis sees (an unknown op) writes a copy."""
    gm = torch.fx.symbolic_trace(lambda x, buffer: x + buffer)
    sneaky = lambda x, buffer: x + buffer.add_(1)  # noqa: E731
    x, buffer = torch.randn(3), torch.zeros(3)
    measure_and_choose({"original": gm, "optimized": sneaky}, gm, [x, buffer], training=False, budget_s=0.01)
    assert torch.equal(buffer, torch.zeros(3))
    weight = torch.zeros(3, requires_grad=True)  # parameters are not copied: the write is reported
    with torch.no_grad():
        measure_and_choose({"original": gm, "optimized": sneaky}, gm, [x, weight], training=False, budget_s=0.01)
    assert weight.sum().item() > 0


def test_training_step_differentiates_every_input_that_requires_grad():
    w = torch.randn(4, 4, requires_grad=True)
    seen = []

    def program(x, w):
        out = x @ w
        out.register_hook(lambda g: seen.append(g.shape))
        return out

    step_function(program, [torch.randn(2, 4), w], training=True)()
    assert seen == [torch.Size([2, 4])] and w.grad is None


def test_a_much_slower_program_is_measured_slower():
    fast = lambda x: x + 1  # noqa: E731
    slow = lambda x: (time.sleep(0.1), x + 1)[1]  # noqa: E731  far above a loaded machine's noise
    gm = torch.fx.symbolic_trace(fast)
    result = measure_and_choose(
        {"original": fast, "optimized": slow}, gm, [torch.ones(2)], training=False, budget_s=0.0
    )
    assert result.kept == "original" and result.ratio > 10 and result.reason == "slower"


@pytest.mark.parametrize("kept", ["original", "optimized"])
def test_backend_returns_the_program_the_measurement_kept(monkeypatch, kept):
    import torch._inductor.compile_fx as cfx

    import optimus_eqsat.guard as guard_module
    from optimus_eqsat.backend import make_backend
    from optimus_eqsat.guard import GuardResult
    from tests.models import SplitTowers

    compiled = []

    def fake_compile_fx(gm, example_inputs, **_kwargs):  # compile_fx also takes config_patches
        compiled.append(gm)  # first the optimized graph, then the original
        return gm

    def fake_measure(
        programs, gm, example_inputs, training, baseline, candidate, budget_s, rewritten, memory_slack, layout
    ):
        # the pre-grad pass changed the graph: both compiled at once, nothing to ask
        assert set(programs) == {"original", "optimized"} and not training and rewritten is None
        assert memory_slack == guard_module.MEMORY_SLACK
        return GuardResult(kept, {"original": 1.0, "optimized": 2.0}, 2.0, 1.9, 2.1, 5)

    monkeypatch.setattr(cfx, "compile_fx", fake_compile_fx)
    monkeypatch.setattr(guard_module, "measure_and_choose", fake_measure)
    model = SplitTowers(towers=4, width=8).eval()
    backend = make_backend()
    x = torch.randn(5, 32)
    with torch.no_grad():
        program = backend(torch.fx.symbolic_trace(model), [x])
        report = backend.reports[-1]
        assert len(compiled) == 2 and report.measured is None  # measured on the first call
        torch.testing.assert_close(program(x), model(x))
    assert report.measured.kept == kept
    chosen = program.chosen  # the optimized program runs behind its parameter cache (inference)
    assert getattr(chosen, "main", chosen) is compiled[1 if kept == "original" else 0]
    assert report.fell_back == (kept == "original") and "step time" in report.summary()


def test_a_deferred_original_is_compiled_only_when_a_pass_rewrote_the_candidate():
    compiles = []

    def compile_original():
        compiles.append("original")
        return lambda x: x + 1

    candidate = lambda x: x + 1  # noqa: E731
    gm = torch.fx.symbolic_trace(candidate)
    untouched = measure_and_choose(
        {"original": Deferred(compile_original), "optimized": candidate},
        gm,
        [torch.ones(2)],
        training=False,
        budget_s=0.0,
        rewritten=lambda _training: False,
    )
    assert untouched.kept == "optimized" and untouched.rounds == 0 and not compiles
    assert untouched.summary() == (
        "not timed: no rewrite that needs timing (the program is the original, or it "
        "with bool masks recomputed), compiled once"
    )
    programs = {"original": Deferred(compile_original), "optimized": candidate}
    timed = measure_and_choose(
        programs, gm, [torch.ones(2)], training=False, budget_s=0.0, rewritten=lambda _training: True
    )
    assert compiles == ["original"] and timed.rounds > 0 and "original" in timed.compile_s
    assert not isinstance(programs["original"], Deferred)  # the compiled program replaced it


def test_a_first_step_that_compiles_is_reported_apart_from_the_timing():
    """In training a program's backward compiles on its first call, inside the measurement: the
    compile split reports each program's first step on its own, not as timing."""
    from optimus_eqsat.report import OptimizeReport

    def lazily_compiled(x):
        if not calls:
            time.sleep(0.3)  # a backward's compile, on the first call only
        calls.append(1)
        return x * 2

    calls: list[int] = []
    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    x = torch.randn(3, requires_grad=True)
    result = measure_and_choose(
        {"original": gm, "optimized": lazily_compiled}, gm, [x], training=True, budget_s=0.0, rewritten=lambda _t: True
    )
    assert set(result.first_step_s) == {"original", "optimized"} and result.first_step_s["optimized"] >= 0.3
    assert result.timing_s < 0.3 <= result.overhead_s
    report = OptimizeReport(measured=result)
    assert "first steps (a training backward compiles there) ours 0.3" in report.compile_split()


def test_backend_compiles_once_and_times_nothing_when_no_pass_rewrote(monkeypatch):
    import torch._inductor.compile_fx as cfx

    import optimus_eqsat.guard as guard_module
    from optimus_eqsat.backend import make_backend

    compiled = []

    def fake_compile_fx(gm, example_inputs, config_patches=None):
        compiled.append(gm)
        ours = (config_patches or {}).get("post_grad_custom_pre_pass")
        if ours is not None:
            ours(gm.graph)  # as Inductor would: the pass sees the forward (and, here, skips it)
        return gm

    def no_timing(*_args, **_kwargs):
        raise AssertionError("nothing to time")

    monkeypatch.setattr(cfx, "compile_fx", fake_compile_fx)
    monkeypatch.setattr(guard_module, "time_interleaved", no_timing)
    f = lambda x, w: torch.nn.functional.linear(x, w).cumsum(0)  # noqa: E731  nothing to optimize
    backend = make_backend()
    x, w = torch.randn(3, 4), torch.randn(5, 4)
    program = backend(torch.fx.symbolic_trace(f), [x, w])
    torch.testing.assert_close(program(x, w), f(x, w))
    report = backend.reports[-1]
    assert len(compiled) == 1 and report.measured.kept == "optimized" and report.measured.rounds == 0
    assert not report.fell_back and "not timed" in report.summary()


def test_a_graph_the_post_grad_pass_did_not_see_counts_as_rewritten():
    from optimus_eqsat.compile_plan import post_grad_rewrote
    from optimus_eqsat.report import OptimizeReport

    kept = OptimizeReport(fell_back=True)
    assert not post_grad_rewrote([("forward", kept)], training=False)
    assert post_grad_rewrote([], training=False)  # served by Inductor's cache: unknown
    assert post_grad_rewrote([("forward", kept)], training=True)  # the backward unseen
    assert not post_grad_rewrote([("forward", kept), ("backward", kept)], training=True)
    spliced = OptimizeReport(launches_before=3, launches_after=2, cost_before=2.0, cost_after=1.0)
    assert post_grad_rewrote([("forward", kept), ("backward", spliced)], training=True)


def test_first_call_keeps_the_original_when_timing_fails():
    results = []
    fast = lambda x: x + 1  # noqa: E731

    def broken(x):
        raise RuntimeError("cannot run here")

    choice = FirstCallChoice(
        {"original": fast, "optimized": broken}, torch.fx.symbolic_trace(fast), 0.0, results.append
    )
    assert torch.equal(choice(torch.ones(2)), torch.full((2,), 2.0))
    assert choice.chosen is fast and isinstance(results[0], RuntimeError)


def test_training_compile_then_backward_through_the_backend():
    # The measurement runs a compiled backward: on the first call, not inside Dynamo's compile.
    from optimus_eqsat.backend import make_backend
    from tests.models import SplitTowers

    model = SplitTowers(towers=4, width=8)
    backend = make_backend(measure_budget_s=0.05)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(6, 32)
    compiled(x).sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)
    assert backend.reports[-1].measured is not None


def test_a_call_on_fake_tensors_runs_the_candidate_and_defers_the_choice():
    """Dynamo's DDPOptimizer runs each compiled piece once on fake tensors while it compiles:
    nothing is timed there; the first real call decides."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from optimus_eqsat.guard import compile_time_call

    calls, results = [], []
    original = lambda x: (calls.append("original"), x + 1)[1]  # noqa: E731
    optimized = lambda x: (calls.append("optimized"), x + 1)[1]  # noqa: E731
    choice = FirstCallChoice(
        {"original": original, "optimized": optimized}, torch.fx.symbolic_trace(lambda x: x + 1), 0.0, results.append
    )
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.ones(2, 3))
        assert compile_time_call([fake])
        out = choice(fake)
    assert out.shape == (2, 3) and choice.chosen is None and not results
    assert sorted(calls) == ["optimized", "original"]  # each compiled program spends a fake first call
    assert choice.layout == [((2, 3), (3, 1))]
    assert not compile_time_call([torch.ones(2)])
    assert torch.equal(choice(torch.ones(2, 3)), torch.full((2, 3), 2.0))
    assert choice.chosen is not None and results[0].rounds > 0  # timed on the real call


def test_training_is_timed_on_detached_inputs_so_no_hook_of_the_user_fires():
    """FSDP2 and DDP hook module inputs and parameters: a backward reaching them in the middle
    of the user's forward frees FSDP2's unsharded parameters."""
    w = torch.randn(4, 4, requires_grad=True)
    fired = []
    w.register_hook(lambda g: fired.append("parameter"))
    x = torch.randn(2, 4, requires_grad=True)
    activation = x * 2  # an input that is an activation of the user's graph
    activation.register_hook(lambda g: fired.append("activation"))
    x.register_hook(lambda g: fired.append("upstream"))
    f = lambda a, w: torch.relu(a @ w)  # noqa: E731
    gm = torch.fx.symbolic_trace(f)
    result = measure_and_choose({"original": f, "optimized": f}, gm, [activation, w], training=True, budget_s=0.0)
    assert result.rounds > 0 and not fired and w.grad is None and x.grad is None


@pytest.mark.parametrize("case", ["collective", "list", "subclass", "profiler", "saved_tensor_hooks"])
def test_where_timing_is_unsafe_the_candidate_is_kept_untimed(monkeypatch, case):
    import optimus_eqsat.guard as guard_module
    from optimus_eqsat.guard import has_collectives, unsafe_to_time

    def no_timing(*_args, **_kwargs):
        raise AssertionError("nothing to time")

    monkeypatch.setattr(guard_module, "measure_and_choose", no_timing)
    if case == "collective":
        gm = torch.fx.symbolic_trace(lambda x: x + 1)
        node = next(n for n in gm.graph.nodes if n.op == "call_function")
        with gm.graph.inserting_after(node):
            reduced = gm.graph.call_function(torch.ops._c10d_functional.all_reduce.default, (node, "sum", "0"))
        node.replace_all_uses_with(reduced, delete_user_cb=lambda user: user is not reduced)
        assert has_collectives(gm)
        args: list = [torch.ones(2)]
    elif case == "list":  # compiled autograd's boxed inputs: a program empties the list
        gm = torch.fx.symbolic_trace(lambda inputs: inputs[0] + 1)
        args = [[torch.ones(2)]]
    elif case == "subclass":
        from torch.testing._internal.two_tensor import TwoTensor

        gm = torch.fx.symbolic_trace(lambda x: x + 1)
        args = [TwoTensor(torch.ones(2), torch.ones(2))]
    else:  # the user's profiler: ours for the peak memory would end its session
        gm = torch.fx.symbolic_trace(lambda x: x + 1)
        args = [torch.ones(2)]
    profiling = torch.profiler.profile() if case == "profiler" else contextlib.nullcontext()
    if case == "saved_tensor_hooks":  # checkpoint()'s or offloading's around the call
        profiling = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
    results = []
    choice = FirstCallChoice({"original": Deferred(lambda: gm), "optimized": lambda *a: "ran"}, gm, 0.0, results.append)
    with profiling:
        assert unsafe_to_time(gm, args)
        assert choice(*args) == "ran"
    assert results[0].kept == "optimized" and results[0].rounds == 0
    assert results[0].summary().startswith("not timed: cannot time here")
    assert not has_collectives(torch.fx.symbolic_trace(lambda x: x + 1))


def _within(seconds: float, run) -> None:
    """Run ``run`` on a thread; fail (not hang) when it has not returned after ``seconds``."""
    import threading

    failure: list[BaseException] = []

    def target() -> None:
        try:
            run()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread
            failure.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s (a deadlock)"
    if failure:
        raise failure[0]


def test_a_call_from_within_its_own_measurement_runs_the_candidate_instead_of_waiting():
    """A hook of the user's the timed step reaches (a checkpoint's recomputation did) may call the
    program again while it decides: the decision's lock is held by that same thread."""
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    nested: list = []

    def candidate(x: torch.Tensor) -> torch.Tensor:
        if choice.chosen is None and not nested:
            nested.append("entered")
            nested.append(choice(x))  # (re-entered once, from the measurement's step)
        return x + 1

    choice = FirstCallChoice({"original": lambda x: x + 1, "optimized": candidate}, gm, 0.0, lambda r: None)
    _within(60, lambda: choice(torch.ones(2)))
    assert choice.chosen is not None and torch.equal(nested[1], torch.full((2,), 2.0))


def test_a_module_compiled_alone_trains_inside_checkpoint_as_eager():
    """Regional compilation under activation checkpointing (each block compiled, the blocks
    checkpointed): the compile ran inside checkpoint()'s saved-tensor hooks, which counted the
    fake tensors our passes saved (the recomputation then failed checkpoint's check), and the
    measurement's backward recomputed the region, calling the program it was deciding (a
    deadlock). The default backend now trains it as eager does."""
    from torch.utils.checkpoint import checkpoint

    from tests.library_style import RechubMLP

    torch.manual_seed(0)
    block = RechubMLP(8, output_layer=False, dims=[32, 16])  # (an expert of rechub's MMOE)
    reference = copy.deepcopy(block)
    compiled = copy.deepcopy(block)
    compiled.compile(backend="optimus_eqsat")
    x = torch.randn(16, 8, requires_grad=True)
    torch._dynamo.reset()

    def steps() -> None:
        for model in (compiled, reference):
            checkpoint(model, x, use_reentrant=False).square().sum().backward()

    try:
        _within(240, steps)
    finally:
        torch._dynamo.reset()
    scale = max(p.grad.abs().max().item() for p in reference.parameters())
    for got, want in zip(compiled.parameters(), reference.parameters()):  # (float noise a batch norm scales)
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5 * scale)


def test_a_program_laid_out_otherwise_than_the_fake_call_returned_is_not_kept():
    """Programs compiled after a piece (DDPOptimizer's next pieces) expect the layout its
    fake call returned: the candidate's."""
    slow = lambda x: (time.sleep(0.01), x.t().contiguous().t() + 1)[1]  # noqa: E731  column-major
    original = lambda x: x + 1  # noqa: E731
    gm = torch.fx.symbolic_trace(original)
    x = torch.ones(3, 4)
    result = measure_and_choose(
        {"original": original, "optimized": slow}, gm, [x], training=False, budget_s=0.0, layout=[((3, 4), (1, 3))]
    )
    assert result.kept == "optimized" and "laid out otherwise" in result.reason
    same = measure_and_choose(
        {"original": original, "optimized": slow}, gm, [x], training=False, budget_s=0.0, layout=[((3, 4), (4, 1))]
    )
    assert same.kept == "original"


def test_compiled_autograd_is_off_while_the_backward_is_timed():
    import torch._dynamo.compiled_autograd as compiled_autograd

    compiled = []

    def compiler(gm):
        compiled.append(gm)
        return torch.compile(gm, backend="eager")

    w = torch.randn(4, 4, requires_grad=True)
    f = lambda x, w: (x @ w).relu()  # noqa: E731
    with compiled_autograd._enable(compiler):
        step_function(f, [torch.randn(2, 4), w.detach().requires_grad_()], training=True)()
        assert not compiled
        f(torch.randn(2, 4), w).sum().backward()  # (the context does capture an ordinary backward)
    assert compiled


def test_a_deferred_compile_sees_the_inputs_as_dynamo_fakeified_them():
    """A candidate compiled on the first call, after Dynamo's compile, must run in Dynamo's
    tracing context with the inputs' symbolic contexts Dynamo dropped when its compile ended:
    without the context Inductor's caches bypass the compile (a restarted job compiles the
    program kept cold again), without the symbolic contexts the inputs get symbolic sizes."""
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, how = torch.ones(2), object()
    context = TracingContext(FakeTensorMode())
    context.tensor_to_context[x] = how
    seen = []

    def compile_now():
        now = TracingContext.try_get()
        seen.append((now, now.tensor_to_context.get(x) if now is not None else None))
        return lambda *args: None

    with tracing(context):
        deferred = Deferred(compile_now)
    context.tensor_to_context.clear()  # (as Dynamo does at the end of its compile)
    deferred()
    assert seen == [(context, how)]
    assert TracingContext.try_get() is None and x not in context.tensor_to_context
    Deferred(compile_now)()  # (made outside any context: none is made up)
    assert seen[-1] == (None, None)


def test_timing_copies_keep_their_inputs_strides():
    """A graph break can leave column slices of a wider input as a graph's inputs (deepctr's
    DIN: ``X[:, k:k + 1]``, strides (17, 1)); a compiled program asserts its inputs' strides,
    and ``clone`` made the copies contiguous: the timing failed and the original was kept."""
    from optimus_eqsat.fxvocab.meta import copied_inputs

    wide = torch.randn(32, 17)
    column, expanded = wide[:, 4:5], torch.randn(32, 1).expand(32, 8)
    copies = copied_inputs([column, expanded], 1 << 20)
    assert copies[0].stride() == (17, 1) and torch.equal(copies[0], column)
    assert copies[0].untyped_storage().data_ptr() != wide.untyped_storage().data_ptr()
    assert torch.equal(copies[1], expanded) and copies[1].stride() == (1, 0)
    assert copies[1].untyped_storage().data_ptr() != expanded.untyped_storage().data_ptr()


def test_an_expanded_input_keeps_its_zero_strides_in_the_timing():
    """Hugging Face's MoE blocks hand a graph an expanded mask (strides (0, 32, 1)); the copy the
    measurement ran on was a contiguous clone, the compiled program asserted stride 0 and the
    timing failed, so the optimized program was dropped."""
    model = nn.ModuleList(nn.Linear(32, 32) for _ in range(3))

    def forward(x, bias):
        return sum((layer(x) * bias).sum() for layer in model)

    x, bias = torch.randn(4, 16, 32), torch.randn(1, 16, 32).expand(4, 16, 32)
    from optimus_eqsat.backend import make_backend

    backend = make_backend(min_gain=0.0)  # (any predicted gain makes a candidate to time)
    torch._dynamo.reset()
    torch.compile(forward, backend=backend)(x, bias).backward()
    assert backend.reports and all(r.measured is not None for r in backend.reports)
    assert not any("measurement failed" in (r.fallback_reason or "") for r in backend.reports)
