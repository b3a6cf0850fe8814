"""Cold and warm compile of the default backend against Inductor's, each in its own process.

Training jobs restart: the second process's compile (the warm compile) is what most steps
of a job's life pay. Per (model, mode, method) a fresh cache folder serves two processes in
a row: the first compiles cold (empty Inductor cache, empty persistent cache of ours), the
second warm (both caches kept). Each process times its first step (compile, for ours the
optimizer or the cache lookup and the measured choice or its stored decision, and one
forward, plus backward in training) on one thread. Rounds interleave the methods.

    python -m benchmarks.warm_compile --repeats 3 --out benchmarks/results/warm_compile.md

Models: zoo models (``benchmarks.zoo``), library-style models (``tests.library_style``)
and models with nothing to batch (``benchmarks.plain_models``), named ``zoo:mmoe``,
``library:rechub.MMOE``, ``plain:resnet18``.
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
MODES = ("training", "inference")


def build(name: str, batch: int) -> tuple[Any, tuple]:
    """The model and inputs named ``kind:name``."""
    kind, _, model = name.partition(":")
    if kind == "zoo":
        from benchmarks.zoo import MODELS

        spec = MODELS[model]
        return spec.build(), spec.inputs(batch)
    if kind == "library":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.library_style import BUILDERS

        return BUILDERS[model](batch)
    if kind == "plain":
        from benchmarks.plain_models import BUILDERS as PLAIN

        return PLAIN[model](batch)
    raise ValueError(f"unknown model {name!r}: zoo:NAME, library:NAME or plain:NAME")


def _loss(out: Any) -> Any:
    import torch

    if isinstance(out, torch.Tensor):
        return out.float().sum()
    values = out.values() if isinstance(out, dict) else out
    return sum(_loss(v) for v in values)


def child(name: str, method: str, mode: str, batch: int) -> dict[str, Any]:
    """One process's first step (its caches as the caller left them)."""
    import torch

    torch.set_num_threads(1)
    net, inputs = build(name, batch)
    compiled = torch.compile(net.train(mode == "training"), backend=method)
    start = time.perf_counter()
    if mode == "training":
        _loss(compiled(*inputs)).backward()
    else:
        with torch.no_grad():
            compiled(*inputs)
    first_s = time.perf_counter() - start
    reports = []
    if method == "optimus_eqsat":
        from optimus_eqsat.backend import _DEFAULT

        reports = _DEFAULT.reports
    return {"first_s": first_s, "graphs": len(reports), "from_cache": sum(r.from_cache for r in reports)}


def run_pair(name: str, method: str, mode: str, batch: int) -> tuple[float, float]:
    """Cold then warm first step of ``method``, two processes sharing one fresh cache folder."""
    times, cached = [], []
    with tempfile.TemporaryDirectory() as cache:
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": cache,
            "OPTIMUS_EQSAT_CACHE_DIR": os.path.join(cache, "ours"),
            "OPTIMUS_EQSAT_CACHE": "1",
        }
        env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
        for _ in ("cold", "warm"):
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.warm_compile", "--child", name, method, mode, "--batch", str(batch)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            result = json.loads(out.stdout.strip().splitlines()[-1])
            times.append(result["first_s"])
            cached.append(f"{result.get('from_cache', 0)}/{result.get('graphs', 0)}")
    if method == "optimus_eqsat":
        print(f"  graphs read from our cache, cold / warm: {cached[0]} / {cached[1]}", file=sys.stderr)
    return times[0], times[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="zoo:mmoe,library:rechub.MMOE,plain:resnet18")
    parser.add_argument("--modes", default="training,inference")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "METHOD", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help="write the table (with its command) to this file")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.batch)))
        return 0
    cases = [(m, mode) for m in args.models.split(",") for mode in args.modes.split(",")]
    runs: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for k in range(args.repeats):
        for model, mode in cases:
            for method in round_order(list(METHODS), k):
                cold, warm = run_pair(model, method, mode, args.batch)
                runs.setdefault((model, mode, method), []).append((cold, warm))
                print(
                    f"round {k}: {model} {mode} {method}: cold {cold:.1f} s, warm {warm:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
    lines = [
        "| model | mode | Inductor cold s | ours cold s | ours / Inductor cold | Inductor warm s | ours warm s "
        "| ours / Inductor warm |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, mode in cases:
        ind, ours = runs[(model, mode, "inductor")], runs[(model, mode, "optimus_eqsat")]
        cold = [o[0] / i[0] for i, o in zip(ind, ours)]
        warm = [o[1] / i[1] for i, o in zip(ind, ours)]
        lines.append(
            f"| {model} | {mode} | {statistics.median(r[0] for r in ind):.1f} | "
            f"{statistics.median(r[0] for r in ours):.1f} | {spread(cold)} | "
            f"{statistics.median(r[1] for r in ind):.2f} | {statistics.median(r[1] for r in ours):.2f} | "
            f"{spread(warm)} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.out:
        command = " ".join(["python -m benchmarks.warm_compile", *(argv if argv is not None else sys.argv[1:])])
        head = [
            "# Cold and warm compile: the default backend against Inductor",
            "",
            f"Command: `{command}`",
            "",
            f"Batch {args.batch}, one thread, CPU ({os.cpu_count()} cores, shared). First step of a process "
            "(compile and one step); cold: empty caches, warm: a second process on the first's caches "
            "(Inductor's FX graph and AOTAutograd caches; ours: the persistent cache). Ratios paired per "
            "round (median and 10th / 90th percentiles).",
            "",
        ]
        Path(args.out).write_text("\n".join(head) + "\n" + table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
