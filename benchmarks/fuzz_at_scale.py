"""The differential fuzzer at scale: thousands of random graphs through ``optimize_graph``.

Each graph comes from the test suite's generator (tests/graphgen/) in one of the
fuzzer's flavours (tests/test_fuzz.py ``FLAVOURS``: plain, ShapeProp meta only,
opaque ops, in-place mutation, weights as inputs, Dynamo graphs, a dynamic batch
checked again at a larger batch, bf16 and fp16, gated linear units, and training graphs
with batch norms, dropouts, checkpointed experts and no-grad / autocast regions), shares as in the unit
test. Every graph is optimized with errors raised (not fallen back from) and compared with
eager as the unit test compares: outputs (values, contiguous layout, ``requires_grad``),
gradients of float inputs and of parameters, buffers after the step.

The optimizer runs with ``never_worse=False`` (as in the unit test), so the program it
builds is checked even where the cost model predicts it slower and the default would
hand back the original (``predicted_slower`` counts those). Each case ends in one of:
``changed`` / ``unchanged`` (checked, equal to eager), ``fallback`` (the optimizer
returned the original and said why), ``mismatch`` (a value or gradient differs: a wrong program), ``crash`` (an
exception out of the optimizer). The generator's own failures are counted apart.

    python -m benchmarks.fuzz_at_scale --graphs 10000 --out benchmarks/results/fuzz
    python -m benchmarks.fuzz_at_scale --graphs 10000 --shard 1/2 ...   # and 2/2, then --merge
    python -m benchmarks.fuzz_at_scale --compiled --graphs 300 --out benchmarks/results/fuzz_compiled

``--compiled`` compiles each graph with ``torch.compile`` and our backend instead
(tests/test_fuzz_compiled.py: Inductor's generated code of our programs, against eager); a
mismatch is compiled again with Inductor alone, and counted ``inductor_mismatch`` where
Inductor's own program fails the same check. A Dynamo flavour's case compiles the eager
program its graph was captured from (a captured graph cannot be traced again).

Writes one JSON line per case (``cases-K-of-N.jsonl``, resumable: cases already in the
file are skipped) and ``summary.md`` (per flavour: outcomes, seconds per graph, FX nodes
before and after, fallback reasons, failing cases with the line that reproduces them).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import torch  # noqa: E402

from optimus_eqsat import optimize_graph  # noqa: E402
from optimus_eqsat.run_support import single_thread  # noqa: E402
from tests.test_fuzz import (  # noqa: E402  (the fuzzer's own harness)
    FLAVOURS,
    _fuzz_options,
    _n_ops,
    check_dynamic_batch,
    check_optimizer,
    make_case,
)
from tests.test_fuzz_compiled import backend_for_fuzzing, check_compiled, compiled_options  # noqa: E402

OUTCOMES = ("changed", "unchanged", "fallback", "mismatch", "crash", "generator_error")
COMPILED_OUTCOMES = ("changed", "unchanged", "fallback", "mismatch", "inductor_mismatch", "crash", "generator_error")


def plan(n_graphs: int, compiled: bool = False) -> list[tuple[str, int]]:
    """(flavour, seed) for n_graphs cases, flavours in the unit test's shares. ``compiled``:
    without the cases whose compiled program another flavour's case already is (``meta`` is
    ``plain`` compiled, a Dynamo flavour the program it captures)."""
    total = sum(share for _, share, _ in FLAVOURS.values())
    cases, programs = [], set()
    for name, (_, share, _) in FLAVOURS.items():
        for seed in range(max(1, round(n_graphs * share / total))):
            options, dynamic = compiled_options(name)
            program = (tuple(sorted(options.items(), key=str)), dynamic, seed)
            if not (compiled and program in programs):
                cases.append((name, seed))
            programs.add(program)
    return cases


def _new_case(flavour: str, seed: int) -> tuple[dict[str, Any], Any]:
    """The case's first columns and its generated graph (None where the generator failed)."""
    row: dict[str, Any] = {"flavour": flavour, "seed": seed, "n_ops": _n_ops(seed)}
    try:
        g = make_case(flavour, seed)
    except Exception as exc:
        return row | {"outcome": "generator_error", "error": f"{type(exc).__name__}: {exc}"[:300]}, None
    return row | {"fx_nodes": len(g.gm.graph.nodes)}, g


def _failure(outcome: str, start: float, exc: BaseException, whole: bool = False) -> dict[str, Any]:
    """The columns of a failed case: the outcome, seconds, the error (its traceback if ``whole``)."""
    error = "".join(traceback.format_exception(exc))[-1500:] if whole else "".join(traceback.format_exception_only(exc))
    return {"outcome": outcome, "seconds": time.perf_counter() - start, "error": error[: 1500 if whole else 600]}


