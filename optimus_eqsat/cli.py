"""Command line: ``optimus-eqsat [demo|bench] ...``."""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``optimus-eqsat`` command."""
    parser = argparse.ArgumentParser(prog="optimus-eqsat", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    demo = sub.add_parser("demo", help="optimize the built-in default model and report (default command)")
    demo.add_argument("--profile", default="h100", help="cost-model device profile (h100, h200, a100, cpu)")
    demo.add_argument("--extractor", default="auto", choices=["auto", "greedy", "ilp"])
    demo.add_argument("--features", type=int, default=8, help="feature towers in the demo model")
    demo.add_argument("-v", "--verbose", action="store_true")
    sub.add_parser("bench", help="run the benchmark harness (from a repository checkout)", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        try:
            from benchmarks.__main__ import main as bench_main
        except ImportError:
            print("optimus-eqsat bench runs from a repository checkout: python -m benchmarks --help", file=sys.stderr)
            return 2
        return bench_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command is None:
        args = parser.parse_args(["demo", *(argv or [])])
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    from .demo import run_demo

    return run_demo(profile=args.profile, extractor=args.extractor, features=args.features)


if __name__ == "__main__":
    sys.exit(main())
