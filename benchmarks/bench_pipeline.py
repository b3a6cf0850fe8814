"""Optimizer time per phase on synthetic graphs of 1,000 / 10,000 / 100,000 FX nodes.

    python -m benchmarks.bench_pipeline [--generator all|NAME,...] [--sizes 1000,10000,100000]
                                        [--extractor greedy] [--time-limit 20]

Generators are ``benchmarks.synthetic.GENERATORS`` (split/cat chains, scalar
chains, residual adds, repeated ops, unary runs, view chains, and each of those
with split/cat round trips); the default is ``split_cat_chain``. Prints one
Markdown row per generator and size (FX nodes, e-nodes, iterations, stop
reason, backoff bans, seconds per phase, optimize_graph's total) and then the
fitted growth exponent per generator (1.0 = linear) of the total time, the
saturation time and the e-nodes. Targets (robustness issue): 10,000 nodes under
5 s, 100,000 under 60 s, exponent about 1, stop reason never ``node_limit``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.synthetic import GENERATORS  # noqa: E402
from optimus_eqsat import optimize_graph  # noqa: E402

PHASES = ("translate", "load", "saturate", "batch", "export", "extract", "rebuild", "verify")


def fitted_exponent(sizes: list[int], values: list[float]) -> float:
    """Least-squares slope of log(value) against log(size)."""
    xs, ys = [math.log(s) for s in sizes], [math.log(max(v, 1e-9)) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def measure(name: str, size: int, extractor: str, time_limit: float | None = None) -> dict:
    """One optimize_graph run of generator ``name`` at ``size`` FX nodes (building the graph not timed)."""
    gm, _ = GENERATORS[name](size)
    start, cpu_start = time.perf_counter(), time.process_time()
    limit = {} if time_limit is None else {"time_limit_s": time_limit}
    out = optimize_graph(gm, raise_on_error=True, extractor=extractor, **limit)
    total, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    r = out.meta["optimus_eqsat"]
    return {
        "generator": name,
        "fx_nodes": len(gm.graph.nodes),
        "enodes": r.enodes,
        "iterations": r.iterations,
        "stop": r.stop_reason,
        "bans": sum(r.backoff_bans.values()),
        "phases": r.phase_seconds,
        "total": total,
        "cpu": cpu,
        "launches": f"{r.launches_before} -> {r.launches_after}" + (" (original kept)" if r.fell_back else ""),
    }


def row(m: dict) -> str:
    phases = " | ".join(f"{m['phases'].get(p, 0):.2f}" for p in PHASES)
    return (
        f"| {m['generator']} | {m['fx_nodes']} | {m['enodes']} | {m['enodes'] / m['fx_nodes']:.1f} | "
        f"{m['iterations']} | {m['stop']} | {m['bans']} | {phases} | {m['total']:.2f} | {m['cpu']:.2f} | {m['launches']} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--generator", default="split_cat_chain", help=f"'all' or a comma list of: {', '.join(GENERATORS)}"
    )
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--extractor", default="greedy")
    parser.add_argument("--time-limit", type=float, help="optimize_graph's time_limit_s (default: its own)")
    parser.add_argument("--out", help="also write the tables (with the command and the machine's load) to this file")
    args = parser.parse_args(argv)
    lines: list[str] = []

    def emit(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    names = list(GENERATORS) if args.generator == "all" else args.generator.split(",")
    unknown = [n for n in names if n not in GENERATORS]
    if unknown:
        parser.error(f"unknown generator(s) {unknown}; known: {', '.join(GENERATORS)}")
    sizes = [int(s) for s in args.sizes.split(",")]
    emit(
        "| generator | FX nodes | e-nodes | e-nodes / FX node | iterations | stop | bans | "
        + " | ".join(PHASES)
        + " | total s | CPU s | launches before -> after |"
    )
    emit("|---|" + "---|" * (len(PHASES) + 10))
    runs: dict[str, list[dict]] = {}
    for name in names:
        for size in sizes:
            m = measure(name, size, args.extractor, args.time_limit)
            runs.setdefault(name, []).append(m)
            emit(row(m))
    if len(sizes) > 1:
        emit("\nFitted growth exponent vs FX nodes (1.0 = linear):\n")
        emit("| generator | total time | CPU time | saturate time | e-nodes |")
        emit("|---|---|---|---|---|")
        for name, ms in runs.items():
            nodes = [m["fx_nodes"] for m in ms]
            emit(
                f"| {name} | {fitted_exponent(nodes, [m['total'] for m in ms]):.2f} | "
                f"{fitted_exponent(nodes, [m['cpu'] for m in ms]):.2f} | "
                f"{fitted_exponent(nodes, [m['phases'].get('saturate', 0) for m in ms]):.2f} | "
                f"{fitted_exponent(nodes, [m['enodes'] for m in ms]):.2f} |"
            )
    if args.out:
        command = f"python -m benchmarks.bench_pipeline --generator {args.generator} --sizes {args.sizes} --extractor {args.extractor}"
        if args.time_limit is not None:
            command += f" --time-limit {args.time_limit:g}"
        head = [
            "# Optimizer time on adversarial graphs",
            "",
            f"Command: `{command}`",
            "",
            f"Load average when it ended: {', '.join(f'{v:.1f}' for v in os.getloadavg())} on {os.cpu_count()} "
            "cores (total s is wall clock, CPU s this process's CPU time: on a loaded machine the wall "
            "clock grows, the CPU time does not).",
            "",
        ]
        Path(args.out).write_text("\n".join(head + lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
