"""Command line: ``optimus-eqsat [demo|bench|calibrate|check-rules|cache] ...``."""

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
    _add_calibrate_parser(sub)
    _add_check_rules_parser(sub)
    cache = sub.add_parser(
        "cache", help="show or --clear the persistent cache of optimized programs and measured decisions"
    )
    cache.add_argument("--clear", action="store_true", help="remove every entry")
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
    if args.command == "calibrate":
        return run_calibrate(args)
    if args.command == "check-rules":
        return run_check_rules(args)
    if args.command == "cache":
        return run_cache(args)
    if args.command is None:
        args = parser.parse_args(["demo", *(argv or [])])
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    from optimus_eqsat.demo import run_demo

    return run_demo(profile=args.profile, extractor=args.extractor, features=args.features)


def run_cache(args: argparse.Namespace) -> int:
    """``optimus-eqsat cache``: where the persistent cache is and how many entries it holds."""
    from optimus_eqsat.disk_cache import cache_enabled, cache_root, clear_cache
    from optimus_eqsat.program_cache import DECISIONS, PROGRAMS

    if args.clear:
        print(f"removed {clear_cache()} entries from {cache_root()}")
        return 0
    state = "on" if cache_enabled() else "off (OPTIMUS_EQSAT_CACHE)"
    print(f"{cache_root()} ({state}): {len(PROGRAMS)} programs, {len(DECISIONS)} measured decisions")
    return 0


def _add_calibrate_parser(sub: argparse._SubParsersAction) -> None:
    cal = sub.add_parser(
        "calibrate",
        help="measure this machine's per-call costs and throughputs through "
        "Inductor and store them as the cost model's device profile",
    )
    cal.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    cal.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    cal.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's current setting)")
    cal.add_argument("--quick", action="store_true", help="a smoke run: fewer programs, rounds and shapes")
    cal.add_argument(
        "--clock",
        default="auto",
        choices=["auto", "wall", "cpu"],
        help="auto: CPU time for one CPU thread, CUDA events on CUDA, else wall time",
    )
    cal.add_argument("--out", default=None, help="write the profile here instead of the user's cache")
    cal.add_argument(
        "--show",
        action="store_true",
        help="measure nothing; print the profile the cost model would use now (user's or shipped)",
    )


def run_calibrate(args: argparse.Namespace) -> int:
    """``optimus-eqsat calibrate``: measure and store, or ``--show`` the profile in use."""
    from optimus_eqsat.calibration import CalibrationError, calibrate, current_profile, load_profile, save_profile

    if args.show:
        profile = current_profile(args.device, args.dtype, args.threads)
        mine = load_profile(args.device, args.dtype, args.threads) is not None
        print(profile.table())
        print(
            "(your calibrated profile)"
            if mine
            else "(shipped default; run `optimus-eqsat calibrate` to measure this machine)"
        )
        return 0
    try:
        profile = calibrate(
            args.device,
            args.dtype,
            threads=args.threads,
            quick=args.quick,
            clock=args.clock,
            progress=lambda line: print(line, file=sys.stderr),
        )
    except CalibrationError as exc:
        print(f"calibration failed: {exc}", file=sys.stderr)
        return 1
    print(profile.table())
    print(f"took {profile.fit['duration_s']} s; stored in {save_profile(profile, args.out)}")
    return 0


def _add_check_rules_parser(sub: argparse._SubParsersAction) -> None:
    chk = sub.add_parser(
        "check-rules", help="test every rule of egglog rule files on random tensors (exit status 1 when one is unsound)"
    )
    chk.add_argument("files", nargs="+", metavar="FILE.egg")
    chk.add_argument("--samples", type=int, default=100, help="valid instances to test per rule (default 100)")
    chk.add_argument("--seed", type=int, default=0)
    chk.add_argument("--time-limit", type=float, default=None, help="seconds per file (default: none)")
    chk.add_argument("--rule", action="append", default=None, metavar="NAME", help="check only this rule (repeatable)")
    chk.add_argument(
        "--no-mixed-dtypes",
        action="store_true",
        help="one dtype per instance (by default some instances mix float dtypes)",
    )


def run_check_rules(args: argparse.Namespace) -> int:
    """``optimus-eqsat check-rules``: a verdict table per file; 1 if a rule is unsound, 2 if a file is unreadable."""
    from optimus_eqsat.rewrites import RuleFileError
    from optimus_eqsat.rule_check import check_rules, verdict_table

    status = 0
    for path in args.files:
        try:
            verdicts = check_rules(
                path,
                samples=args.samples,
                seed=args.seed,
                time_limit_s=args.time_limit,
                mixed_dtypes=not args.no_mixed_dtypes,
                only=args.rule,
            )
        except RuleFileError as exc:
            print(f"check-rules: {exc}", file=sys.stderr)
            status = 2
            continue
        if len(args.files) > 1:
            print(f"== {path}")
        print(verdict_table(verdicts))
        if any(v.unsound for v in verdicts) and status == 0:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
