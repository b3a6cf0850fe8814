"""The benchmark harness: the interleaving schedule and paired-ratio statistics
on synthetic timings (instant), one end-to-end CLI run on a tiny model (eager
and Inductor, batch 4, two rounds; about 20-40 s on CPU), and fast checks of
the methods, error rows and report writing."""

from __future__ import annotations

import math
from collections import Counter
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from benchmarks import methods
from benchmarks.__main__ import eqsat_variants, main, model_names, thread_counts
from benchmarks.harness import ALL_THREADS, BenchConfig, run
from benchmarks.instrument import CompileRecord
from benchmarks.measure import count_events, timed_step
from benchmarks.methods import EqsatOptions
from benchmarks.report import parse_kinds, summary_table, write_all
from benchmarks.rounds import RoundPlan, round_order, run_rounds
from benchmarks.stats import paired_ratios, spread, unstable

QUICK = RoundPlan(min_rounds=2, max_rounds=2, steps=2, warmup=1, round_warmup=0)

# --- the schedule --------------------------------------------------------------


def test_rotate_order_puts_every_method_in_every_round_and_position():
    labels = ["a", "b", "c"]
    orders = [round_order(labels, r) for r in range(6)]
    assert all(sorted(o) == labels for o in orders)
    assert len({tuple(o) for o in orders}) == 6  # the order varies from round to round
    for position in range(3):  # over two cycles, each method takes each position twice
        assert Counter(o[position] for o in orders) == Counter({"a": 2, "b": 2, "c": 2})
    follows = Counter((o[i], o[i + 1]) for o in orders for i in range(2))
    assert follows[("a", "b")] == follows[("b", "a")]  # nobody always runs right after the same method


def test_shuffle_order_is_seeded_and_varies():
    labels = list("abcde")
    orders = [round_order(labels, r, "shuffle", seed=3) for r in range(8)]
    assert all(sorted(o) == labels for o in orders)
    assert len({tuple(o) for o in orders}) > 1
    assert orders == [round_order(labels, r, "shuffle", seed=3) for r in range(8)]
    assert round_order([], 0) == []


def test_bad_plans_are_refused():
    with pytest.raises(ValueError):
        RoundPlan(order="sorted")
    with pytest.raises(ValueError):
        RoundPlan(min_rounds=5, max_rounds=2)


# --- statistics on synthetic timings -------------------------------------------


def _constant(ms: float):
    return lambda: ms


def test_a_method_twice_as_slow_has_ratio_two_and_no_spread():
    plan = RoundPlan(min_rounds=4, max_rounds=10, steps=3, warmup=1)
    result = run_rounds({"inductor": _constant(1.0), "slow": _constant(2.0)}, plan)
    assert result.stop == "stable" and result.rounds == 4 and not result.unstable
    ratio = spread(result.ratios("inductor")["slow"])
    assert (ratio.median, ratio.p10, ratio.p90, ratio.n) == (2.0, 2.0, 2.0, 4)
    assert [sorted(o) for o in result.orders] == [["inductor", "slow"]] * 4
    assert result.orders[0] != result.orders[1]


def test_noise_widens_the_spread_and_the_rule_reports_it():
    noise = iter(torch.rand(1000, generator=torch.Generator().manual_seed(0)).tolist())
    noisy = lambda: 2.0 * (0.5 + next(noise))  # noqa: E731  (+-50%)
    plan = RoundPlan(min_rounds=3, max_rounds=6, steps=1, warmup=0, round_warmup=0, target_spread=0.05)
    result = run_rounds({"inductor": _constant(1.0), "noisy": noisy}, plan)
    assert result.stop == "max_rounds" and result.rounds == 6
    assert result.unstable == ["noisy"]
    ratio = spread(result.ratios("inductor")["noisy"])
    assert ratio.p90 - ratio.p10 > 0.1 and ratio.rel_width > 0.05


