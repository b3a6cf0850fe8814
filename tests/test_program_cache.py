"""The persistent cache: optimized programs and measured decisions survive a restart, and an
entry is served only for the graph, inputs, options and code it was made for."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
import torch.nn as nn

from optimus_eqsat import optimize_graph
from optimus_eqsat.backend import make_backend
from optimus_eqsat.cli import main as cli_main
from optimus_eqsat.demo import DemoRecModel
from optimus_eqsat.disk_cache import DiskCache, clear_cache
from optimus_eqsat.guard import GuardResult
from optimus_eqsat.program_cache import DECISIONS, PROGRAMS, StoredDecision


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """The cache on, in a folder of this test's own (conftest turns it off for the others)."""
    monkeypatch.setenv("OPTIMUS_EQSAT_CACHE", "1")
    monkeypatch.setenv("OPTIMUS_EQSAT_CACHE_DIR", str(tmp_path))
    return tmp_path


def _demo(batch: int = 16):
    torch.manual_seed(0)
    model = DemoRecModel(features=2)
    return torch.fx.symbolic_trace(model), model.example_inputs(batch=batch)


def test_a_second_optimization_of_the_same_graph_is_read_back_equal(cache_dir):
    gm, inputs = _demo()
    first = optimize_graph(gm, inputs, profile="h100")
    second = optimize_graph(gm, inputs, profile="h100")
    r1, r2 = first.meta["optimus_eqsat"], second.meta["optimus_eqsat"]
    assert not r1.from_cache and r2.from_cache and len(PROGRAMS) == 1
    assert r1.changed and second.code == first.code
    assert (r2.launches_after, r2.cost_after, r2.batched) == (r1.launches_after, r1.cost_after, r1.batched)
    assert set(r2.phase_seconds) == {"cache"} and "persistent cache" in r2.summary()
    torch.testing.assert_close(second(*inputs), gm(*inputs), rtol=1e-5, atol=1e-5)
    # the restored program reads the input graph's own parameters
    assert {id(p) for p in second.parameters()} <= {id(p) for p in gm.parameters()}


def test_a_dynamo_training_graph_is_restored_with_the_same_meta(cache_dir):
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU())
    towers = nn.ModuleList(nn.Linear(16, 4) for _ in range(4))

    class Towers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.towers = model, towers

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.body(x)
            return torch.cat([torch.relu(t(h)) for t in self.towers], dim=1)

    graphs = []

    def grab(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(Towers(), backend=grab)(torch.randn(32, 8))
    gm, inputs = graphs[0]
    kwargs = dict(profile="h200", mode="training", never_worse=False)
    first, second = optimize_graph(gm, inputs, **kwargs), optimize_graph(gm, inputs, **kwargs)
    assert second.meta["optimus_eqsat"].from_cache and second.code == first.code
    for a, b in zip(first.graph.nodes, second.graph.nodes):
        assert set(a.meta) == set(b.meta), a.name
        if isinstance(a.meta.get("val"), torch.Tensor):
            assert (a.meta["val"].shape, a.meta["val"].stride()) == (b.meta["val"].shape, b.meta["val"].stride())


@pytest.mark.parametrize("change", ["shape", "options", "grad_mode", "rule_set", "calibration", "threads"])
def test_an_entry_is_not_served_for_another_graph_input_option_or_mode(cache_dir, change):
    gm, inputs = _demo()
    optimize_graph(gm, inputs, profile="h100")
    kwargs: dict = {"profile": "h100"}
    if change == "shape":
        _, inputs = _demo(batch=24)
    elif change == "options":
        kwargs["min_gain"] = 0.02
    elif change == "rule_set":
        kwargs["rulesets"] = ("algebraic",)
    elif change == "calibration":  # a profile `optimus-eqsat calibrate` wrote since
        (cache_dir / "profiles").mkdir()
        (cache_dir / "profiles" / "cpu_float32.json").write_text("{}")
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1 if change == "threads" else threads)
    try:
        with torch.set_grad_enabled(change != "grad_mode"):
            again = optimize_graph(gm, inputs, **kwargs)
    finally:
        torch.set_num_threads(threads)
    assert not again.meta["optimus_eqsat"].from_cache and len(PROGRAMS) == 2


