"""Optimizer time per phase on synthetic split/cat chains of 1,000 / 10,000 / 100,000 nodes.

    python benchmarks/bench_pipeline.py [--sizes 1000,10000,100000] [--extractor greedy]

Prints a Markdown table and the fitted growth exponent of total time vs size
(1.0 = linear). Target (issue 2): 10,000 nodes under 5 s, exponent <= ~1.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.synthetic import split_cat_chain  # noqa: E402
from optimus_eqsat import optimize_graph  # noqa: E402

PHASES = ("translate", "load", "saturate", "export", "extract", "rebuild", "verify")


def fitted_exponent(sizes: list[int], seconds: list[float]) -> float:
    """Least-squares slope of log(time) against log(size)."""
    xs, ys = [math.log(s) for s in sizes], [math.log(max(t, 1e-9)) for t in seconds]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--extractor", default="greedy")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    print("| FX nodes | " + " | ".join(PHASES) + " | total s | launches before -> after | stop |")
    print("|---|" + "---|" * (len(PHASES) + 3))
    totals = []
    for size in sizes:
        gm, inputs = split_cat_chain(size)
        start = time.perf_counter()
        out = optimize_graph(gm, raise_on_error=True, extractor=args.extractor)
        total = time.perf_counter() - start
        r = out.meta["optimus_eqsat"]
        totals.append(total)
        phases = " | ".join(f"{r.phase_seconds.get(p, 0):.2f}" for p in PHASES)
        print(f"| {len(gm.graph.nodes)} | {phases} | {total:.2f} | {r.launches_before} -> {r.launches_after} | {r.stop_reason} |",
              flush=True)
    if len(sizes) > 1:
        print(f"\nfitted growth exponent (total time vs nodes): {fitted_exponent(sizes, totals):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
