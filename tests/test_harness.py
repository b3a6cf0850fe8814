"""The benchmark harness: one end-to-end CLI run on a tiny model (eager and
Inductor, about 10-30 s on CPU), plus fast checks of the ablation parsing,
error rows and report writing."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from benchmarks import methods
from benchmarks.__main__ import eqsat_variants, main
from benchmarks.harness import BenchConfig, run
from benchmarks.methods import EqsatOptions
from benchmarks.report import parse_kinds, write_all


def test_cli_end_to_end(tmp_path):
    argv = [
        "--models", "dlrm", "--methods", "eager,inductor", "--mode", "inference",
        "--batch", "4", "--warmup", "1", "--repeats", "3", "--threads", "1",
        "--no-progress", "--out", str(tmp_path),
    ]
    assert main(argv) == 0
    for name in ("results.csv", "results.md", "launches.png", "kernel_kinds.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    df = pd.read_csv(tmp_path / "results.csv", keep_default_na=False)
    assert list(df["method"]) == ["eager", "inductor"]
    assert (df["error"] == "").all(), df["error"].tolist()
    assert (df["fx_nodes"].astype(float) > 10).all()  # Dynamo graph seen for eager too
    inductor = df[df["method"] == "inductor"].iloc[0]
    assert float(inductor["inductor_launches"]) > 0
    assert float(inductor["run_ratio_vs_inductor"]) == 1.0
    assert float(inductor["max_abs_diff_out"]) < 1e-4
    assert float(inductor["compile_s"]) > 0
    assert parse_kinds(inductor["emitted_kinds"])["generated"] == float(inductor["inductor_generated"])
    assert "| dlrm |" in (tmp_path / "results.md").read_text()


def test_training_rows_compare_gradients():
    rows = run(BenchConfig(models=["transformer"], methods=["eager"], modes=["training"],
                           batch=2, warmup=0, repeats=1, progress=False))
    (row,) = rows
    assert row["error"] == ""
    assert row["max_abs_diff_out"] == 0.0 and row["max_abs_diff_grad"] == 0.0
    assert row["peak_mem_mb"] > 0


def test_broken_method_becomes_an_error_row(monkeypatch):
    def missing(_options):
        raise ImportError("optimus_eqsat.backend not there")

    monkeypatch.setattr(methods, "eqsat_backend", missing)
    rows = run(BenchConfig(models=["dlrm"], methods=["eager", "optimus_eqsat"], batch=2,
                           warmup=0, repeats=1, progress=False))
    assert [r["method"] for r in rows] == ["eager", "optimus_eqsat"]
    assert rows[0]["error"] == ""
    assert rows[1]["error"].startswith("ImportError")


def test_ablation_variants_label_rows():
    variants = eqsat_variants("splitcat;splitcat,batching", "greedy;ilp", None)
    assert len(variants) == 4
    assert variants[1] == EqsatOptions(("splitcat",), "ilp", None)
    assert variants[3].kwargs() == {"rulesets": ("splitcat", "batching"), "extractor": "ilp"}
    assert variants[3].label() == {"rulesets": "splitcat+batching", "extractor": "ilp", "profile": "default"}
    assert eqsat_variants(None, None, None) == [EqsatOptions()]
    ms = methods.make_methods(["inductor", "optimus_eqsat"], variants)
    assert [m.name for m in ms] == ["inductor"] + ["optimus_eqsat"] * 4
    with pytest.raises(ValueError):
        methods.make_methods(["nope"], variants)


def test_reports_from_synthetic_rows(tmp_path):
    base = dict(scale=1, batch=4, mode="inference", device="cpu", rulesets="default",
                extractor="default", profile="default", error="", pred_kinds="", mem_source="x")
    rows = [
        dict(base, model="m", method="inductor", fx_nodes=100, inductor_launches=10.0,
             inductor_passes_s=0.1, optimizer_s=math.nan, pred_launches=9.0,
             emitted_kinds="extern:addmm=4;generated=6", run_ms=1.0),
        dict(base, model="m", method="optimus_eqsat", rulesets="splitcat", fx_nodes=100,
             inductor_launches=4.0, inductor_passes_s=0.1, optimizer_s=0.5, pred_launches=4.0,
             emitted_kinds="generated=4", run_ms=0.5),
        dict(base, model="m", method="optimus_eqsat", fx_nodes=math.nan, inductor_launches=math.nan,
             inductor_passes_s=math.nan, optimizer_s=math.nan, pred_launches=math.nan,
             emitted_kinds="", run_ms=math.nan, error="ImportError: no backend"),
    ]
    written = write_all(rows, tmp_path)
    assert set(written) == {"csv", "md", "launches", "optimizer_time", "kernel_kinds"}
    md = (tmp_path / "results.md").read_text()
    assert "splitcat/default/default" in md and "ImportError: no backend" in md