def test_a_module_switched_between_train_and_eval_is_not_served_the_other_modes_program(cache_dir):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 4))
    gm, x = torch.fx.symbolic_trace(model), torch.randn(32, 8)
    with torch.no_grad():
        gm.eval()
        evaluated = optimize_graph(gm, (x,), profile="h100")
        gm.train()
        trained = optimize_graph(gm, (x,), profile="h100")
        assert not trained.meta["optimus_eqsat"].from_cache
        trained.train(), gm.train()
        torch.manual_seed(1)
        expected = gm(x)
        torch.manual_seed(1)
        torch.testing.assert_close(trained(x), expected)  # batch statistics and dropout, as in train mode
        gm.eval()
        assert optimize_graph(gm, (x,), profile="h100").meta["optimus_eqsat"].from_cache
        torch.testing.assert_close(evaluated(x), gm(x))


def test_the_cost_models_fallback_is_cached_an_error_and_a_time_limits_original_are_not(cache_dir, monkeypatch):
    gm, inputs = _demo()
    declined = optimize_graph(gm, inputs, profile="h100", min_gain=0.99)
    assert declined.meta["optimus_eqsat"].fell_back
    again = optimize_graph(gm, inputs, profile="h100", min_gain=0.99)
    assert again.meta["optimus_eqsat"].from_cache and again.meta["optimus_eqsat"].fell_back
    assert again.code == declined.code
    # the original kept by a budget spent before saturation: storing it would cost what a
    # restart's fallback costs (a large graph's pickle takes seconds)
    cut = optimize_graph(gm, inputs, profile="h100", time_limit_s=1e-6)
    assert cut.meta["optimus_eqsat"].stop_reason == "time_limit" and len(PROGRAMS) == 1
    again = optimize_graph(gm, inputs, profile="h100", time_limit_s=1e-6)
    assert not again.meta["optimus_eqsat"].from_cache and again.code == cut.code
    import optimus_eqsat.api as api

    monkeypatch.setattr(api.OptimizationRun, "optimize", lambda self: 1 / 0)
    failed = optimize_graph(gm, inputs, profile="h100", min_gain=0.5)
    assert failed.meta["optimus_eqsat"].fell_back and len(PROGRAMS) == 1


@pytest.mark.parametrize("switch", ["env", "option", "inductor_force_disable_caches"])
def test_the_cache_can_be_turned_off(cache_dir, monkeypatch, switch):
    gm, inputs = _demo()
    kwargs: dict = {"profile": "h100"}
    if switch == "option":
        kwargs["persistent_cache"] = False
    optimize_graph(gm, inputs, profile="h100")  # an entry the switched-off call must not read
    if switch == "env":
        monkeypatch.setenv("OPTIMUS_EQSAT_CACHE", "0")
    with torch._inductor.config.patch(force_disable_caches=switch == "inductor_force_disable_caches"):
        assert not optimize_graph(gm, inputs, **kwargs).meta["optimus_eqsat"].from_cache
    assert len(PROGRAMS) == 1


def test_an_unreadable_entry_is_a_miss_and_is_dropped(cache_dir):
    gm, inputs = _demo()
    optimize_graph(gm, inputs, profile="h100")
    (entry,) = PROGRAMS.folder.glob("*.pkl")
    entry.write_bytes(entry.read_bytes()[:100])  # a writer killed half way (not possible with
    again = optimize_graph(gm, inputs, profile="h100")  # the rename, but a full disk can truncate)
    assert not again.meta["optimus_eqsat"].from_cache
    torch.testing.assert_close(again(*inputs), gm(*inputs), rtol=1e-5, atol=1e-5)
    assert optimize_graph(gm, inputs, profile="h100").meta["optimus_eqsat"].from_cache  # rewritten whole