def run_case(flavour: str, seed: int) -> dict[str, Any]:
    """One generated graph through the optimizer and the eager comparison."""
    row, g = _new_case(flavour, seed)
    if g is None:
        return row
    row["low_precision_kept_fp32"] = "eager lacks a kernel" in g.description
    start = time.perf_counter()
    try:
        # (dropouts of p > 0 compare equal only where the optimizer keeps eager's random stream)
        with torch._inductor.config.patch(fallback_random=FLAVOURS[flavour][0].get("dropout_p", 0.0) > 0):
            result = check_optimizer(optimize_graph, g, FLAVOURS[flavour][2], **_fuzz_options())
        if FLAVOURS[flavour][0].get("dynamic_batch"):
            row["second_batch_checked"] = check_dynamic_batch(g, result)
    except AssertionError as exc:
        return row | _failure("mismatch", start, exc)
    except Exception as exc:
        return row | _failure("crash", start, exc, whole=True)
    report = result.meta["optimus_eqsat"]
    row["seconds"] = time.perf_counter() - start
    row["fx_nodes_after"] = len(result.graph.nodes)
    row["launches"] = [report.launches_before, report.launches_after]
    # (no prediction where the optimizer declined the graph before pricing it: a dynamic size pinned)
    row["predicted_slower"] = None not in (
        report.cost_before,
        report.cost_after,
    ) and report.cost_after > report.cost_before * (1 + 1e-9)
    if report.fell_back:
        row |= {"outcome": "fallback", "reason": (report.fallback_reason or "")[:200]}
    else:
        row["outcome"] = "changed" if report.changed else "unchanged"
    return row


def run_compiled_case(flavour: str, seed: int) -> dict[str, Any]:
    """One generated graph compiled with our backend against eager; a mismatch compiled again
    with Inductor alone, to tell Inductor's own errors from ours."""
    row, g = _new_case(flavour, seed)
    if g is None:
        return row
    torch._dynamo.reset()  # (each case's compiles alone: no cache of an earlier case's graphs)
    backend = backend_for_fuzzing()
    start = time.perf_counter()
    try:
        check_compiled(flavour, seed, backend)
    except AssertionError as exc:
        torch._dynamo.reset()
        try:
            check_compiled(flavour, seed, "inductor")
        except AssertionError:
            return row | _failure("inductor_mismatch", start, exc)
        return row | _failure("mismatch", start, exc)
    except Exception as exc:
        return row | _failure("crash", start, exc, whole=True)
    row["seconds"] = time.perf_counter() - start
    row["graphs"] = len(backend.reports)
    # (the post-grad pass's reports say which aten graphs it left alone, no fallback of a program)
    post_grad = [report for _, report in backend.post_grad_reports]
    fell_back = [r.fallback_reason or "" for r in backend.reports if r.fell_back]
    if fell_back:
        return row | {"outcome": "fallback", "reason": fell_back[0][:200]}
    return row | {"outcome": "changed" if any(r.changed for r in backend.reports + post_grad) else "unchanged"}


def _reason_key(reason: str) -> str:
    return reason.split("(")[0].split(":")[0].strip()[:80] or "?"


