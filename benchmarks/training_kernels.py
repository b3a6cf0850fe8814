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

``--time``: also the median step time (forward, backward of the sum of the outputs) of
each configuration, compiled once more, in interleaved rounds on this machine
(optimus_eqsat.guard.time_interleaved), and each configuration's ratio to Inductor's.

    python -m benchmarks.training_kernels [--models mmoe,ple,dynamic_schema] [--profile cpu] \\
        [--batch 8] [--time] [--out benchmarks/results/training_kernels.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch._inductor.custom_graph_pass import CustomGraphPass

from benchmarks.methods import OPTIMUS_POST_GRAD, OPTIMUS_PRE_GRAD
from benchmarks.zoo import MODELS
from optimus_eqsat.inductor_count import count_inductor_kernels

CONFIGS = ("inductor", "inductor_optimus", "ours_pre", "ours_post", "ours_both")
_OURS = {"ours_pre": (True, False), "ours_post": (False, True), "ours_both": (True, True)}


class PredictedLaunches(CustomGraphPass):
    """Inductor's last post-grad pass: records the launches our cost model predicts (on
    ``profile``) for each aten graph Inductor compiles, after every other pass (its own
    Optimus passes, our post-grad pass)."""

    def __init__(self, profile: str):
        self.profile = profile
        self.launches: list[int] = []

    def __call__(self, graph: Any) -> None:
        import torch

        from optimus_eqsat.extract.fx_cost import predicted_launches

        module = graph.owning_module or torch.fx.GraphModule(torch.nn.Module(), graph)
        self.launches.append(predicted_launches(module, None, self.profile))

    def uuid(self) -> bytes:
        return f"predicted-launches-{self.profile}".encode()


def count(model_name: str, config: str, profile: str, batch: int, predict: str | None = None) -> tuple[int, float]:
    """(kernels of one training step, seconds the count took) of ``model_name`` under
    ``config``: Inductor's CPU output code, or with ``predict`` (a profile, also our
    optimizer's then) the launches our cost model predicts for that device, forward plus
    backward."""
    spec = MODELS[model_name]
    model, inputs = spec.build(), spec.inputs(batch, 0)
    kwargs: dict[str, Any] = {"training": True}
    recorder = PredictedLaunches(predict) if predict else None
    if recorder is not None:
        # caches off: a cache hit would skip the post-grad passes, the recorder with them
        kwargs["options"] = {"post_grad_custom_post_pass": recorder, "force_disable_caches": True}
        profile = predict
    if config == "inductor_optimus":
        kwargs["fusion_options"] = {**OPTIMUS_PRE_GRAD, **OPTIMUS_POST_GRAD}
    elif config in _OURS:
        from optimus_eqsat.backend import make_backend

        pre, post = _OURS[config]
        kwargs["backend"] = make_backend(pre_grad=pre, post_grad=post, measure=False, profile=profile)
    start = time.perf_counter()
    result = count_inductor_kernels(model, inputs, **kwargs)
    total = sum(recorder.launches) if recorder is not None else result.total
    return total, time.perf_counter() - start


def compiled_step(model_name: str, config: str, profile: str, batch: int) -> Callable[[], None]:
    """One training step of a fresh copy of the model compiled under ``config``."""
    import torch

    spec = MODELS[model_name]
    model, inputs = spec.build().train(), spec.inputs(batch, 0)
    if config == "inductor":
        compiled = torch.compile(model)
    elif config == "inductor_optimus":
        compiled = _patched(
            torch.compile(model),
            {"pre_grad_fusion_options": OPTIMUS_PRE_GRAD, "post_grad_fusion_options": OPTIMUS_POST_GRAD},
        )
    else:
        from optimus_eqsat.backend import make_backend

        pre, post = _OURS[config]
        compiled = torch.compile(
            model, backend=make_backend(pre_grad=pre, post_grad=post, measure=False, profile=profile)
        )
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        out = compiled(*inputs)
        outs = out if isinstance(out, (tuple, list)) else [out]
        torch.autograd.grad(sum(o.float().sum() for o in outs), params)

    return step


def _patched(fn: Callable, config: dict[str, Any]) -> Callable:
    """``fn`` called under Inductor config patches (they must hold while it compiles)."""
    from torch._inductor import config as inductor_config

    def call(*args: Any) -> Any:
        with inductor_config.patch(config):
            return fn(*args)

    return call


def step_times(model_name: str, profile: str, batch: int, budget_s: float) -> dict[str, tuple[float, float]]:
    """Per configuration: (median step seconds, median over rounds of its ratio to Inductor's
    step in the same round), timed in interleaved rounds (the machine's drift hits all alike)."""
    import torch

    from optimus_eqsat.guard import time_interleaved

    torch._dynamo.reset()
    steps = {config: compiled_step(model_name, config, profile, batch) for config in CONFIGS}
    for step in steps.values():
        step()  # compile outside the timing
    rounds = time_interleaved(steps, budget_s=budget_s, min_rounds=10, max_rounds=200)
    torch._dynamo.reset()
    base = rounds["inductor"]
    return {
        config: (statistics.median(times), statistics.median(t / b for t, b in zip(times, base)))
        for config, times in rounds.items()
    }


def table(rows: list[dict[str, Any]]) -> list[str]:
    columns = ["model", *CONFIGS, "both/inductor", "both/inductor_optimus"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        ratios = [f"{r['ours_both'] / r['inductor']:.2f}", f"{r['ours_both'] / r['inductor_optimus']:.2f}"]
        lines.append("| " + " | ".join([r["model"], *(str(r[c]) for c in CONFIGS), *ratios]) + " |")
    return lines


def time_table(rows: list[dict[str, Any]]) -> list[str]:
    """Median step times (ms) and the median per-round ratio to Inductor's."""
    lines = ["| model | " + " | ".join(CONFIGS) + " |", "|" + "---|" * (len(CONFIGS) + 1)]
    for r in rows:
        cells = [f"{r['time'][c][0] * 1e3:.2f} ({r['time'][c][1]:.2f}x)" for c in CONFIGS]
        lines.append("| " + " | ".join([r["model"], *cells]) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mmoe,ple,dynamic_schema")
    parser.add_argument("--profile", default="cpu", help="our cost model's device profile")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--time", action="store_true", help="also time a training step of each configuration")
    parser.add_argument("--budget-s", type=float, default=10.0, help="seconds of interleaved timing per model")
    parser.add_argument(
        "--predict",
        help="a device profile (e.g. h200): count the launches our cost model "
        "predicts for it (our optimizer then prices for it too) instead of Inductor's CPU kernels",
    )
    parser.add_argument("--out", default="benchmarks/results/training_kernels.md")
    args = parser.parse_args(argv)
    rows = []
    for name in args.models.split(","):
        row: dict[str, Any] = {"model": name}
        for config in CONFIGS:
            row[config], seconds = count(name, config, args.profile, args.batch, args.predict)
            print(f"{name} {config}: {row[config]} kernels ({seconds:.0f} s)", flush=True)
        if args.time:
            row["time"] = step_times(name, args.profile, args.batch, args.budget_s)
            print(
                f"{name} step ms: " + ", ".join(f"{c} {t * 1e3:.2f} ({r:.2f}x)" for c, (t, r) in row["time"].items()),
                flush=True,
            )
        rows.append(row)
    lines = table(rows)
    if args.time:
        lines += ["", "Median training-step time, ms (median per-round ratio to inductor):", "", *time_table(rows)]
    print("\n".join(lines))
    command = (
        f"python -m benchmarks.training_kernels --models {args.models} "
        + ("" if args.predict else f"--profile {args.profile} ")
        + f"--batch {args.batch}"
        + (f" --time --budget-s {args.budget_s}" if args.time else "")
        + (f" --predict {args.predict}" if args.predict else "")
        + f" --out {args.out}"
    )
    what = f"launches our cost model predicts on {args.predict}" if args.predict else "Inductor, CPU output code"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        f"# Kernels of one training step ({what}, forward + backward)\n\n"
        f"Command: `{command}`\n\n" + "\n".join(lines) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
