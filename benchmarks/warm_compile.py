"""Cold and warm compile of the default backend against Inductor's, each in its own process.

Training jobs restart: the second process's compile (the warm compile) is what most steps
of a job's life pay. Per (model, mode, method) a fresh cache folder serves two processes in
a row: the first compiles cold (empty Inductor cache, empty persistent cache of ours), the
second warm (both caches kept). Each process times its first step from ``torch.compile`` on
(the backend's imports, the compile, for ours the optimizer or the cache lookup and the
measured choice or its stored decision, and one forward, plus backward in training) on one
thread. Rounds interleave the methods. The package is byte-compiled first, as installing it
from a wheel does (an editable install under ``PYTHONDONTWRITEBYTECODE`` would compile its
sources on every import, 0.12 s more per process on the CPU machine, which torch's own
installed modules never pay).

    python -m benchmarks.warm_compile --repeats 3 --out benchmarks/results/warm_compile.md

Models: zoo models (``benchmarks.zoo``), library-style models (``tests.library_style``)
and models with nothing to batch (``benchmarks.plain_models``), named ``zoo:mmoe``,
``library:rechub.MMOE``, ``plain:resnet18``.
"""

from __future__ import annotations

import argparse
import compileall
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
    import torch._dynamo  # (Dynamo itself, which every backend needs, is imported untimed)

    # From torch.compile on: it imports the backend (Inductor's modules for Inductor; our
    # package for ours, whose first call imports Inductor's), which every process pays.
    start = time.perf_counter()
    compiled = torch.compile(net.train(mode == "training"), backend=method)
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


def _child_time(name: str, method: str, mode: str, batch: int, cache: str) -> tuple[float, str]:
    """One child process's first step on the cache folder ``cache``, and how many of its graphs
    our persistent cache served."""
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, method),
        "OPTIMUS_EQSAT_CACHE_DIR": os.path.join(cache, method, "ours"),
        "OPTIMUS_EQSAT_CACHE": "1",
    }
    env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.warm_compile", "--child", name, method, mode, "--batch", str(batch)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["first_s"], f"{result.get('from_cache', 0)}/{result.get('graphs', 0)}"


def byte_compile_package() -> None:
    """Write this package's bytecode where imports find it, as a wheel's install does (its
    rewrites/ and extract/ too: links in a checkout, which ``compile_dir`` does not follow)."""
    from optimus_eqsat.disk_cache import source_roots

    for folder in source_roots():
        compileall.compile_dir(folder, quiet=1)


def run_round(name: str, mode: str, batch: int, k: int, warm_repeats: int) -> dict[str, tuple[float, list[float]]]:
    """Per method, a cold process on a fresh cache folder, then ``warm_repeats`` warm processes
    on it, the methods alternating (round ``k`` sets who goes first)."""
    times: dict[str, tuple[float, list[float]]] = {}
    with tempfile.TemporaryDirectory() as cache:
        for method in round_order(list(METHODS), k):
            cold, cached = _child_time(name, method, mode, batch, cache)
            times[method] = (cold, [])
            print(f"round {k}: {name} {mode} {method}: cold {cold:.1f} s ({cached} from our cache)", file=sys.stderr)
        for j in range(warm_repeats):
            for method in round_order(list(METHODS), k + j):
                warm, cached = _child_time(name, method, mode, batch, cache)
                times[method][1].append(warm)
                print(f"  warm {method}: {warm:.2f} s ({cached} from our cache)", file=sys.stderr, flush=True)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="zoo:mmoe,library:rechub.MMOE,plain:resnet18")
    parser.add_argument("--modes", default="training,inference")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="cold rounds (a fresh cache folder each)")
    parser.add_argument("--warm-repeats", type=int, default=5, help="warm processes per method and cold round")
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "METHOD", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help="write the table (with its command) to this file")
    args = parser.parse_args(argv)
    if args.child:
        model, method, mode = args.child
        print(json.dumps(child(model, method, mode, args.batch)))
        return 0
    byte_compile_package()
    cases = [(m, mode) for m in args.models.split(",") for mode in args.modes.split(",")]
    cold: dict[tuple[str, str], list[float]] = {}  # per case, ours / Inductor per round
    warm: dict[tuple[str, str], list[float]] = {}  # per case, ours / Inductor per warm pair
    seconds: dict[tuple[str, str], dict[tuple[str, str], list[float]]] = {}  # case -> (method, "cold"/"warm")
    for k in range(args.repeats):
        for model, mode in cases:
            times = run_round(model, mode, args.batch, k, args.warm_repeats)
            (ind_cold, ind_warm), (our_cold, our_warm) = times["inductor"], times["optimus_eqsat"]
            cold.setdefault((model, mode), []).append(our_cold / ind_cold)
            warm.setdefault((model, mode), []).extend(o / i for o, i in zip(our_warm, ind_warm))
            case = seconds.setdefault((model, mode), {})
            for method, (c, w) in times.items():
                case.setdefault((method, "cold"), []).append(c)
                case.setdefault((method, "warm"), []).extend(w)
    lines = [
        "| model | mode | Inductor cold s | ours cold s | ours / Inductor cold | Inductor warm s | ours warm s "
        "| ours / Inductor warm |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, mode in cases:
        median = {key: statistics.median(v) for key, v in seconds[(model, mode)].items()}
        lines.append(
            f"| {model} | {mode} | {median[('inductor', 'cold')]:.1f} | {median[('optimus_eqsat', 'cold')]:.1f} | "
            f"{spread(cold[(model, mode)])} | {median[('inductor', 'warm')]:.2f} | "
            f"{median[('optimus_eqsat', 'warm')]:.2f} | {spread(warm[(model, mode)])} |"
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
            "(Inductor's FX graph and AOTAutograd caches; ours: the persistent cache), the methods "
            "alternating. Each process times its first step from `torch.compile` on (the backend's "
            "imports count, from bytecode as a wheel's install leaves them; Dynamo's are made before). "
            "Ratios paired per round, cold, and per pair of warm processes (median and 10th / 90th "
            "percentiles).",
            "",
        ]
        Path(args.out).write_text("\n".join(head) + "\n" + table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
