"""Saturation history and rule statistics as DataFrames and matplotlib figures."""

from __future__ import annotations

from collections.abc import Set
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from optimus_eqsat.explore.rules import RuleInfo
    from optimus_eqsat.saturate import SaturationReport


def history_frame(sat: SaturationReport, final_eclasses: int | None = None) -> pd.DataFrame:
    """One row per iteration: e-nodes, seconds, total matches, rules that fired.

    ``eclasses`` is filled where the saturation report records it per
    iteration; otherwise only the last row carries the exported e-graph's count.
    """
    rows = []
    for h in sat.history:
        matches = h.get("matches", {})
        rows.append(
            {
                "iteration": h["iteration"],
                "enodes": h["enodes"],
                "eclasses": h.get("eclasses"),
                "seconds": h["seconds"],
                "matches": sum(matches.values()),
                "rules_fired": sum(1 for v in matches.values() if v),
            }
        )
    frame = pd.DataFrame(rows, columns=["iteration", "enodes", "eclasses", "seconds", "matches", "rules_fired"])
    if final_eclasses is not None and len(frame) and frame["eclasses"].isna().all():
        frame["eclasses"] = frame["eclasses"].astype("object")
        frame.loc[frame.index[-1], "eclasses"] = final_eclasses
    return frame.set_index("iteration")


def matches_frame(sat: SaturationReport) -> pd.DataFrame:
    """Iterations x rules: matches of each rule in each iteration (rules that ever fired)."""
    data = {h["iteration"]: h.get("matches", {}) for h in sat.history}
    frame = pd.DataFrame.from_dict(data, orient="index").fillna(0).astype(int)
    frame = frame.loc[:, frame.sum() > 0] if len(frame.columns) else frame
    frame.index.name = "iteration"
    return frame[sorted(frame.columns, key=lambda r: -frame[r].sum())]


def rules_frame(sat: SaturationReport, catalogue: dict[str, RuleInfo], banned: Set[str] = frozenset()) -> pd.DataFrame:
    """One row per rule: family, matches, seconds, what it builds; sorted by matches."""
    names = set(catalogue) | set(sat.rule_matches) | set(sat.rule_seconds) | set(banned)
    rows = []
    for name in names:
        info = catalogue.get(name)
        rows.append(
            {
                "rule": name,
                "family": info.family if info else "",
                "matches": int(sat.rule_matches.get(name, 0)),
                "seconds": float(sat.rule_seconds.get(name, 0.0)),
                "fired": sat.rule_matches.get(name, 0) > 0,
                "builds": ", ".join(sorted(info.builds)) if info else "",
                "merges": info.merges if info else None,
                "banned": name in banned,
            }
        )
    frame = pd.DataFrame(rows, columns=["rule", "family", "matches", "seconds", "fired", "builds", "merges", "banned"])
    return frame.sort_values(["matches", "seconds", "rule"], ascending=[False, False, True]).set_index("rule")


def plot_history(sat: SaturationReport, top: int = 8) -> Figure:
    """E-nodes per iteration (left) and matches per iteration of the ``top`` rules (right)."""
    import matplotlib.pyplot as plt

    hist = history_frame(sat)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.5))
    a.plot(hist.index, hist["enodes"], marker="o")
    a.set(title="e-nodes per iteration", xlabel="iteration", ylabel="e-nodes")
    m = matches_frame(sat)
    if len(m.columns):
        shown = m.iloc[:, :top]
        for rule in shown.columns:
            b.plot(shown.index, shown[rule], marker=".", label=rule)
        if len(m.columns) > top:
            b.plot(m.index, m.iloc[:, top:].sum(axis=1), linestyle="--", label=f"{len(m.columns) - top} others")
        b.legend(fontsize=7, loc="upper right")
    b.set(title="matches per iteration", xlabel="iteration", ylabel="matches", yscale="symlog")
    fig.tight_layout()
    plt.close(fig)
    return fig


def plot_rules(rules: pd.DataFrame, top: int = 20) -> Figure:
    """Horizontal bars: matches and seconds of the ``top`` rules by matches."""
    import matplotlib.pyplot as plt

    shown = rules[rules["matches"] > 0].head(top).iloc[::-1]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 0.3 * max(len(shown), 4) + 1), sharey=True)
    a.barh(shown.index, shown["matches"])
    a.set(title="matches per rule", xscale="symlog")
    b.barh(shown.index, shown["seconds"] * 1e3, color="tab:orange")
    b.set(title="search+apply time per rule (ms)")
    a.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    plt.close(fig)
    return fig
