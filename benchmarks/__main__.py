"""CLI: ``python -m benchmarks --models dlrm,mmoe --batches 32,256,2048 --threads 1,all``.

Every model x scale x batch x mode x threads is a case; in each case every
method is compiled (cold caches), checked against eager, and timed side by
side in interleaved rounds until its step-time ratio to Inductor's default is
stable (see benchmarks/README.md, "Method of measurement").

Models: 'all' = the default zoo, 'big' = the variants with 1,000,000-row
embedding tables (dlrm_big, dcnv2_big, deepfm_big, mmoe_big), or names.

Ablations: ``--rulesets``, ``--extractor`` and ``--profile`` take
``;``-separated alternatives (each a value for optimus_eqsat's make_backend);
every combination becomes its own optimus_eqsat method, labelled in the rows.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from benchmarks.harness import ALL_THREADS, BenchConfig, run
from benchmarks.methods import METHOD_NAMES, EqsatOptions, default_methods
from benchmarks.report import summary_table, to_frame, write_all
from benchmarks.rounds import ORDERS, RoundPlan
from benchmarks.zoo import ALL_MODELS, BIG_MODELS, MODELS


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _alternatives(text: str | None) -> list[str | None]:
    """``a;b`` -> ["a", "b"]; absent -> [None] (the backend's default)."""
    return [t.strip() for t in text.split(";")] if text else [None]


def eqsat_variants(
    rulesets: str | None, extractor: str | None, profile: str | None, measure: str | None = None
) -> list[EqsatOptions]:
    """The cross product of the ablation alternatives."""
    return [
        EqsatOptions(tuple(_csv(r)) if r else None, e, p, None if m is None else m == "on")
        for r, e, p, m in itertools.product(
            _alternatives(rulesets), _alternatives(extractor), _alternatives(profile), _alternatives(measure)
        )
    ]


def model_names(text: str) -> list[str]:
    """Model names; 'all' and 'big' expand to the default zoo and the big-table variants."""
    names: list[str] = []
    for token in _csv(text):
        names.extend(MODELS if token == "all" else BIG_MODELS if token == "big" else [token])
    return list(dict.fromkeys(names))


def thread_counts(text: str) -> list[int]:
    """``1,all`` -> [1, torch's default thread count]."""
    return list(dict.fromkeys(ALL_THREADS if t == "all" else int(t) for t in _csv(text)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", default="all", help=f"comma list, 'all' or 'big': {', '.join(ALL_MODELS)}")
    p.add_argument(
        "--methods",
        help=f"comma list of {', '.join(METHOD_NAMES)} "
        "(default: all the device can run; the last three need --device cuda)",
    )
    p.add_argument(
        "--mode",
        "--modes",
        dest="modes",
        default="inference,training",
        help="comma list of inference, training (default both)",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--scales", default="1", help="comma list of zoo scale knobs, e.g. 1,4,16")
    p.add_argument(
        "--batches",
        "--batch",
        dest="batches",
        default="32,256,2048",
        help="comma list of batch sizes (default 32,256,2048)",
    )
    p.add_argument(
        "--threads",
        help="comma list of torch CPU thread counts, 'all' = torch's default "
        f"({ALL_THREADS} here); default '1,all' on CPU, 'all' on CUDA",
    )
    p.add_argument("--rows", type=int, help="rows per embedding table for every model that has tables")
    p.add_argument("--seed", type=int, default=0)
    timing = p.add_argument_group("timing (interleaved rounds)")
    timing.add_argument("--warmup", type=int, default=3, help="steps per method before the first round")
    timing.add_argument(
        "--steps",
        "--repeats",
        dest="steps",
        type=int,
        default=5,
        help="timed steps per method per round; a round's time is their median (--repeats is the old name)",
    )
    timing.add_argument(
        "--min-turn-ms",
        type=float,
        default=20.0,
        help="more timed steps for a fast method, so each of its turns lasts this long",
    )
    timing.add_argument("--rounds", type=int, default=5, help="rounds at least")
    timing.add_argument("--max-rounds", type=int, default=30, help="rounds at most")
    timing.add_argument(
        "--target-spread",
        type=float,
        default=0.10,
        help="stop adding rounds once every ratio's (p90 - p10) / median is below this",
    )
    timing.add_argument(
        "--max-timing-s", type=float, default=120.0, help="start no round after this many seconds of timing in a case"
    )
    timing.add_argument("--round-warmup", type=int, default=1, help="untimed steps at the start of each turn")
    timing.add_argument("--order", default="rotate", choices=ORDERS, help="turn order across rounds")
    timing.add_argument(
        "--clock",
        default="wall",
        choices=("wall", "cpu"),
        help="wall clock, or this process's CPU time (one thread on a shared CPU only)",
    )
    p.add_argument("--rulesets", help="optimus_eqsat rule sets, e.g. 'splitcat;splitcat,algebraic,batching'")
    p.add_argument("--extractor", help="optimus_eqsat extractor(s), e.g. 'greedy;ilp;auto'")
    p.add_argument("--profile", help="optimus_eqsat cost profile(s), e.g. 'h100'")
    p.add_argument(
        "--measure",
        help="optimus_eqsat's measured choice: 'on', 'off' or 'on;off' (default: the "
        "backend's, on); off times the optimized program even where it is slower",
    )
    p.add_argument(
        "--keep-caches", action="store_true", help="allow Inductor cache hits (faster; compile times no longer cold)"
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--out", help="output folder (default benchmarks/results, or benchmarks/results/gpu on CUDA)")
    return p.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    cuda = args.device.startswith("cuda")
    return BenchConfig(
        models=model_names(args.models),
        methods=_csv(args.methods) if args.methods else default_methods(args.device),
        modes=_csv(args.modes),
        scales=[int(s) for s in _csv(args.scales)],
        batches=[int(b) for b in _csv(args.batches)],
        threads=thread_counts(args.threads or ("all" if cuda else "1,all")),
        eqsat_variants=eqsat_variants(args.rulesets, args.extractor, args.profile, args.measure),
        device=args.device,
        rows=args.rows,
        seed=args.seed,
        plan=RoundPlan(
            min_rounds=args.rounds,
            max_rounds=max(args.rounds, args.max_rounds),
            steps=args.steps,
            min_turn_ms=args.min_turn_ms,
            warmup=args.warmup,
            round_warmup=args.round_warmup,
            target_spread=args.target_spread,
            max_seconds=args.max_timing_s,
            order=args.order,
            seed=args.seed,
        ),
        disable_caches=not args.keep_caches,
        progress=not args.no_progress,
        clock=args.clock,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = config_from_args(args)
    # (without --out, a run replaces the study's default table: one current table per study)
    out = Path(
        args.out
        or ("benchmarks/results/gpu" if config.device.startswith("cuda") else "benchmarks/results/step_time/default")
    )
    rows = run(config)
    written = write_all(rows, out)
    print("step time / Inductor default: median [p10, p90] over rounds (* not stable); inductor_ms: its step time")
    print(summary_table(to_frame(rows)).to_string(index=False))
    errors = [
        f"{r['model']}/{r['mode']}/b{r['batch']}/t{r['threads']}/{r['method']}: {r['error']}"
        for r in rows
        if r.get("error")
    ]
    if errors:
        print("errors:\n  " + "\n  ".join(errors))
    print("wrote: " + ", ".join(str(p) for p in written.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
