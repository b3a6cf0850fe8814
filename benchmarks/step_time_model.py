"""How well the step-time model predicts: predicted vs measured step time on the zoo.

For every model, mode and batch, the harness compiles Inductor's default and the
optimizer's program (the backend with its measured choice off, so the optimized
program is what runs), measures both in interleaved rounds, and records the
step time the model predicts for each (``fx_cost.predicted_step_time``; the
backward priced in training). This script tabulates:

- the error of each prediction (predicted / measured);
- rank-correctness: whenever the model predicts the optimized program faster
  than Inductor's, is it measured faster?

    python -m benchmarks.step_time_model --models all --modes inference,training \\
        --batches 32 --threads 1 --out benchmarks/results/step_time_model.md

Targets: every prediction within 15% of the measurement, and rank-correct.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks.harness import BenchConfig, run
from benchmarks.methods import EqsatOptions
from benchmarks.report import markdown_table
from benchmarks.rounds import RoundPlan
from benchmarks.zoo import MODELS

TARGET_ERROR = 0.15
CASE = ["model", "mode", "batch", "threads"]


def tabulate(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One line per (case, method): predicted and measured ms and their ratio, and per case
    whether the predicted order of the two programs is the measured one."""
    df = pd.DataFrame(rows)
    df = df[df["error"].fillna("") == ""].copy()
    df["pred_over_measured"] = df["pred_step_ms"] / df["run_ms"]
    out = []
    for key, case in df.groupby(CASE, sort=False):
        by = {r["method"]: r for _, r in case.iterrows()}
        ind, opt = by.get("inductor"), by.get("optimus_eqsat")
        rank = ""
        if ind is not None and opt is not None:
            predicted_faster = opt["pred_step_ms"] < ind["pred_step_ms"]
            measured_ratio = opt.get("run_ratio_vs_inductor", math.nan)
            rank = "n/a" if not predicted_faster else ("yes" if measured_ratio < 1 else "NO")
        for method, r in by.items():
            out.append(
                {
                    **dict(zip(CASE, key)),
                    "method": method,
                    "pred_ms": r["pred_step_ms"],
                    "measured_ms": r["run_ms"],
                    "pred/measured": r["pred_over_measured"],
                    "measured_ratio_vs_inductor": r.get("run_ratio_vs_inductor", math.nan),
                    "pred_ratio_vs_inductor": (r["pred_step_ms"] / ind["pred_step_ms"])
                    if ind is not None
                    else math.nan,
                    "rank_correct": rank if method == "optimus_eqsat" else "",
                }
            )
    return pd.DataFrame(out)


def summary(table: pd.DataFrame) -> str:
    """Worst error, share within the target, rank-correctness."""
    errors = (table["pred/measured"] - 1).abs()
    within = int((errors <= TARGET_ERROR).sum())
    ranked = table[table["rank_correct"].isin(["yes", "NO"])]
    wrong = int((ranked["rank_correct"] == "NO").sum())
    return (
        f"{within} of {len(table)} predictions within {TARGET_ERROR:.0%} of the measurement "
        f"(worst {errors.max():.0%}, median {errors.median():.0%}); rank: {len(ranked) - wrong} of "
        f"{len(ranked)} cases predicted faster were measured faster"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="all")
    p.add_argument("--modes", default="inference,training")
    p.add_argument("--batches", default="32")
    p.add_argument("--threads", default="1")
    p.add_argument("--max-rounds", type=int, default=30)
    p.add_argument(
        "--clock",
        default="cpu",
        choices=("wall", "cpu"),
        help="cpu (default): this process's CPU time, robust to other jobs with one thread",
    )
    p.add_argument("--out", default="benchmarks/results/step_time_model.md")
    args = p.parse_args(argv)
    models = list(MODELS) if args.models == "all" else args.models.split(",")
    config = BenchConfig(
        models=models,
        methods=["inductor", "optimus_eqsat"],
        modes=args.modes.split(","),
        batches=[int(b) for b in args.batches.split(",")],
        threads=[int(t) for t in args.threads.split(",")],
        eqsat_variants=[EqsatOptions(measure=False)],
        plan=RoundPlan(max_rounds=args.max_rounds),
        progress=False,
        clock=args.clock,
    )
    table = tabulate(run(config))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out.with_suffix(".csv"), index=False)
    text = (
        f"# Step-time model: predicted vs measured\n\n{summary(table)}.\n\nMade by `python -m "
        f"benchmarks.step_time_model {' '.join(argv or sys.argv[1:])}`.\n\n" + markdown_table(table) + "\n"
    )
    out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
