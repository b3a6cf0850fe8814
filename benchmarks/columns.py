"""The harness's row vocabulary: column order, method labels, kernel-kind text.

Shared by the harness (which writes rows), the tables and the plots.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

# One case: the conditions every method of a row was compared under.
CASE = ["model", "scale", "rows", "batch", "mode", "threads", "device"]
# Columns in report order; anything else a row carries goes after these.
COLUMNS = [
    *CASE,
    "method",
    "rulesets",
    "extractor",
    "profile",
    "measure",
    # step time: median over rounds of each round's median, 10th/90th percentiles over rounds
    "run_ms",
    "run_ms_p10",
    "run_ms_p90",
    "run_ms_min",
    "rounds",
    "steps_per_round",
    # paired ratio to Inductor's default (per round, then median and percentiles)
    "run_ratio_vs_inductor",
    "run_ratio_p10",
    "run_ratio_p90",
    "stable",
    "timing_stop",
    # peak_mem: allocated during a step above what was allocated before it; peak_total: that
    # plus the model's parameters and buffers (state_mb), which a step holds at its peak too
    "peak_mem_mb",
    "peak_mem_ratio_vs_inductor",
    "mem_source",
    "state_mb",
    "peak_total_mb",
    "peak_total_ratio_vs_inductor",
    "compile_s",
    "compile_ratio_vs_inductor",
    "optimizer_s",
    "inductor_passes_s",
    "inductor_launches",
    "launch_ratio_vs_inductor",
    "inductor_generated",
    "inductor_extern",
    "graphs",
    "fx_nodes",
    "pred_launches_dynamo",
    "pred_launches",
    "pred_step_ms",
    "pred_step_ms_dynamo",
    "recompiles",
    "cudagraph_skips",
    "cuda_graph_launches",
    "max_abs_diff_out",
    "max_abs_diff_grad",
    "emitted_kinds",
    "pred_kinds",
    "pred_profile",
    "eqsat_stop",
    "eqsat_extractor",
    "eqsat_enodes",
    "eqsat_rules_fired",
    "eqsat_launches_before",
    "eqsat_launches_after",
    "eqsat_phase_s",
    "eqsat_guard_s",
    "eqsat_kept",
    "eqsat_fell_back",
    "eqsat_fallback_reason",
    "error",
]


def variant(df: pd.DataFrame) -> pd.Series:
    """The optimus_eqsat ablation label ("" for other methods and the default variant)."""
    labels = df["rulesets"] + "/" + df["extractor"] + "/" + df["profile"]
    if "measure" in df:  # the measured choice, named only when set
        measure = df["measure"].fillna("default")
        labels = labels + ("/measure=" + measure).where(measure != "default", "")
    eqsat = df["method"].str.startswith("optimus_eqsat")
    return labels.where(eqsat, "").replace("default/default/default", "")


def series_label(df: pd.DataFrame) -> pd.Series:
    """Method name, with the ablation variant when there is one (the harness's Method.label)."""
    v = variant(df)
    return df["method"].where(v == "", df["method"] + "[" + v + "]")


def kinds_text(kinds: dict[str, int]) -> str:
    """``kind=count;...`` sorted by kind (a CSV-friendly Counter)."""
    return ";".join(f"{k}={v}" for k, v in sorted(kinds.items()) if v)


def parse_kinds(text: Any) -> dict[str, int]:
    """Inverse of :func:`kinds_text`."""
    if not isinstance(text, str) or not text:
        return {}
    return {k: int(v) for k, v in (item.rsplit("=", 1) for item in text.split(";"))}
