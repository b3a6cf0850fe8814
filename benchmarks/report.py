"""Writing a harness run: results.csv, results.md and PNG plots (matplotlib Agg)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

# Columns in report order; anything else a row carries goes after these.
COLUMNS = [
    "model", "scale", "batch", "mode", "method", "rulesets", "extractor", "profile", "device",
    "threads", "graphs", "fx_nodes", "pred_launches_dynamo", "pred_launches", "inductor_generated",
    "inductor_extern", "inductor_launches", "launch_ratio_vs_inductor", "optimizer_s",
    "inductor_passes_s", "compile_s", "run_ms", "run_ms_min", "run_ratio_vs_inductor", "peak_mem_mb",
    "mem_source", "max_abs_diff_out", "max_abs_diff_grad", "emitted_kinds", "pred_kinds", "pred_profile",
    "eqsat_stop", "eqsat_extractor", "eqsat_enodes", "eqsat_rules_fired", "eqsat_fell_back",
    "eqsat_fallback_reason", "error",
]
# The Markdown table keeps the columns a reader compares at a glance.
MD_COLUMNS = [
    "model", "scale", "mode", "method", "variant", "fx_nodes", "pred_launches",
    "inductor_launches", "launch_ratio_vs_inductor", "optimizer_s", "compile_s", "run_ms",
    "run_ratio_vs_inductor", "peak_mem_mb", "max_abs_diff_out", "max_abs_diff_grad", "error",
]


def to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    ordered = [c for c in COLUMNS if c in df.columns]
    return df[ordered + [c for c in df.columns if c not in ordered and c != "traceback"]]


def variant(df: pd.DataFrame) -> pd.Series:
    """The optimus_eqsat ablation label ("" for other methods)."""
    labels = df["rulesets"] + "/" + df["extractor"] + "/" + df["profile"]
    return labels.where(df["method"] == "optimus_eqsat", "").replace("default/default/default", "")


def series_label(df: pd.DataFrame) -> pd.Series:
    """Method name, with the ablation variant when there is one."""
    v = variant(df)
    return df["method"].where(v == "", df["method"] + "[" + v + "]")


def write_csv(df: pd.DataFrame, path: Path) -> None:
    df.to_csv(path, index=False)


def write_markdown(df: pd.DataFrame, path: Path) -> None:
    table = df.assign(variant=variant(df))
    table = table[[c for c in MD_COLUMNS if c in table.columns]]
    mem = ", ".join(sorted(set(df.get("mem_source", pd.Series(dtype=str)).dropna()) - {""}))
    lines = [
        "# optimus-eqsat benchmark",
        "",
        f"device: {', '.join(sorted(set(df['device'])))}; peak memory: {mem or 'n/a'}; "
        "run_ms: median of repeats after warm-up; launches: kernels in Inductor's "
        "output code (generated + extern), forward and backward in training.",
        "",
        _markdown_table(table),
        "",
    ]
    path.write_text("\n".join(lines))


def _markdown_table(df: pd.DataFrame) -> str:
    """A GitHub table without the optional ``tabulate`` dependency."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            if math.isnan(v):
                return ""
            return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.0f}"
        return str(v).replace("|", "\\|")

    head = "| " + " | ".join(df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def write_plots(df: pd.DataFrame, out: Path) -> list[Path]:
    """launches.png, optimizer_time.png, kernel_kinds.png (those with data)."""
    import matplotlib

    matplotlib.use("Agg")  # headless; before pyplot is imported
    ok = df[df["error"] == ""].assign(series=series_label(df))
    paths = [
        _plot_launches(ok, out / "launches.png"),
        _plot_optimizer_time(ok, out / "optimizer_time.png"),
        _plot_kinds(ok, out / "kernel_kinds.png"),
    ]
    return [p for p in paths if p is not None]


def _plot_launches(df: pd.DataFrame, path: Path) -> Path | None:
    """Grouped bars: emitted (or predicted) launches per model, one bar per method."""
    import matplotlib.pyplot as plt

    column = "inductor_launches" if df["inductor_launches"].notna().any() else "pred_launches"
    data = df.assign(case=df["model"] + " s" + df["scale"].astype(str) + " " + df["mode"].str[:5])
    table = data.pivot_table(index="case", columns="series", values=column, aggfunc="first")
    if table.empty:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(table)), 4))
    table.plot.bar(ax=ax, rot=30)
    ax.set_ylabel(f"kernel launches ({column})")
    ax.set_title("Kernel launches per model and method")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plot_optimizer_time(df: pd.DataFrame, path: Path) -> Path | None:
    """Log-log: graph optimizer seconds against Dynamo graph size.

    optimus_eqsat plots optimize_graph time; Inductor methods plot the time of
    their pre/post-grad FX passes (where Inductor's Optimus passes run).
    """
    import matplotlib.pyplot as plt

    seconds = df["optimizer_s"].where(df["method"] == "optimus_eqsat", df["inductor_passes_s"])
    data = df.assign(seconds=seconds).dropna(subset=["seconds", "fx_nodes"])
    data = data[(data["seconds"] > 0) & (data["fx_nodes"] > 0)]
    if data.empty:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for series, group in data.groupby("series"):
        group = group.sort_values("fx_nodes")
        ax.plot(group["fx_nodes"], group["seconds"], "o-", label=series)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FX nodes (Dynamo graph)")
    ax.set_ylabel("optimizer time [s]")
    ax.set_title("Optimizer time vs graph size")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def parse_kinds(text: Any) -> dict[str, int]:
    """Inverse of the harness's ``kind=count;...`` encoding."""
    if not isinstance(text, str) or not text:
        return {}
    return {k: int(v) for k, v in (item.rsplit("=", 1) for item in text.split(";"))}


def _plot_kinds(df: pd.DataFrame, path: Path) -> Path | None:
    """Stacked bars: where the remaining launches go, by kernel kind (the cost
    model's prediction when it exposes predict_kernels, else Inductor's code)."""
    import matplotlib.pyplot as plt

    column = "pred_kinds" if df["pred_kinds"].astype(bool).any() else "emitted_kinds"
    counts = pd.DataFrame(
        [parse_kinds(t) for t in df[column]],
        index=df["model"] + " " + df["mode"].str[:5] + " " + df["series"],
    ).fillna(0)
    if counts.empty or not counts.to_numpy().any():
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(counts)), 4.5))
    counts.plot.bar(stacked=True, ax=ax, rot=75)
    ax.set_ylabel("kernels")
    ax.set_title(f"Launches by kernel kind ({column})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_all(rows: list[dict[str, Any]], out: Path) -> dict[str, Path]:
    """CSV, Markdown and plots under ``out``; returns what was written."""
    out.mkdir(parents=True, exist_ok=True)
    df = to_frame(rows)
    written = {"csv": out / "results.csv", "md": out / "results.md"}
    write_csv(df, written["csv"])
    write_markdown(df, written["md"])
    for plot in write_plots(df, out):
        written[plot.stem] = plot
    return written
