"""Compile time and step time on models with nothing to batch (ResNet-18, BERT), in training.

Users turn the backend on for every model; where the optimizer finds nothing worth a
different program it must cost what Inductor costs. Each (model, method) run is its own
process with a fresh, empty Inductor cache directory and Inductor's caches off (a cold
compile); runs are interleaved over ``--repeats`` rounds. Per run: the first training
step (compile, for ours the optimizer and any measured choice, forward and backward) and
the median of ``--steps`` further steps, one thread.

    python -m benchmarks.nothing_to_batch --repeats 3 --out benchmarks/results/nothing_to_batch.md

Models: :mod:`benchmarks.plain_models` (torchvision's ResNet-18 layout on 64x64 images,
a 4-layer BERT encoder on 64 tokens), batch ``--batch``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.rounds import round_order
from benchmarks.stats import spread

METHODS = ("inductor", "optimus_eqsat")


def child(model: str, method: str, batch: int, steps: int) -> dict[str, Any]:
    """One cold run in this process (the caller set a fresh cache directory)."""
    import torch

    from benchmarks.plain_models import BUILDERS

    torch.set_num_threads(1)
    net, inputs = BUILDERS[model](batch)
    compiled = torch.compile(net, backend=method)
    start = time.perf_counter()
    compiled(*inputs).sum().backward()
    first_s = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        compiled(*inputs).sum().backward()
        times.append(time.perf_counter() - start)
    return {"first_s": first_s, "step_ms": 1e3 * statistics.median(times)}


def run(model: str, method: str, batch: int, steps: int) -> dict[str, Any]:
    """:func:`child` in a fresh process with an empty Inductor cache directory."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.nothing_to_batch",
                "--child",
                model,
                method,
                "--batch",
                str(batch),
                "--steps",
                str(steps),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,bert")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "METHOD"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help="write the table (with its command) to this file")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.batch, args.steps)))
        return 0
    models = args.models.split(",")
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for k in range(args.repeats):
        for model in models:
            for method in round_order(list(METHODS), k):
                result = run(model, method, args.batch, args.steps)
                runs.setdefault((model, method), []).append(result)
                print(
                    f"round {k}: {model} {method}: first step {result['first_s']:.1f} s, "
                    f"step {result['step_ms']:.1f} ms",
                    file=sys.stderr,
                    flush=True,
                )
    lines = [
        "| model | Inductor first step s | ours first step s | ours / Inductor, first step: median [p10, p90] "
        "| Inductor step ms | ours step ms | ours / Inductor, step: median [p10, p90] |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in models:
        ind, ours = runs[(model, "inductor")], runs[(model, "optimus_eqsat")]
        first = [o["first_s"] / i["first_s"] for i, o in zip(ind, ours)]
        step = [o["step_ms"] / i["step_ms"] for i, o in zip(ind, ours)]
        lines.append(
            f"| {model} | {statistics.median(r['first_s'] for r in ind):.1f} | "
            f"{statistics.median(r['first_s'] for r in ours):.1f} | {spread(first)} | "
            f"{statistics.median(r['step_ms'] for r in ind):.1f} | {statistics.median(r['step_ms'] for r in ours):.1f} | "
            f"{spread(step)} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.out:
        command = " ".join(["python -m benchmarks.nothing_to_batch", *(argv if argv is not None else sys.argv[1:])])
        head = [
            "# Models with nothing to batch: cold compile and step time in training",
            "",
            f"Command: `{command}`",
            "",
            f"Batch {args.batch}, one thread, CPU ({os.cpu_count()} cores, shared); each run its own process with an "
            "empty Inductor cache; ratios paired per round (median and 10th / 90th percentiles).",
            "",
        ]
        Path(args.out).write_text("\n".join(head) + table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