def test_pairing_cancels_drift_that_widens_the_times():
    """The machine slows down round after round: both methods' times spread
    widely, their per-round ratio does not."""
    calls = {"n": 0}
    per_round = 2 * 2  # two methods x two timed steps, no warm-up

    def drifting(base: float):
        def step() -> float:
            calls["n"] += 1
            return base * (1 + 0.5 * ((calls["n"] - 1) // per_round))

        return step

    plan = RoundPlan(min_rounds=5, max_rounds=5, steps=2, warmup=0, round_warmup=0, target_spread=0.01)
    result = run_rounds({"inductor": drifting(1.0), "ours": drifting(1.5)}, plan)
    assert spread(result.round_ms["ours"]).rel_width > 0.5
    assert spread(result.ratios("inductor")["ours"]).rel_width < 1e-12
    assert result.stop == "stable"


def test_fast_methods_take_more_steps_per_turn():
    plan = RoundPlan(min_rounds=1, max_rounds=1, steps=3, warmup=2, min_turn_ms=20.0)
    result = run_rounds({"inductor": _constant(50.0), "fast": _constant(0.5), "tiny": _constant(1e-6)}, plan)
    assert result.steps == {"inductor": 3, "fast": 40, "tiny": 1000}
    no_warmup = run_rounds({"x": _constant(0.5)}, RoundPlan(min_rounds=1, max_rounds=1, steps=3, warmup=0))
    assert no_warmup.steps == {"x": 3}


def test_time_limit_stops_adding_rounds_after_the_minimum():
    ticks = iter(range(1000))
    plan = RoundPlan(min_rounds=2, max_rounds=50, steps=1, warmup=0, round_warmup=0, target_spread=0.0, max_seconds=3)
    noisy = iter([1.0, 2.0] * 100)
    result = run_rounds({"inductor": _constant(1.0), "x": lambda: next(noisy)}, plan, clock=lambda: float(next(ticks)))
    assert result.stop == "time_limit" and 2 <= result.rounds < 50


def test_a_method_that_fails_mid_run_is_dropped_and_reported():
    count = {"n": 0}

    def breaks() -> float:
        count["n"] += 1
        if count["n"] > 1:
            raise RuntimeError("boom\nsecond line")
        return 1.0

    plan = RoundPlan(min_rounds=3, max_rounds=3, steps=1, warmup=0, round_warmup=0)
    result = run_rounds({"inductor": _constant(1.0), "bad": breaks}, plan)
    assert result.errors == {"bad": "RuntimeError: boom"}
    assert result.rounds == 3 and len(result.round_ms["inductor"]) == 3
    assert len(result.round_ms["bad"]) == 1  # its first turn only: it broke in the second


def test_stats_without_a_baseline_judge_each_method_alone():
    assert math.isnan(spread([]).median) and spread([]).rel_width == math.inf
    assert paired_ratios({"x": [1.0]}, "inductor") == {}
    assert unstable({"x": [1.0, 1.0], "y": [1.0, 3.0]}, None, 0.1) == ["y"]
    assert unstable({"inductor": [1.0, 3.0]}, "inductor", 0.1) == ["inductor"]  # alone: its own spread


def test_timed_step_and_event_counting():
    ms = timed_step(lambda: sum(range(1000)), "cpu")()
    assert 0 < ms < 1000
    events = [
        SimpleNamespace(name="cudaGraphLaunch"),
        SimpleNamespace(name="cudaLaunchKernel"),
        SimpleNamespace(name="cudaGraphLaunch"),
    ]
    assert count_events(events, "cudaGraphLaunch") == 2


# --- the methods ----------------------------------------------------------------


def test_ablation_variants_label_rows():
    variants = eqsat_variants("splitcat;splitcat,batching", "greedy;ilp", None)
    assert len(variants) == 4
    assert variants[1] == EqsatOptions(("splitcat",), "ilp", None)
    assert variants[3].kwargs() == {"rulesets": ("splitcat", "batching"), "extractor": "ilp"}
    assert variants[3].label() == {
        "rulesets": "splitcat+batching",
        "extractor": "ilp",
        "profile": "default",
        "measure": "default",
    }
    assert eqsat_variants(None, None, None, "on;off")[1].kwargs() == {"measure": False}
    assert eqsat_variants(None, None, None) == [EqsatOptions()]
    ms = methods.make_methods(["inductor", "optimus_eqsat"], variants)
    assert [m.name for m in ms] == ["inductor"] + ["optimus_eqsat"] * 4
    assert len({m.label for m in ms}) == 5 and ms[2].label == "optimus_eqsat[splitcat/ilp/default]"
    assert methods.make_methods(["optimus_eqsat"], [EqsatOptions()])[0].label == "optimus_eqsat"
    with pytest.raises(ValueError):
        methods.make_methods(["nope"], variants)


def test_cuda_methods_are_cuda_only_and_configured_like_their_torch_modes():
    from torch._inductor import config as inductor_config
    from torch._inductor import list_mode_options

    with pytest.raises(ValueError, match="--device cuda"):
        methods.make_methods(["inductor_cudagraphs"], [EqsatOptions()], "cpu")
    assert methods.default_methods("cpu") == list(methods.CPU_METHODS)
    built = {m.name: m for m in methods.make_methods(methods.default_methods("cuda"), [EqsatOptions()], "cuda")}
    assert set(built) == set(methods.METHOD_NAMES)
    reduce_overhead = list_mode_options("reduce-overhead")
    assert built["inductor_cudagraphs"].inductor_config == reduce_overhead == {"triton.cudagraphs": True}
    assert built["inductor_cudagraphs"].cudagraphs and not built["inductor_cudagraphs"].uses_eqsat
    eqsat_graphs = built["optimus_eqsat_cudagraphs"]
    assert eqsat_graphs.cudagraphs and eqsat_graphs.uses_eqsat and eqsat_graphs.inductor_config == reduce_overhead
    assert built["inductor_combo"].inductor_config == {"combo_kernels": True}
    for m in built.values():  # every patched option exists in this torch
        with inductor_config.patch(m.inductor_config):
            pass
    assert methods.reduce_overhead_inductor().config == reduce_overhead


def test_cudagraph_methods_mark_a_new_step_before_every_call(monkeypatch):
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    monkeypatch.setattr(methods.Method, "inner_backend", lambda self: lambda gm, _inputs: gm.forward)
    method = methods.Method("inductor_cudagraphs", cudagraphs=True)
    model = torch.nn.Linear(3, 2)
    torch._dynamo.reset()
    try:
        fn = method.prepare(model, CompileRecord())
        fn(torch.ones(1, 3))
        fn(torch.ones(1, 3))
    finally:
        torch._dynamo.reset()
    assert len(marks) == 2


def test_eqsat_summary_reads_backend_reports_defensively():
    full = SimpleNamespace(
        stop_reason="saturated",
        extractor="ilp",
        enodes=50,
        rules_fired={"a": 2, "b": 1},
        launches_before=10,
        launches_after=4,
        phase_seconds={"saturate": 0.5},
        fell_back=False,
    )
    bare = SimpleNamespace()  # a report from a future version with other fields
    record = CompileRecord(backend=SimpleNamespace(reports=[full, bare]))
    summary = record.eqsat_summary()
    assert summary["eqsat_enodes"] == 50 and summary["eqsat_rules_fired"] == 3
    assert summary["eqsat_launches_before"] == 10 and summary["eqsat_launches_after"] == 4
    assert summary["eqsat_stop"] == "saturated;" and summary["eqsat_fallback_reason"] == ""
    assert CompileRecord(eqsat_reports=[full]).eqsat_summary()["eqsat_enodes"] == 50  # meta fallback


def test_cli_value_parsing():
    assert thread_counts("1,all") == list(dict.fromkeys([1, ALL_THREADS]))
    assert thread_counts("2") == [2]
    assert "dlrm_big" in model_names("big") and "dlrm" in model_names("all")
    assert model_names("mmoe,dlrm,mmoe") == ["mmoe", "dlrm"]


# --- the harness end to end -----------------------------------------------------


def test_cli_end_to_end(tmp_path):
    argv = [
        "--models",
        "dlrm",
        "--methods",
        "eager,inductor",
        "--mode",
        "inference",
        "--batches",
        "4",
        "--warmup",
        "1",
        "--steps",
        "2",
        "--rounds",
        "2",
        "--max-rounds",
        "2",
        "--threads",
        "1",
        "--no-progress",
        "--out",
        str(tmp_path),
        "--keep-caches",  # a rerun hits Inductor's on-disk cache: seconds instead of a cold compile
    ]
    assert main(argv) == 0
    for name in (
        "results.csv",
        "summary.csv",
        "results.md",
        "step_time_ratio.png",
        "peak_mem_ratio.png",
        "launches.png",
        "kernel_kinds.png",
    ):
        assert (tmp_path / name).stat().st_size > 0, name
    df = pd.read_csv(tmp_path / "results.csv", keep_default_na=False)
    assert list(df["method"]) == ["eager", "inductor"]
    assert (df["error"] == "").all(), df["error"].tolist()
    assert (df["batch"] == 4).all() and (df["threads"] == 1).all() and (df["rows"] == 1000).all()
    assert (df["fx_nodes"].astype(float) > 10).all()  # Dynamo graph seen for eager too
    assert (df["rounds"] == 2).all() and (df["recompiles"] == 0).all()
    assert (df["run_ms_p10"] <= df["run_ms"]).all() and (df["run_ms"] <= df["run_ms_p90"]).all()
    inductor = df[df["method"] == "inductor"].iloc[0]
    assert float(inductor["inductor_launches"]) > 0
    assert float(inductor["run_ratio_vs_inductor"]) == 1.0 == float(inductor["run_ratio_p90"])
    assert float(inductor["peak_mem_ratio_vs_inductor"]) == 1.0
    assert float(inductor["compile_s"]) > 0 and float(inductor["compile_ratio_vs_inductor"]) == 1.0
    assert float(inductor["max_abs_diff_out"]) < 1e-4
    assert parse_kinds(inductor["emitted_kinds"])["generated"] == float(inductor["inductor_generated"])
    eager = df[df["method"] == "eager"].iloc[0]
    assert float(eager["run_ratio_vs_inductor"]) > 0 and eager["compile_s"] == ""
    md = (tmp_path / "results.md").read_text()
    assert "| dlrm |" in md and "inductor_ms" in md
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert list(summary.columns) == ["model", "mode", "batch", "threads", "inductor_ms", "eager"]


def test_training_rows_compare_gradients():
    rows = run(
        BenchConfig(
            models=["transformer"],
            methods=["eager"],
            modes=["training"],
            batches=[2],
            threads=[1],
            plan=QUICK,
            progress=False,
        )
    )
    (row,) = rows
    assert row["error"] == ""
    assert row["max_abs_diff_out"] == 0.0 and row["max_abs_diff_grad"] == 0.0
    assert row["peak_mem_mb"] > 0 and row["rounds"] == 2
    assert math.isnan(row["run_ratio_vs_inductor"])  # no baseline in this run


def test_methods_of_a_case_stay_compiled_side_by_side(monkeypatch):
    """Compiling a later method must not reset Dynamo: the earlier ones would
    recompile without their settings (torch's run_and_get_code resets it)."""
    monkeypatch.setattr(methods.Method, "inner_backend", lambda self: lambda gm, _inputs: gm.forward)
    rows = run(
        BenchConfig(
            models=["dlrm"],
            methods=["inductor", "inductor_optimus", "eager"],
            batches=[2],
            threads=[1],
            plan=QUICK,
            progress=False,
        )
    )
    assert [(r["method"], r["error"], r["recompiles"]) for r in rows] == [
        ("inductor", "", 0),
        ("inductor_optimus", "", 0),
        ("eager", "", 0),
    ]
    assert all(r["graphs"] == 1 for r in rows)


def test_broken_method_becomes_an_error_row(monkeypatch):
    def missing(_options):
        raise ImportError("optimus_eqsat.backend not there")

    monkeypatch.setattr(methods, "eqsat_backend", missing)
    rows = run(
        BenchConfig(
            models=["dlrm"], methods=["eager", "optimus_eqsat"], batches=[2], threads=[1], plan=QUICK, progress=False
        )
    )
    assert [r["method"] for r in rows] == ["eager", "optimus_eqsat"]
    assert rows[0]["error"] == "" and rows[0]["rounds"] == 2
    assert rows[1]["error"].startswith("ImportError")


def test_reports_from_synthetic_rows(tmp_path):
    base = dict(
        scale=1,
        rows=1000,
        batch=4,
        mode="inference",
        threads=1,
        device="cpu",
        rulesets="default",
        extractor="default",
        profile="default",
        error="",
        pred_kinds="",
        mem_source="x",
        stable=True,
    )
    rows = [
        dict(
            base,
            model="m",
            method="inductor",
            fx_nodes=100,
            inductor_launches=10.0,
            inductor_passes_s=0.1,
            optimizer_s=math.nan,
            pred_launches=9.0,
            emitted_kinds="extern:addmm=4;generated=6",
            run_ms=1.0,
            run_ratio_vs_inductor=1.0,
            run_ratio_p10=1.0,
            run_ratio_p90=1.0,
            peak_mem_ratio_vs_inductor=1.0,
        ),
        dict(
            base,
            model="m",
            method="optimus_eqsat",
            rulesets="splitcat",
            fx_nodes=100,
            inductor_launches=4.0,
            inductor_passes_s=0.1,
            optimizer_s=0.5,
            pred_launches=4.0,
            emitted_kinds="generated=4",
            run_ms=2.0,
            run_ratio_vs_inductor=2.0,
            run_ratio_p10=1.9,
            run_ratio_p90=2.2,
            stable=False,
            peak_mem_ratio_vs_inductor=1.5,
        ),
        dict(
            base,
            model="m",
            method="optimus_eqsat",
            fx_nodes=math.nan,
            inductor_launches=math.nan,
            inductor_passes_s=math.nan,
            optimizer_s=math.nan,
            pred_launches=math.nan,
            emitted_kinds="",
            run_ms=math.nan,
            error="ImportError: no backend",
        ),
    ]
    written = write_all(rows, tmp_path)
    assert set(written) == {
        "csv",
        "summary",
        "md",
        "step_time_ratio",
        "peak_mem_ratio",
        "launches",
        "optimizer_time",
        "kernel_kinds",
    }
    md = (tmp_path / "results.md").read_text()
    assert "splitcat/default/default" in md and "ImportError: no backend" in md
    table = summary_table(pd.DataFrame(rows))
    cells = table.iloc[0].to_dict()
    assert cells["inductor_ms"] == 1.0
    assert cells["optimus_eqsat[splitcat/default/default]"] == "2.00 [1.90, 2.20]*"
    assert cells["optimus_eqsat"] == "err"


def test_post_grad_graphs_are_not_counted_as_the_method_s_program():
    """Our backend also optimizes Inductor's aten graphs (the post-grad pass); the row's
    predicted step is that of the program handed to Inductor, not that plus its forward
    and backward aten graphs again (which doubled it)."""
    rows = run(
        BenchConfig(
            models=["dlrm"],
            methods=["optimus_eqsat"],
            modes=["training"],
            batches=[2],
            threads=[1],
            plan=QUICK,
            progress=False,
            eqsat_variants=[EqsatOptions(measure=False)],
        )
    )
    (row,) = rows
    assert row["error"] == ""
    assert 0 < row["pred_step_ms"] <= 1.2 * row["pred_step_ms_dynamo"], row
