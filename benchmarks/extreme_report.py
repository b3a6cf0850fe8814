"""Tables of the extreme-graph study (benchmarks/extreme_study.py) and its targets.

``write_study`` writes, under the output folder, ``extreme_study.md`` (the command,
the targets checked, then one table per subject: predicted H200 launches,
Inductor's CPU kernels and measured CPU step time, predicted step time, optimizer
time), ``extreme_study.csv`` (every column) and ``extreme_details.md`` (per row,
the optimizer's reports and the kernels left in our programs).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks.report import markdown_table

# Targets (see benchmarks/README.md, "extreme study"): reductions of predicted h200 launches
# for the uniform generator at this many features, and the optimizer's time per graph.
UNIFORM_AT = 2000
UNIFORM_REDUCTION = {"inf": 1000, "frozen": 1000, "train": 500}
OPTIMIZER_LIMIT_S = 30.0
# How close to the ragged generator's floor (the fewest predicted h200 launches of a program
# in the optimizer's vocabulary, benchmarks/extreme_floor.py; README.md has the argument) ours must come.
RAGGED_SLACK = 1.2

KEY = ["generator", "features"]
TABLES = {
    "Predicted H200 launches (inference, frozen inference, one training step)": KEY
    + [
        "fx_nodes",
        *(f"h200_{v}_{p}" for v in ("inf", "frozen", "train") for p in ("default", "inductor_optimus", "ours", "x")),
    ],
    "The ragged generator's floor (predicted h200 launches of the hand-written programs of "
    "benchmarks/extreme_floor.py: the fewest in the optimizer's vocabulary, and, frozen, of any program)": KEY
    + [
        *(
            k
            for v in ("inf", "frozen", "train")
            for k in (f"h200_{v}_ours", f"floor_{v}", f"floor_{v}_family", f"ours_over_floor_{v}")
        ),
        "floor_any_frozen",
        "ours_over_floor_any_frozen",
    ],
    "Inductor's CPU kernels and measured CPU step time (ms; one thread, process CPU time, "
    "median of interleaved rounds; ratio = ours / default per round, median)": KEY
    + [
        *(f"cpu_{v}_{p}" for v in ("inf", "train") for p in ("default", "ours", "x")),
        *(f"measured_{v}_{p}" for v in ("inf", "train") for p in ("default_ms", "ours_ms", "ratio")),
        "max_abs_diff_inf",
        "max_abs_diff_train",
    ],
    "Predicted step time (us): default, ours optimized for that profile and mode, speed-up": KEY
    + [
        f"pred_{prof}_{v}_{p}"
        for prof, vs in (("h200", ("inf", "frozen", "train")), ("cpu", ("inf", "train")))
        for v in vs
        for p in ("default_us", "ours_us", "x")
    ],
    "Optimizer time (s): optimize_graph wall clock / this process's CPU time, per profile and mode; "
    "Inductor's Optimus pre-grad passes (wall)": KEY
    + [
        *(
            f"opt_{kind}_{prof}_{v}"
            for prof, vs in (("h200", ("inf", "frozen", "train")), ("cpu", ("inf", "train")))
            for v in vs
            for kind in ("s", "cpu_s")
        ),
        "inductor_passes_s",
    ],
}


def command(args: argparse.Namespace) -> str:
    """The command line that makes these tables."""
    text = (
        f"python -m benchmarks.extreme_study --generator {args.generator} --features {args.features} "
        f"--training {args.training} --inductor {args.inductor} --batch {args.batch}"
    )
    if args.no_inductor_optimus:
        text += " --no-inductor-optimus"
    return text + f" --out {args.out}"


def _get(row: dict[str, Any], key: str) -> Any:
    value = row.get(key)
    return "" if value is None else value


def targets(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One line per target that the rows can check: what, measured, goal, met."""
    lines = []
    for row in rows:
        name, n = row["generator"], row["features"]
        if name == "uniform" and n == UNIFORM_AT:
            for variant, goal in UNIFORM_REDUCTION.items():
                if f"h200_{variant}_x" in row:
                    x = row[f"h200_{variant}_x"]
                    lines.append(
                        {
                            "target": f"uniform {n}: {variant} launches reduction >= {goal}x",
                            "value": f"{row[f'h200_{variant}_default']} / {row[f'h200_{variant}_ours']} = {x}x",
                            "met": x >= goal,
                        }
                    )
            for key in (k for k in row if k.startswith("opt_s_h200_")):
                cpu = row[key.replace("opt_s_", "opt_cpu_s_")]
                lines.append(
                    {
                        "target": f"uniform {n}: optimizer ({key[6:]}) < {OPTIMIZER_LIMIT_S:.0f} s",
                        "value": f"{row[key]} s wall, {cpu} s CPU",
                        "met": f"wall {row[key] < OPTIMIZER_LIMIT_S}, CPU {cpu < OPTIMIZER_LIMIT_S}",
                    }
                )
        if name == "ragged":
            for variant in ("inf", "frozen", "train"):
                if f"floor_{variant}" in row:
                    ours, floor = row[f"h200_{variant}_ours"], row[f"floor_{variant}"]
                    lines.append(
                        {
                            "target": f"ragged {n}: {variant} launches <= {RAGGED_SLACK} x floor",
                            "value": f"{ours} / {floor} ({row[f'floor_{variant}_family']}) = "
                            f"{ours / floor:.2f} x floor",
                            "met": ours <= RAGGED_SLACK * floor,
                        }
                    )
    return pd.DataFrame(lines)


def write_study(rows: list[dict[str, Any]], args: argparse.Namespace, out_dir: str | Path) -> None:
    """The study's Markdown tables, CSV and details under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    columns = list(dict.fromkeys(k for row in rows for k in row if k != "details"))
    pd.DataFrame([{c: _get(r, c) for c in columns} for r in rows]).to_csv(out / "extreme_study.csv", index=False)
    parts = [
        f"# Extreme-graph study\n\nCommand: `{command(args)}`\n\n"
        "Default: Dynamo's graph as Inductor compiles it; inductor_optimus: after Inductor's Optimus "
        "pre-grad passes; ours: `optimize_graph` for the profile and mode (frozen: under Inductor's "
        "`freezing=True`; the CPU columns use the program optimized for the cpu profile). `x`: default / "
        "ours. Launch counts are predicted (`fx_cost.predict_kernels`, h200) except the CPU table's, which "
        "Inductor emitted on this CPU. Training: one step, AOTAutograd's forward plus backward graphs "
        "(predicted) or Inductor's forward plus backward code (CPU). Empty cells: not run at that size.\n"
    ]
    checked = targets(rows)
    if not checked.empty:
        parts.append("## Targets\n\n" + markdown_table(checked) + "\n")
    for title, keys in TABLES.items():
        present = [k for k in keys if any(k in r for r in rows)]
        if len(present) > len(KEY):
            table = pd.DataFrame([{k: _get(r, k) for k in present} for r in rows])
            parts.append(f"## {title}\n\n{markdown_table(table)}\n")
    (out / "extreme_study.md").write_text("\n".join(parts))
    details = [f"## {r['generator']}, {r['features']} features\n\n{r.get('details', '')}\n" for r in rows]
    (out / "extreme_details.md").write_text(
        "# Extreme-graph study: the optimizer's reports and the kernels "
        f"left in our programs\n\nCommand: `{command(args)}`\n\n" + "\n".join(details)
    )