def test_a_cache_folder_that_cannot_be_made_is_a_miss_not_an_error(tmp_path, monkeypatch):
    """A cache path through a file (or ``XDG_CACHE_HOME=/dev/null`` in a container): every
    lookup is a miss and every write is skipped, and the user's compile runs uncached."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("OPTIMUS_EQSAT_CACHE", "1")
    monkeypatch.setenv("OPTIMUS_EQSAT_CACHE_DIR", str(blocker / "cache"))
    cache = DiskCache("kind")
    assert cache.get("k") is None and cache.put("k", 1) is False and len(cache) == 0
    gm, inputs = _demo()
    assert not optimize_graph(gm, inputs, profile="h100").meta["optimus_eqsat"].from_cache
    # the backend's decision lookup (the measured choice on) read this folder first
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    x = torch.randn(3, 4)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=make_backend(measure_budget_s=0.01))
    torch.testing.assert_close(compiled(x), model(x))


def test_concurrent_writers_and_readers_see_whole_entries(cache_dir):
    cache = DiskCache("race")
    value = {"payload": list(range(20000))}
    seen, errors = [], []

    writes_over = threading.Event()

    def write() -> None:
        for _ in range(30):
            cache.put("k", value)

    def read() -> None:
        # (until the writes are over, then once more: a fixed count of reads can all come before
        # the first write ends on a loaded machine, and then nothing would be checked)
        while True:
            last = writes_over.is_set()
            got = cache.get("k")
            if got is not None:
                seen.append(got == value)
            if last:
                return

    writers = [threading.Thread(target=write) for _ in range(2)]
    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in writers + readers:
        t.start()
    for t in writers:
        t.join()
    writes_over.set()
    for t in readers:
        t.join()
    assert seen and all(seen) and not errors
    assert not list(cache.folder.glob(".tmp-*"))  # no temporary file left behind


class _SplitScaleCat(nn.Module):
    """A graph the pre-grad pass rewrites, so the backend's first call times it."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        return self.b(torch.cat([p * 2 for p in torch.split(h, 4, dim=1)], dim=1))


