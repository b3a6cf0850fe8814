"""Kernels of ``optimize_graph``'s program for a graph traced by ``torch.fx.symbolic_trace`` or
``torch.export`` against the traced graph's, both compiled by Inductor (a training step:
forward plus backward; inference: one forward under ``no_grad``), on the library-style models
that ``symbolic_trace`` can trace (deepctr-style MMOE and PLE: every layer Linear ->
BatchNorm1d -> ReLU(inplace) -> Dropout, dropout 0.1).

Kernels are counted in Inductor's output code (generated kernels plus extern calls,
``optimus_eqsat/inductor_count.py``); the optimizer decides for a GPU profile with its default
``never_worse`` (a program predicted no faster is the original).

    python -m benchmarks.traced_kernels --out benchmarks/results/traced_kernels.md
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.fx import symbolic_trace

from optimus_eqsat import optimize_graph
from optimus_eqsat.inductor_count import count_inductor_kernels

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.library_style import BUILDERS, set_dropout  # noqa: E402


def trace(model: torch.nn.Module, inputs: tuple, capture: str) -> torch.fx.GraphModule:
    """``model``'s graph as ``capture`` ("symbolic_trace" or "export") records it."""
    if capture == "export":
        return torch.export.export(model, inputs).module()
    return symbolic_trace(model)


def _as_function(module: torch.nn.Module) -> Callable[..., Any]:
    return lambda *args: module(*args)


def row(name: str, training: bool, batch: int, profile: str, dropout: float, capture: str) -> dict[str, object]:
    """The traced graph's and our program's kernel counts for one model and mode."""
    model, inputs = BUILDERS[name](batch)
    set_dropout(model, dropout).train(training)
    traced = trace(model, inputs, capture)
    mode = "training" if training else "inference"
    optimized = optimize_graph(copy.deepcopy(traced), inputs, mode=mode, profile=profile)
    report = optimized.meta["optimus_eqsat"]
    if capture == "export":  # (an exported module refuses train(): counted as functions, in their mode)
        traced, optimized = _as_function(traced), _as_function(optimized)
    before = count_inductor_kernels(traced, inputs, training=training)
    after = count_inductor_kernels(optimized, inputs, training=training)
    return {
        "model": name,
        "mode": mode,
        "traced": before.generated + before.extern,
        "ours": after.generated + after.extern,
        "batched": ", ".join(f"{k} x{v}" for k, v in report.batched.items()) or "none",
        "kept": "original" if report.fell_back else "optimized",
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="deepctr.MMOE,deepctr.PLE")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--profile", default="h200")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--captures", default="symbolic_trace,export")
    parser.add_argument("--out", default=None, help="write the table here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    lines = [
        "| graph | model | mode | kernels, traced graph | kernels, ours | ours / traced | program | batched |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for capture in args.captures.split(","):
        for name in args.models.split(","):
            for training in (True, False):
                r = row(name, training, args.batch, args.profile, args.dropout, capture)
                ratio = int(r["ours"]) / int(r["traced"])  # type: ignore[call-overload]
                lines.append(
                    f"| {capture} | {name} | {r['mode']} | {r['traced']} | {r['ours']} | {ratio:.2f} | {r['kept']} "
                    f"| {r['batched']} |"
                )
                print(lines[-1], flush=True)
    if args.out:
        command = "python -m benchmarks.traced_kernels " + " ".join(argv if argv is not None else sys.argv[1:])
        Path(args.out).write_text(
            f"# Kernels of optimized symbolic_trace and torch.export graphs\n\nCommand: `{command}`\n\n"
            + "\n".join(lines)
            + "\n"
        )


if __name__ == "__main__":
    main()
