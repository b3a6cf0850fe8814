"""Threads serving one model: compiles and first calls that happen at once in several threads
(a server's worker threads sharing a compiled model) neither fail nor crash the process.

Each test here failed before its fix: egglog's e-graphs panic when used in a thread other
than their maker's, two first calls of one measured program both decided (the second found
the programs freed), a compile on a first call overlapped another thread's, two profiler
sessions at once crash torch's profiler, and a parameter packed into its stack while another
thread's compile fakeified it failed that compile."""

from __future__ import annotations

import copy
import sys
import threading
import time

import pytest
import torch
from torch._dynamo import convert_frame

from benchmarks.synthetic import split_cat_chain
from optimus_eqsat import optimize_graph
from optimus_eqsat.guard import Deferred, FirstCallChoice, GuardResult, step_peak_bytes
from optimus_eqsat.parameter_cache import CachedParameterWork, split_parameter_work
from tests.test_parameter_cache import _stacked_linears


def _in_threads(target, n: int) -> list[BaseException]:
    """Run ``target`` in ``n`` threads started together; the exceptions they raised."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def run() -> None:
        barrier.wait()
        try:
            target()
        except BaseException as exc:  # (a pyo3 panic is a BaseException)
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_an_optimization_in_another_thread_builds_its_own_prepared_egraph():
    gm, _ = split_cat_chain(20)
    here = optimize_graph(copy.deepcopy(gm))  # leaves a prepared e-graph in this thread's pool
    there: list = []
    assert not _in_threads(lambda: there.append(optimize_graph(copy.deepcopy(gm))), 2)
    for program in there:
        assert program.meta["optimus_eqsat"].fallback_reason is None
        assert program.code == here.code


def test_first_calls_from_several_threads_decide_once(monkeypatch):
    decisions = []

    def slow_choice(programs, *args, **kwargs):
        decisions.append(threading.get_ident())
        time.sleep(0.2)  # (the others call meanwhile)
        return GuardResult("optimized", {}, 0.5, 0.5, 0.5, 1, reason="faster")

    monkeypatch.setattr("optimus_eqsat.guard.measure_and_choose", slow_choice)
    add = lambda x: x + 1  # noqa: E731
    choice = FirstCallChoice({"original": add, "optimized": add}, torch.fx.symbolic_trace(add), 0.0, lambda r: None)
    outs: list = []
    assert not _in_threads(lambda: outs.append(choice(torch.ones(2))), 4)
    assert len(decisions) == 1 and len(outs) == 4 and choice.chosen is add


def test_peak_memory_measured_in_two_threads_at_once(capfd):
    x = torch.randn(256, 256)
    peaks: list = []
    assert not _in_threads(lambda: peaks.append(step_peak_bytes(lambda: x + 1, on_cuda=False)), 2)
    assert len(peaks) == 2 and min(peaks) >= x.numel() * 4
    print("standard error restored", file=sys.stderr, flush=True)  # (each silenced it in turn)
    assert "standard error restored" in capfd.readouterr().err


def test_parameters_move_into_their_stacks_only_while_no_compile_runs():
    gm, inputs = _stacked_linears()
    work = split_parameter_work(gm, inputs)
    assert work is not None
    program = CachedParameterWork(work, work.main)
    params = [inputs[k] for k in work.param_positions]
    where = [p.data_ptr() for p in params]
    done = threading.Event()

    def first_call() -> None:
        with torch.no_grad():  # (grad mode is each thread's own)
            program(*inputs)
        done.set()

    with convert_frame.compile_lock:  # another thread's compile, say
        first = threading.Thread(target=first_call)
        first.start()
        assert not done.wait(0.3)  # the first call waits for the compile to end ...
        assert [p.data_ptr() for p in params] == where  # ... before it moves a parameter
    first.join()
    assert done.is_set() and [p.data_ptr() for p in params] != where
    with torch.no_grad():
        torch.testing.assert_close(program(*inputs), gm(*inputs))


def test_a_compile_on_the_first_call_waits_for_another_threads_compile():
    """(It patches Inductor's config, which is the process's, not the thread's.)"""
    compiled = Deferred(lambda: "program")
    got: list = []
    with convert_frame.compile_lock:
        first = threading.Thread(target=lambda: got.append(compiled()))
        first.start()
        first.join(0.3)
        assert first.is_alive() and not got
    first.join()
    assert got == ["program"]


@pytest.mark.slow
def test_threads_serving_one_compiled_model_answer_as_eager():
    """Four threads make the first calls of one model compiled with the backend's defaults
    (the measured choice and the parameter cache on) at once, three calls each."""
    from tests.library_style import BUILDERS

    torch.manual_seed(0)
    model, inputs = BUILDERS["rechub.MMOE"](32)
    model.eval()
    with torch.no_grad():
        want = model(*inputs)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="optimus_eqsat")
    got: list = []

    def serve() -> None:
        with torch.no_grad():
            for _ in range(3):
                got.append(compiled(*inputs))

    assert not _in_threads(serve, 4)
    assert len(got) == 12
    for out in got:
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