def _step(model: nn.Module, backend, x: torch.Tensor) -> dict[str, torch.Tensor]:
    torch._dynamo.reset()
    torch.compile(model, backend=backend)(x).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_a_restarted_backend_reuses_the_measured_decision_untimed(cache_dir):
    torch.manual_seed(0)
    model, x = _SplitScaleCat(), torch.randn(32, 8)
    reference = copy.deepcopy(model)
    reference(x).sum().backward()
    first = make_backend(measure_budget_s=0.05)
    _step(model, first, x)
    measured = first.reports[-1].measured
    assert measured is not None and measured.rounds > 0 and len(DECISIONS) == 1
    model.zero_grad()
    second = make_backend(measure_budget_s=0.05)  # a new process's backend, Dynamo reset
    grads = _step(model, second, x)
    report = second.reports[-1]
    assert report.from_cache and report.measured.kept == measured.kept
    assert report.measured.step_s == measured.step_s  # the stored measurement, not a new one
    assert "earlier run" in report.measured.reason and report.measured.overhead_s == 0
    for name, p in reference.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_a_choice_that_needed_no_timing_is_stored_so_a_cache_served_program_is_not_timed(cache_dir):
    """Nothing to batch (the masks alone recomputed): the first process compiles once, untimed.
    Later, Inductor's cache serves the program without running our passes; the stored decision
    says there is nothing to time, where the backend alone could not tell and would time it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4)).train()
    x = torch.randn(32, 8)
    first, second = make_backend(measure_budget_s=0.05), make_backend(measure_budget_s=0.05)
    from torch._functorch import config as functorch_config

    # our passes run only in a compile no cache serves (earlier tests may have filled it)
    with torch._inductor.config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        _step(model, first, x)
    assert first.reports[-1].measured.rounds == 0 and len(DECISIONS) == 1
    _step(model, second, x)  # (Inductor's caches may serve this compile: our passes then do not run)
    report = second.reports[-1]
    assert report.from_cache and report.measured.rounds == 0 and "earlier run" in report.measured.reason


def test_a_cached_decision_for_the_original_compiles_the_original_alone(cache_dir, monkeypatch):
    import optimus_eqsat.backend as backend_module

    decided = GuardResult(
        kept="original",
        step_s={"original": 1e-3, "optimized": 2e-3},
        ratio=2.0,
        ratio_p25=1.9,
        ratio_p75=2.1,
        rounds=5,
        reason="measured",
    )
    monkeypatch.setattr(backend_module, "load_decision", lambda key: StoredDecision("original", decided))
    optimized: list = []
    monkeypatch.setattr(backend_module, "optimize_graph", lambda *a, **k: optimized.append(1))
    torch.manual_seed(0)
    model, x = _SplitScaleCat(), torch.randn(32, 8)
    reference = copy.deepcopy(model)
    reference(x).sum().backward()
    backend = make_backend(measure_budget_s=0.05)
    grads = _step(model, backend, x)
    report = backend.reports[-1]
    assert not optimized, "the optimizer ran although the decision was cached"
    assert report.from_cache and report.fell_back and "earlier run" in report.fallback_reason
    for name, p in reference.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_cli_shows_and_clears_the_cache(cache_dir, capsys):
    gm, inputs = _demo()
    optimize_graph(gm, inputs, profile="h100")
    assert cli_main(["cache"]) == 0
    assert "1 programs" in capsys.readouterr().out
    assert cli_main(["cache", "--clear"]) == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert len(PROGRAMS) == 0 and clear_cache() == 0


def test_the_backends_default_budget_grows_with_the_graph(monkeypatch):
    import optimus_eqsat.backend as backend_module
    from optimus_eqsat.budget import BACKEND_BASE_S, BACKEND_MAX_S, backend_time_limit

    assert backend_time_limit(10) < backend_time_limit(5000) <= BACKEND_MAX_S == backend_time_limit(10**6)
    limits: list[float] = []

    def capture(gm, example_inputs, **options):
        limits.append(options["time_limit_s"])
        return gm

    monkeypatch.setattr(backend_module, "optimize_graph", capture)
    for backend, expected in [(make_backend(inductor=False), None), (make_backend(inductor=False, time_limit_s=3), 3)]:
        torch._dynamo.reset()
        torch.compile(_SplitScaleCat(), backend=backend)(torch.randn(4, 8))
        if expected is None:  # a graph of a few ops: the base and a little
            assert BACKEND_BASE_S < limits[-1] < BACKEND_BASE_S + 0.2
        else:
            assert limits[-1] == expected


def test_a_graph_calling_functions_pickle_cannot_name_is_cached(cache_dir):
    """``F.max_pool2d`` is a local function of torch's boolean_dispatch: stored by name."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(36, 2))
    graphs = []

    def grab(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    x = torch.randn(2, 3, 8, 8)
    torch.compile(model, backend=grab)(x)
    gm, inputs = graphs[0]
    first = optimize_graph(gm, inputs, profile="cpu")
    second = optimize_graph(gm, inputs, profile="cpu")
    assert second.meta["optimus_eqsat"].from_cache and second.code == first.code
    torch.testing.assert_close(second(*inputs), first(*inputs))


def test_an_aten_graph_of_torch_ops_operators_is_cached(cache_dir):
    """A post-grad graph calls ``torch.ops.aten`` overloads, which pickle cannot name."""
    from optimus_eqsat.inductor_count import capture_dynamo_graph
    from optimus_eqsat.postgrad import optimize_aten_graph
    from optimus_eqsat.postgrad.capture import aten_graphs

    torch.manual_seed(0)
    model = DemoRecModel(features=2)
    gm, example = capture_dynamo_graph(model, model.example_inputs(batch=8))
    forward = aten_graphs(gm, example)[0]
    assert any(isinstance(n.target, torch._ops.OpOverload) for n in forward.graph.nodes)
    reports = [optimize_aten_graph(copy.deepcopy(forward).graph, profile="cpu") for _ in range(2)]
    assert len(PROGRAMS) == 1 and not reports[0].from_cache and reports[1].from_cache
