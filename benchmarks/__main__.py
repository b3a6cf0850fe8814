"""CLI: ``python -m benchmarks --models dlrm,mmoe --methods eager,inductor,...``.

Ablations: ``--rulesets``, ``--extractor`` and ``--profile`` take
``;``-separated alternatives (each a value for optimus_eqsat's make_backend);
every combination becomes its own optimus_eqsat method, labelled in the rows.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from .harness import BenchConfig, run
from .methods import METHOD_NAMES, EqsatOptions
from .report import to_frame, write_all
from .zoo import MODELS


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _alternatives(text: str | None) -> list[str | None]:
    """``a;b`` -> ["a", "b"]; absent -> [None] (the backend's default)."""
    return [t.strip() for t in text.split(";")] if text else [None]


def eqsat_variants(rulesets: str | None, extractor: str | None, profile: str | None) -> list[EqsatOptions]:
    """The cross product of the ablation alternatives."""
    return [
        EqsatOptions(tuple(_csv(r)) if r else None, e, p)
        for r, e, p in itertools.product(
            _alternatives(rulesets), _alternatives(extractor), _alternatives(profile)
        )
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="all", help=f"comma list or 'all': {', '.join(MODELS)}")
    p.add_argument("--methods", default="eager,inductor,inductor_optimus,optimus_eqsat",
                   help=f"comma list of {', '.join(METHOD_NAMES)}")
    p.add_argument("--mode", "--modes", dest="modes", default="inference",
                   help="comma list of inference, training")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--scales", default="1", help="comma list of zoo scale knobs, e.g. 1,4,16")
    p.add_argument("--threads", type=int, help="torch CPU threads (1 is steadier on a busy machine)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--rulesets", help="optimus_eqsat rule sets, e.g. 'splitcat;splitcat,algebraic,batching'")
    p.add_argument("--extractor", help="optimus_eqsat extractor(s), e.g. 'greedy;ilp;auto'")
    p.add_argument("--profile", help="optimus_eqsat cost profile(s), e.g. 'h100'")
    p.add_argument("--keep-caches", action="store_true",
                   help="allow Inductor cache hits (faster; compile times no longer honest)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--out", default="benchmarks/results", help="output folder")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = BenchConfig(
        models=list(MODELS) if args.models == "all" else _csv(args.models),
        methods=_csv(args.methods),
        modes=_csv(args.modes),
        scales=[int(s) for s in _csv(args.scales)],
        eqsat_variants=eqsat_variants(args.rulesets, args.extractor, args.profile),
        device=args.device,
        threads=args.threads,
        batch=args.batch,
        seed=args.seed,
        warmup=args.warmup,
        repeats=args.repeats,
        disable_caches=not args.keep_caches,
        progress=not args.no_progress,
    )
    rows = run(config)
    written = write_all(rows, Path(args.out))
    df = to_frame(rows)
    cols = ["model", "mode", "method", "fx_nodes", "inductor_launches", "run_ms", "error"]
    print(df[[c for c in cols if c in df.columns]].to_string(index=False))
    print("wrote: " + ", ".join(str(p) for p in written.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
