"""Writing a harness run: results.csv, summary.csv, results.md and the plots
(:mod:`benchmarks.plots`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks.columns import CASE, COLUMNS, parse_kinds, series_label, variant  # noqa: F401  (parse_kinds: re-exported)
from benchmarks.methods import BASELINE
from benchmarks.plots import write_plots

# The Markdown table keeps the columns a reader compares at a glance.
MD_COLUMNS = [
    "model",
    "batch",
    "mode",
    "threads",
    "method",
    "variant",
    "run_ms",
    "run_ms_p10",
    "run_ms_p90",
    "rounds",
    "run_ratio_vs_inductor",
    "run_ratio_p10",
    "run_ratio_p90",
    "stable",
    "peak_mem_mb",
    "peak_mem_ratio_vs_inductor",
    "peak_total_ratio_vs_inductor",
    "compile_s",
    "compile_ratio_vs_inductor",
    "optimizer_s",
    "inductor_launches",
    "launch_ratio_vs_inductor",
    "max_abs_diff_out",
    "max_abs_diff_grad",
    "error",
]
SUMMARY_CASE = ["model", "mode", "batch", "threads"]


def to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    ordered = [c for c in COLUMNS if c in df.columns]
    return df[ordered + [c for c in df.columns if c not in ordered and c != "traceback"]]


def summary_table(df: pd.DataFrame, text: bool = True) -> pd.DataFrame:
    """One row per (model, mode, batch, threads), one column per method: the
    paired step-time ratio to Inductor's default; the baseline's own column,
    ``inductor_ms``, holds its step time in milliseconds as the anchor.

    ``text``: ratio cells read ``median [p10, p90]`` with ``*`` when the spread
    did not reach the target, ``err`` for a failed method; else the median alone.
    """
    if df.empty:
        return pd.DataFrame()
    data = df.assign(series=series_label(df))
    keys = [c for c in SUMMARY_CASE if c in data.columns]
    if "scale" in data.columns and data["scale"].nunique() > 1:
        keys.insert(1, "scale")
    baseline = data["series"] == BASELINE
    cells = data.apply(_summary_cell, axis=1) if text else data["run_ratio_vs_inductor"]
    cells = cells.where(~baseline, data.get("run_ms"))
    table = data.assign(cell=cells).pivot_table(
        index=keys, columns="series", values="cell", aggfunc="first", sort=False, dropna=False
    )
    methods = [m for m in dict.fromkeys(data["series"]) if m in table.columns]
    methods.sort(key=lambda m: m != BASELINE)  # the anchor first
    table = table.reindex(columns=methods).rename(columns={BASELINE: f"{BASELINE}_ms"})
    return table.rename_axis(columns=None).reset_index()


def _summary_cell(row: pd.Series) -> str:
    if row.get("error"):
        return "err"
    ratio = row.get("run_ratio_vs_inductor")
    if ratio is None or (isinstance(ratio, float) and math.isnan(ratio)):
        return ""
    low, high = row.get("run_ratio_p10", math.nan), row.get("run_ratio_p90", math.nan)
    mark = "" if row.get("stable", True) else "*"
    return f"{ratio:.2f} [{low:.2f}, {high:.2f}]{mark}"


def write_markdown(df: pd.DataFrame, path: Path) -> None:
    table = df.assign(variant=variant(df)) if "rulesets" in df.columns else df
    table = table[[c for c in MD_COLUMNS if c in table.columns]]
    mem = ", ".join(sorted(set(df.get("mem_source", pd.Series(dtype=str)).dropna()) - {""}))
    devices = ", ".join(sorted(set(df["device"]))) if "device" in df.columns else "?"
    lines = [
        "# optimus-eqsat benchmark",
        "",
        f"device: {devices}; peak memory: {mem or 'n/a'}.",
        "",
        "Step time: methods timed side by side in interleaved rounds; a method's time in a "
        "round is the median of its steps there; `run_ms` is the median over rounds, "
        "`_p10` / `_p90` the 10th / 90th percentiles over rounds. Ratios to Inductor's "
        "default are taken per round (paired) and summarized the same way. `stable`: the "
        "ratio's (p90 - p10) / median reached the target. Compile times are cold (Inductor "
        "caches disabled). Launches: kernels in Inductor's output code (generated + extern), "
        "forward and backward in training.",
        "",
        "## Step time / Inductor default: median [p10, p90] over rounds (* not stable); "
        "inductor_ms: Inductor's own step time",
        "",
        markdown_table(summary_table(df)),
        "",
        "## All rows",
        "",
        markdown_table(table),
        "",
    ]
    path.write_text("\n".join(lines))


def markdown_table(df: pd.DataFrame) -> str:
    """A GitHub table without the optional ``tabulate`` dependency."""
    if df.empty:
        return "(no rows)"

    def cell(v: Any) -> str:
        if isinstance(v, float):
            if math.isnan(v):
                return ""
            return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.0f}"
        return str(v).replace("|", "\\|")

    head = "| " + " | ".join(str(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def write_all(rows: list[dict[str, Any]], out: Path) -> dict[str, Path]:
    """results.csv, summary.csv, results.md and plots under ``out``; returns what was written."""
    out.mkdir(parents=True, exist_ok=True)
    df = to_frame(rows)
    written = {"csv": out / "results.csv", "summary": out / "summary.csv", "md": out / "results.md"}
    df.to_csv(written["csv"], index=False)
    summary_table(df, text=False).to_csv(written["summary"], index=False)
    write_markdown(df, written["md"])
    for plot in write_plots(df, out):
        written[plot.stem] = plot
    return written
