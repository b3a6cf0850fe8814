"""Kernels of ``optimize_graph(torch.fx.symbolic_trace(model))``'s program against the traced
graph's, both compiled by Inductor (a training step: forward plus backward; inference: one
forward under ``no_grad``), on the library-style models that ``symbolic_trace`` can trace
(deepctr-style MMOE and PLE: every layer Linear -> BatchNorm1d -> ReLU -> Dropout, dropout 0.1).

Kernels are counted in Inductor's output code (generated kernels plus extern calls,
``optimus_eqsat/inductor_count.py``); the optimizer decides for a GPU profile with its default
``never_worse`` (a program predicted no faster is the original).

    python -m benchmarks.traced_kernels --out benchmarks/results/traced_kernels.md
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
from torch.fx import symbolic_trace

from optimus_eqsat import optimize_graph
from optimus_eqsat.inductor_count import count_inductor_kernels

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.library_style import BUILDERS, set_dropout  # noqa: E402


def row(name: str, training: bool, batch: int, profile: str, dropout: float) -> dict[str, object]:
    """The traced graph's and our program's kernel counts for one model and mode."""
    model, inputs = BUILDERS[name](batch)
    set_dropout(model, dropout).train(training)
    traced = symbolic_trace(model)
    mode = "training" if training else "inference"
    optimized = optimize_graph(copy.deepcopy(traced), inputs, mode=mode, profile=profile)
    report = optimized.meta["optimus_eqsat"]
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
    parser.add_argument("--out", default=None, help="write the table here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    lines = [
        "| model | mode | kernels, traced graph | kernels, ours | ours / traced | program | batched |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in args.models.split(","):
        for training in (True, False):
            r = row(name, training, args.batch, args.profile, args.dropout)
            ratio = int(r["ours"]) / int(r["traced"])  # type: ignore[call-overload]
            lines.append(
                f"| {name} | {r['mode']} | {r['traced']} | {r['ours']} | {ratio:.2f} | {r['kept']} | {r['batched']} |"
            )
            print(lines[-1], flush=True)
    if args.out:
        command = "python -m benchmarks.traced_kernels " + " ".join(argv if argv is not None else sys.argv[1:])
        Path(args.out).write_text(
            f"# Kernels of optimized symbolic_trace graphs\n\nCommand: `{command}`\n\n" + "\n".join(lines) + "\n"
        )


if __name__ == "__main__":
    main()
