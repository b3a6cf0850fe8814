"""PNG plots of a harness run (matplotlib, headless Agg backend).

- ``step_time_ratio.png``: step time / Inductor default per model, grouped bars by
  method with the 10th-90th percentile of the paired ratio as error bars, one
  panel per (mode, threads) x batch.
- ``peak_mem_ratio.png``: peak memory / Inductor default, the same layout.
- ``launches.png``, ``kernel_kinds.png``: kernel launches per model and method
  (and by kind), for the smallest batch.
- ``optimizer_time.png``: graph optimizer seconds against Dynamo graph size.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from benchmarks.columns import parse_kinds, series_label
from benchmarks.methods import BASELINE


def write_plots(df: pd.DataFrame, out: Path) -> list[Path]:
    """Every plot with data; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")  # headless; before pyplot is imported
    ok = df[df["error"] == ""].assign(series=series_label(df))
    paths = [
        _plot_ratio(
            ok,
            "run_ratio_vs_inductor",
            "step time / Inductor default",
            out / "step_time_ratio.png",
            spread=("run_ratio_p10", "run_ratio_p90"),
        ),
        _plot_ratio(ok, "peak_mem_ratio_vs_inductor", "peak memory / Inductor default", out / "peak_mem_ratio.png"),
        _plot_launches(ok, out / "launches.png"),
        _plot_optimizer_time(ok, out / "optimizer_time.png"),
        _plot_kinds(ok, out / "kernel_kinds.png"),
    ]
    return [p for p in paths if p is not None]


def _plot_ratio(
    df: pd.DataFrame, column: str, ylabel: str, path: Path, spread: tuple[str, str] | None = None
) -> Path | None:
    """Grouped bars of ``column`` per model and method (log scale, 1 = Inductor
    default), one panel per (mode, threads) row and batch column."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import FormatStrFormatter

    if column not in df:
        return None
    data = df[(df["method"] != BASELINE) & df[column].notna()]
    if data.empty:
        return None
    rows = sorted(set(zip(data["mode"], data["threads"])))
    batches = sorted(set(data["batch"]))
    # x positions: models, with the scale when a run has several
    several = data["scale"].nunique() > 1 if "scale" in data else False
    data = data.assign(xlabel=data["model"] + (" s" + data["scale"].astype(str) if several else ""))
    series = list(dict.fromkeys(data["series"]))
    models = list(dict.fromkeys(data["xlabel"]))
    fig, axes = plt.subplots(
        len(rows),
        len(batches),
        squeeze=False,
        sharey=True,
        figsize=(max(5.0, 0.9 * len(models) * len(batches) + 2), 3.2 * len(rows)),
    )
    width = 0.8 / len(series)
    x = np.arange(len(models))
    for (mode, threads), ax_row in zip(rows, axes):
        for batch, ax in zip(batches, ax_row):
            panel = data[(data["mode"] == mode) & (data["threads"] == threads) & (data["batch"] == batch)]
            for i, name in enumerate(series):
                rows_s = panel[panel["series"] == name].groupby("xlabel").first().reindex(models)
                values = rows_s[column].to_numpy(dtype=float)
                yerr = None
                if spread is not None:
                    low, high = (rows_s[c].to_numpy(dtype=float) for c in spread)
                    yerr = np.vstack([values - low, high - values]).clip(min=0)
                # Bars grow from 1 (as fast as Inductor): up when slower, down when faster.
                ax.bar(
                    x + (i - (len(series) - 1) / 2) * width,
                    values - 1.0,
                    width,
                    bottom=1.0,
                    yerr=yerr,
                    capsize=2,
                    label=name,
                )
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
            ax.tick_params(axis="y", which="both", labelsize=7)
            ax.set_xticks(x, models, rotation=30, fontsize=8)
            ax.set_title(f"{mode}, batch {batch}, {threads} thread(s)", fontsize=9)
        ax_row[0].set_ylabel(ylabel, fontsize=8)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _first_conditions(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of the smallest batch and the first thread count: launches hardly
    depend on them, and one bar per model keeps the plot readable."""
    if df.empty:
        return df
    df = df[df["batch"] == df["batch"].min()]
    return df[df["threads"] == df["threads"].iloc[0]]


def _plot_launches(df: pd.DataFrame, path: Path) -> Path | None:
    """Grouped bars: emitted (or predicted) launches per model, one bar per method."""
    import matplotlib.pyplot as plt

    df = _first_conditions(df)
    if df.empty:
        return None
    column = "inductor_launches" if df["inductor_launches"].notna().any() else "pred_launches"
    data = df.assign(case=df["model"] + " s" + df["scale"].astype(str) + " " + df["mode"].str[:5])
    table = data.pivot_table(index="case", columns="series", values=column, aggfunc="first")
    if table.empty:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(table)), 4))
    table.plot.bar(ax=ax, rot=30)
    ax.set_ylabel(f"kernel launches ({column})")
    ax.set_title(f"Kernel launches per model and method (batch {df['batch'].iloc[0]})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plot_optimizer_time(df: pd.DataFrame, path: Path) -> Path | None:
    """Log-log: graph optimizer seconds against Dynamo graph size.

    optimus_eqsat methods plot optimize_graph time; Inductor methods plot the
    time of their pre/post-grad FX passes (where Inductor's Optimus passes run).
    """
    import matplotlib.pyplot as plt

    eqsat = df["method"].str.startswith("optimus_eqsat")
    data = df.assign(seconds=df["optimizer_s"].where(eqsat, df["inductor_passes_s"]))
    data = data.dropna(subset=["seconds", "fx_nodes"])
    data = data[(data["seconds"] > 0) & (data["fx_nodes"] > 0)]
    if data.empty:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for series, group in data.groupby("series"):
        group = group.sort_values("fx_nodes")
        ax.plot(group["fx_nodes"], group["seconds"], "o", label=series)
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


def _plot_kinds(df: pd.DataFrame, path: Path) -> Path | None:
    """Stacked bars: where the remaining launches go, by kernel kind (the cost
    model's prediction when it exposes predict_kernels, else Inductor's code)."""
    import matplotlib.pyplot as plt

    df = _first_conditions(df)
    if df.empty:
        return None
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