def summarize(rows: list[dict[str, Any]], command: str, out: Path | None = None, compiled: bool = False) -> str:
    """The summary table (markdown); ``compiled``: of ``--compiled`` cases."""
    outcomes = COMPILED_OUTCOMES if compiled else OUTCOMES
    by_flavour: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_flavour[r["flavour"]].append(r)
    lines = [
        f"# Differential fuzzing at scale: {len(rows)} graphs",
        "",
        f"Command: `{command}`",
        "",
        (
            'Each graph compiled with `torch.compile` and our backend (`measure=False, profile="h200", '
            "raise_on_error=True, never_worse=False`) and compared with eager (outputs, gradients of float inputs "
            "and parameters, buffers after the step; a value further from float64 than twice eager's error is a "
            "mismatch, and one Inductor alone also gets wrong is Inductor's). Seconds: both compiles and the runs."
            if compiled
            else "Each graph optimized with `raise_on_error=True, never_worse=False` and compared with eager "
            "(outputs, gradients of float inputs and parameters; low precision against float64 arbitration)."
        ),
        "",
        "| flavour | graphs | "
        + " | ".join(outcomes)
        + " | s/graph (median) | s/graph (max) | FX nodes (median before -> after) |",
        "|---" * (len(outcomes) + 5) + "|",
    ]
    for flavour, rs in list(by_flavour.items()) + [("all", rows)]:
        counts = Counter(r["outcome"] for r in rs)
        secs = [r["seconds"] for r in rs if "seconds" in r] or [0.0]
        before = [r["fx_nodes"] for r in rs if "fx_nodes_after" in r] or [0]
        after = [r["fx_nodes_after"] for r in rs if "fx_nodes_after" in r] or [0]
        # (a compiled case's program is Inductor's: no FX program after to count)
        nodes = (
            f"{statistics.median([r.get('fx_nodes', 0) for r in rs]):.0f} -> -"
            if compiled
            else f"{statistics.median(before):.0f} -> {statistics.median(after):.0f}"
        )
        lines.append(
            f"| {flavour} | {len(rs)} | "
            + " | ".join(str(counts.get(o, 0)) for o in outcomes)
            + f" | {statistics.median(secs):.2f} | {max(secs):.1f} | {nodes} |"
        )
    if not compiled:
        slower = sum(bool(r.get("predicted_slower")) for r in rows)
        lines += [
            "",
            f"Predicted slower than the original (checked all the same; `never_worse`, on by default, "
            f"would have returned the original): {slower} of {len(rows)}.",
        ]
    dyn = [r for r in rows if "second_batch_checked" in r]
    if dyn:
        lines += [
            "",
            f"Dynamic batch: {sum(r['second_batch_checked'] for r in dyn)} of {len(dyn)} graphs also "
            "checked at a batch 3 larger (the others specialize their batch, or eager refuses the new size).",
        ]
    low = [r for r in rows if r["flavour"] in ("bf16", "fp16")]
    if low:
        lines += [
            f"Low precision: {sum(not r.get('low_precision_kept_fp32') for r in low)} of {len(low)} graphs ran "
            "in their dtype (the others hold an op eager lacks in it and stayed float32)."
        ]
    reasons = Counter(_reason_key(r.get("reason", "")) for r in rows if r["outcome"] == "fallback")
    if reasons:
        lines += ["", "Fallback reasons:", ""] + [f"- {n} x {k}" for k, n in reasons.most_common()]
    first = _read([out / "first_pass_failures.jsonl"]) if out is not None else []
    if first:
        lines += [
            "",
            "First pass: these cases failed and were run again after the fixes they led to "
            "(their rows above are the second run; "
            + (
                "a unit test keeps each, see below"
                if compiled
                else "tests/test_fuzz.py::test_cases_found_at_scale keeps them"
            )
            + "):",
            "",
        ]
        lines += [
            f"- {r['flavour']}-{r['seed']} {r['outcome']}: {r.get('error', '').strip().splitlines()[-1][:200]}"
            for r in first
        ]
    bad = [r for r in rows if r["outcome"] in ("mismatch", "inductor_mismatch", "crash", "generator_error")]
    if bad:
        lines += ["", "Failures (reproduce: `make_case(flavour, seed)` in tests/test_fuzz.py):", ""]
        lines += [
            f"- {r['flavour']}-{r['seed']} {r['outcome']}: {r.get('error', '').splitlines()[-1] if r.get('error') else ''}"
            for r in bad[:50]
        ]
    return "\n".join(lines) + "\n"


def _read(paths: list[Path]) -> list[dict[str, Any]]:
    rows = []
    for p in paths:
        if p.exists():
            rows += [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graphs", type=int, default=10_000)
    ap.add_argument("--shard", default="1/1", help="K/N: run every N-th case from the K-th")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fuzz")
    ap.add_argument("--merge", action="store_true", help="only write summary.md from the shards' files")
    ap.add_argument(
        "--reverse",
        action="store_true",
        help="a helper for a running shard: take its cases from the end (own file), stop where they meet",
    )
    ap.add_argument("--compiled", action="store_true", help="compile each graph with our backend (Inductor's code)")
    ap.add_argument("--flavours", default="", help="comma-separated: only these flavours' cases of the plan")
    args = ap.parse_args(argv)
    logging.getLogger("optimus_eqsat").setLevel(logging.ERROR)
    args.out.mkdir(parents=True, exist_ok=True)
    k, n = (int(v) for v in args.shard.split("/"))
    command = f"python -m benchmarks.fuzz_at_scale{' --compiled' if args.compiled else ''} --graphs {args.graphs}"
    command += f" --flavours {args.flavours}" if args.flavours else ""
    command += f" (shards 1/{n}..{n}/{n})" if n > 1 else ""
    if not args.merge:
        forward = args.out / f"cases-{k}-of-{n}.jsonl"
        path = args.out / f"cases-{k}-of-{n}-reverse.jsonl" if args.reverse else forward
        done = {
            (r["flavour"], r["seed"]) for r in _read([forward, forward.with_name(f"cases-{k}-of-{n}-reverse.jsonl")])
        }
        chosen = [c for c in plan(args.graphs, args.compiled) if not args.flavours or c[0] in args.flavours.split(",")]
        todo = [c for i, c in enumerate(chosen) if i % n == k - 1 and c not in done]
        if args.reverse:
            todo.reverse()
        with single_thread(), path.open("a") as f:
            for i, (flavour, seed) in enumerate(todo):
                if args.reverse and (flavour, seed) in {(r["flavour"], r["seed"]) for r in _read([forward])}:
                    break  # met the shard it helps
                f.write(json.dumps((run_compiled_case if args.compiled else run_case)(flavour, seed)) + "\n")
                f.flush()
                if i % (10 if args.compiled else 100) == 0:
                    print(f"{time.strftime('%H:%M:%S')} {i}/{len(todo)}", flush=True)
    rows = list({(r["flavour"], r["seed"]): r for r in _read(sorted(args.out.glob("cases-*-of-*.jsonl")))}.values())
    summary = summarize(rows, command, args.out, compiled=args.compiled)
    (args.out / "summary.md").write_text(summary)
    print(summary)


if __name__ == "__main__":
    main()
