"""Kernels of one training step (forward plus backward) as Inductor really emits them on CPU.

For each model, the kernels in Inductor's output code (optimus_eqsat/inductor_count.py:
generated C++ kernels plus extern calls, summed over the forward and the backward
module) under five configurations:

- ``inductor``: Inductor's defaults;
- ``inductor_optimus``: Inductor with its own Optimus fusion passes
  (benchmarks/methods.py OPTIMUS_PRE_GRAD and OPTIMUS_POST_GRAD);
- ``ours_pre``: our backend optimizing Dynamo's pre-autograd graph only;
- ``ours_post``: our backend as Inductor's post-grad pass only (forward and backward aten graphs);
- ``ours_both``: both.

Our backend runs with ``measure=False`` (the measurement would compile the original too,
and its kernels would be counted with ours).

    python -m benchmarks.training_kernels [--models mmoe,ple,dynamic_schema] [--profile cpu] \\
        [--batch 8] [--out benchmarks/results/training_kernels.md]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.methods import OPTIMUS_POST_GRAD, OPTIMUS_PRE_GRAD
from benchmarks.zoo import MODELS
from optimus_eqsat.inductor_count import count_inductor_kernels

CONFIGS = ("inductor", "inductor_optimus", "ours_pre", "ours_post", "ours_both")
_OURS = {"ours_pre": (True, False), "ours_post": (False, True), "ours_both": (True, True)}


def count(model_name: str, config: str, profile: str, batch: int) -> tuple[int, float]:
    """(kernels of one training step, seconds the count took) of ``model_name`` under ``config``."""
    spec = MODELS[model_name]
    model, inputs = spec.build(), spec.inputs(batch, 0)
    kwargs: dict[str, Any] = {"training": True}
    if config == "inductor_optimus":
        kwargs["fusion_options"] = {**OPTIMUS_PRE_GRAD, **OPTIMUS_POST_GRAD}
    elif config in _OURS:
        from optimus_eqsat.backend import make_backend

        pre, post = _OURS[config]
        kwargs["backend"] = make_backend(pre_grad=pre, post_grad=post, measure=False, profile=profile)
    start = time.perf_counter()
    result = count_inductor_kernels(model, inputs, **kwargs)
    return result.total, time.perf_counter() - start


def table(rows: list[dict[str, Any]]) -> list[str]:
    columns = ["model", *CONFIGS, "both/inductor", "both/inductor_optimus"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        ratios = [f"{r['ours_both'] / r['inductor']:.2f}", f"{r['ours_both'] / r['inductor_optimus']:.2f}"]
        lines.append("| " + " | ".join([r["model"], *(str(r[c]) for c in CONFIGS), *ratios]) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mmoe,ple,dynamic_schema")
    parser.add_argument("--profile", default="cpu", help="our cost model's device profile")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", default="benchmarks/results/training_kernels.md")
    args = parser.parse_args(argv)
    rows = []
    for name in args.models.split(","):
        row: dict[str, Any] = {"model": name}
        for config in CONFIGS:
            row[config], seconds = count(name, config, args.profile, args.batch)
            print(f"{name} {config}: {row[config]} kernels ({seconds:.0f} s)", flush=True)
        rows.append(row)
    lines = table(rows)
    print("\n".join(lines))
    command = (f"python -m benchmarks.training_kernels --models {args.models} --profile {args.profile} "
               f"--batch {args.batch}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("# Kernels of one training step (Inductor, CPU output code, forward + backward)\n\n"
                   f"Command: `{command}`\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
