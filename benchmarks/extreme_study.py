"""The extreme-graph study: launches and step time against feature count, ours vs Inductor.

Two generators sized by feature count (benchmarks/zoo/generators.py): ``ragged``,
the dynamic schema (widths 4/8/16, split/cat tangles, a head), and ``uniform``, N
towers of one width (split -> layer norm -> linear -> relu, one cat), the
Optimus paper's case. For each feature count, on Dynamo's graph of the forward
(what Inductor compiles by default, "default") and on what our optimizer makes
of it ("ours"):

- predicted H200 launches (``fx_cost.predict_kernels``, profile h200): inference
  (the forward as the backend runs it: stacks of whole parameters built once by its
  parameter cache, ``optimus_eqsat.parameter_cache``; ours optimized so), frozen
  inference (parameter-only work folded, as Inductor's ``freezing=True`` does; ours
  optimized with freezing on) and training (one
  step: AOTAutograd's forward plus backward graphs, Inductor's partitioner); also
  after Inductor's own Optimus pre-grad passes (``inductor_optimus``);
- the optimizer's time: ``optimize_graph`` per device profile (h200, cpu) and
  mode, wall clock and this process's CPU time (a loaded machine inflates the
  wall clock, not the CPU time);
- predicted step time (``fx_cost.predicted_step_time``) of default and ours on
  h200 and on cpu, inference and training; ours is the program optimized for that
  profile and mode;
- for the feature counts given to ``--inductor``: Inductor's real CPU kernel
  count of default and of ours (the cpu-optimized program; training counts the
  forward plus backward compiled by Inductor) and the measured CPU step time (one
  thread, process CPU time, interleaved rounds, median): benchmarks/extreme_cpu.py.

    python -m benchmarks.extreme_study --generator ragged --features 20,100,500,2000 \\
        --training 20,100,500,2000 --inductor 20,100 --out benchmarks/results/extreme/ragged

Writes ``extreme_study.md`` (tables and the targets), ``extreme_study.csv`` (every
column) and ``extreme_details.md`` (per row: the optimizer's reports and the
kernels left in our programs) to ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks.methods import OPTIMUS_PRE_GRAD
from benchmarks.rounds import RoundPlan
from benchmarks.zoo.generators import GENERATORS
from optimus_eqsat import optimize_graph
from optimus_eqsat.extract.freezing import fold_parameters
from optimus_eqsat.extract.fx_cost import predict_kernels, predicted_step_time
from optimus_eqsat.inductor_count import capture_dynamo_graph
from optimus_eqsat.parameter_cache import packable_nodes

PREDICTED = "h200"  # the profile of the launch columns: the headline device
PROFILES = ("h200", "cpu")  # profiles of the step-time columns
# (mode label, optimize_graph mode, Inductor freezing): the programs we optimize per profile.
MODES = (("inf", "inference", False), ("frozen", "inference", True), ("train", "training", False))


@dataclass(frozen=True)
class StudyOptions:
    """What one row computes besides the always-on predictions.

    ``training``: the training columns (AOTAutograd graphs, training optimizations).
    ``inductor``: compile with Inductor on this CPU (kernel counts; timed when ``plan``).
    ``inductor_optimus``: run Inductor's Optimus pre-grad passes (slow at 2,000 features).
    ``floor``: for the ragged generator, predict its hand-written floor programs too.
    """

    batch: int = 8
    training: bool = True
    inductor: bool = False
    plan: RoundPlan | None = field(default_factory=lambda: RoundPlan(max_rounds=15, max_seconds=60.0))
    inductor_optimus: bool = True
    floor: bool = True  # ragged only: the hand-written floor programs (benchmarks/extreme_floor.py)
    profiles: tuple[str, ...] = PROFILES  # profiles optimized for and priced on
    seed: int = 0

    def __post_init__(self) -> None:
        if PREDICTED not in self.profiles or (self.inductor and "cpu" not in self.profiles):
            raise ValueError(f"profiles need {PREDICTED} (the launch columns) and cpu for an Inductor compile")


@dataclass
class Optimized:
    """One optimize_graph run: the program, its wall and CPU seconds, its report."""

    graph: torch.fx.GraphModule
    wall_s: float
    cpu_s: float

    @property
    def report(self) -> Any:
        return self.graph.meta["optimus_eqsat"]


def optimize(
    gm: torch.fx.GraphModule, example_inputs: list, profile: str, mode: str, frozen: bool = False
) -> Optimized:
    """``optimize_graph`` for ``profile`` and ``mode`` as the backend runs it (inference with
    its parameter cache); ``frozen``: under Inductor's freezing."""
    from torch._inductor import config

    wall, cpu = time.perf_counter(), time.process_time()
    with config.patch(freezing=frozen):
        graph = optimize_graph(gm, example_inputs, profile=profile, mode=mode, cached_parameters=True)
    return Optimized(graph, time.perf_counter() - wall, time.process_time() - cpu)


def inductor_optimus(gm: torch.fx.GraphModule, example_inputs: list) -> tuple[torch.fx.GraphModule, float]:
    """Inductor's pre-grad passes with its Optimus passes switched on, and their seconds."""
    from torch._inductor import config
    from torch._inductor.fx_passes.pre_grad import pre_grad_passes

    graph = copy.deepcopy(gm)
    start = time.perf_counter()
    with config.patch(pre_grad_fusion_options=OPTIMUS_PRE_GRAD, fx_graph_cache=False):
        out = pre_grad_passes(graph, example_inputs)
    return out, time.perf_counter() - start


def training_graphs(gm: torch.fx.GraphModule, example_inputs: list) -> list[torch.fx.GraphModule]:
    """AOTAutograd's forward and backward graphs of one training step (Inductor's
    partitioner), parameters requiring gradients as in training."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    graphs: list[torch.fx.GraphModule] = []

    def capture(g: torch.fx.GraphModule, _inputs: list):
        graphs.append(g)
        return make_boxed_func(g.forward)

    compiled = aot_module_simplified(
        gm, example_inputs, fw_compiler=capture, bw_compiler=capture, partition_fn=min_cut_rematerialization_partition
    )
    out = compiled(*example_inputs)
    sum(o.sum() for o in out if isinstance(o, torch.Tensor) and o.requires_grad).backward()
    return graphs


def kernels(gm: torch.fx.GraphModule, example_inputs: list, variant: str) -> list:
    """Predicted h200 kernels of ``gm`` in one ``variant``: "inf", "frozen" or "train"."""
    if variant == "train":
        return [k for g in training_graphs(gm, example_inputs) for k in predict_kernels(g, None, PREDICTED)]
    return predict_kernels(per_step(gm, example_inputs, variant), example_inputs, PREDICTED)


def per_step(gm: torch.fx.GraphModule, example_inputs: list, variant: str) -> torch.fx.GraphModule:
    """What runs every step of an inference ``variant``: "frozen" folds all parameter-only work,
    "inf" the packs the backend's parameter cache builds once."""
    if variant == "frozen":
        return fold_parameters(gm, example_inputs)
    if variant == "inf":
        return fold_parameters(gm, example_inputs, packable_nodes)
    return gm


def kernel_notes(predicted: list) -> str:
    """Predicted kernels grouped by what they are: "3x cat copy 1/1 (ConcatKernel); ..."."""
    counts = Counter(k.note or k.kind.value for k in predicted)
    return "; ".join(f"{n}x {note}" for note, n in counts.most_common())


def step_us(gm: torch.fx.GraphModule, example_inputs: list, profile: str, variant: str) -> float:
    """Predicted step time in microseconds of what runs every step (:func:`per_step`)."""
    gm = per_step(gm, example_inputs, variant)
    return round(predicted_step_time(gm, example_inputs, profile, training=variant == "train") * 1e6, 1)


def report_text(opt: Optimized) -> str:
    """The optimizer's report in one line: stop reason, batched groups, dropped batches."""
    r = opt.report
    batched = ", ".join(f"{k} x{v}" for k, v in r.batched.items()) or "none"
    return (
        f"{r.stop_reason} after {r.iterations} iterations ({r.enodes} e-nodes), {r.extractor} "
        f"extraction; batched: {batched}; dropped: {', '.join(r.dropped_batches) or 'none'}; "
        f"refine tried: {r.refine_tried or 'none'}; group moves: {r.group_moves or 'none'}"
        + (f"; FELL BACK: {r.fallback_reason}" if r.fell_back else "")
    )


def _ratio(a: float, b: float) -> float:
    return round(a / max(b, 1e-12), 1)


def study_row(generator: str, features: int, options: StudyOptions = StudyOptions()) -> dict[str, Any]:
    """Every column of one (generator, feature count); ``row["details"]`` holds the optimizer's
    reports and the predicted kernels of our programs (text, not a table column)."""
    spec = GENERATORS[generator]
    model = spec.build(features, options.seed).eval()
    inputs = spec.inputs(options.batch, options.seed, features)
    gm, ex = capture_dynamo_graph(model, inputs)
    variants = [v for v in ("inf", "frozen", "train") if options.training or v != "train"]
    row: dict[str, Any] = {
        "generator": generator,
        "features": features,
        "batch": options.batch,
        "fx_nodes": len(gm.graph.nodes),
    }
    details: list[str] = []
    ours: dict[tuple[str, str], Optimized] = {}
    for profile in options.profiles:
        for label, mode, frozen in MODES:
            if label not in variants or (profile == "cpu" and frozen):
                continue  # the CPU columns compile without freezing
            opt = ours[profile, label] = optimize(gm, ex, profile, mode, frozen)
            row[f"opt_s_{profile}_{label}"] = round(opt.wall_s, 2)
            row[f"opt_cpu_s_{profile}_{label}"] = round(opt.cpu_s, 2)
            row[f"stop_{profile}_{label}"] = opt.report.stop_reason
            details.append(
                f"- ours {profile} {label} ({opt.wall_s:.1f} s wall, {opt.cpu_s:.1f} s CPU): {report_text(opt)}"
            )
    theirs = None
    if options.inductor_optimus:
        theirs, row["inductor_passes_s"] = inductor_optimus(gm, ex)
        row["inductor_passes_s"] = round(row["inductor_passes_s"], 2)
    for variant in variants:  # predicted h200 launches
        default = len(kernels(gm, ex, variant))
        mine = kernels(ours[PREDICTED, variant].graph, ex, variant)
        row[f"{PREDICTED}_{variant}_default"], row[f"{PREDICTED}_{variant}_ours"] = default, len(mine)
        row[f"{PREDICTED}_{variant}_x"] = _ratio(default, len(mine))
        if theirs is not None:
            row[f"{PREDICTED}_{variant}_inductor_optimus"] = len(kernels(theirs, ex, variant))
        details.append(f"- ours {PREDICTED} {variant}: {len(mine)} predicted kernels: {kernel_notes(mine)}")
    for profile in options.profiles:  # predicted step time
        for variant in variants:
            if (profile, variant) not in ours:
                continue
            default, mine = (
                step_us(gm, ex, profile, variant),
                step_us(ours[profile, variant].graph, ex, profile, variant),
            )
            row[f"pred_{profile}_{variant}_default_us"], row[f"pred_{profile}_{variant}_ours_us"] = default, mine
            row[f"pred_{profile}_{variant}_x"] = round(default / max(mine, 1e-9), 2)
    if options.floor and generator == "ragged":
        row.update(_floor_columns(model, inputs, row, variants, details))
    if options.inductor:
        row.update(_inductor_columns(model, inputs, gm, ex, ours, variants, options))
    row["details"] = "\n".join(details)
    return row


def _floor_columns(
    model: torch.nn.Module, inputs: tuple, row: dict[str, Any], variants: list[str], details: list[str]
) -> dict[str, Any]:
    """The ragged generator's floors of predicted h200 launches (benchmarks/extreme_floor.py):
    ``floor_{variant}``, the fewest of the programs in the optimizer's vocabulary (per_width,
    padded, or Dynamo's graph itself: at a few features batching does not pay);
    ``floor_any_frozen``, the same with the block-diagonal program; ours over each."""
    from benchmarks.extreme_floor import floor_kernels

    out: dict[str, Any] = {}
    found = {family: floor_kernels(model, inputs, family, tuple(variants)) for family in ("per_width", "padded")}
    found["block_diagonal"] = floor_kernels(model, inputs, "block_diagonal", ("frozen",))
    found["default"] = {v: row[f"{PREDICTED}_{v}_default"] for v in variants} | {"max_abs_diff": 0.0}
    for family, result in found.items():
        if result["max_abs_diff"] > 1e-4:
            raise RuntimeError(f"floor program {family} computes another function ({result['max_abs_diff']})")
        details.append(
            f"- floor {family}: "
            + "; ".join(f"{v} {result[v]} ({result[f'{v}_notes']})" for v in variants if f"{v}_notes" in result)
        )
    for variant in variants:
        family = min(("per_width", "padded", "default"), key=lambda f: found[f][variant])
        out[f"floor_{variant}"], out[f"floor_{variant}_family"] = found[family][variant], family
        out[f"ours_over_floor_{variant}"] = round(row[f"{PREDICTED}_{variant}_ours"] / found[family][variant], 2)
    out["floor_any_frozen"] = min(found["block_diagonal"]["frozen"], out["floor_frozen"])
    out["ours_over_floor_any_frozen"] = round(row[f"{PREDICTED}_frozen_ours"] / out["floor_any_frozen"], 2)
    return out


def _inductor_columns(
    model: torch.nn.Module,
    inputs: tuple,
    gm: torch.fx.GraphModule,
    ex: list,
    ours: dict[tuple[str, str], Optimized],
    variants: list[str],
    options: StudyOptions,
) -> dict[str, Any]:
    """Inductor's CPU kernel counts and measured CPU step times of default and ours (cpu)."""
    from benchmarks.extreme_cpu import compile_and_time

    shapes = [x.shape for x in ex]
    out: dict[str, Any] = {}
    for variant in (v for v in variants if v != "frozen"):
        programs = {"default": gm, "ours": ours["cpu", variant].graph}
        result = compile_and_time(model, inputs, programs, shapes, variant == "train", options.plan)
        for name, r in result.items():
            out[f"cpu_{variant}_{name}"] = r["launches"]
            if "step_ms" in r:
                out[f"measured_{variant}_{name}_ms"] = round(r["step_ms"], 3)
        out[f"cpu_{variant}_x"] = _ratio(result["default"]["launches"], result["ours"]["launches"])
        out[f"max_abs_diff_{variant}"] = result["ours"]["max_abs_diff"]
        if "ratio" in result["ours"]:
            out[f"measured_{variant}_ratio"] = round(result["ours"]["ratio"], 3)
    return out


def _sizes(text: str) -> list[int]:
    return [int(f) for f in text.split(",") if f]


def main(argv: list[str] | None = None) -> int:
    from benchmarks.extreme_report import write_study

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--generator", default="both", choices=("ragged", "uniform", "both"))
    parser.add_argument("--features", default="20,100,500,2000")
    parser.add_argument(
        "--training",
        default="20,100,500,2000",
        help="feature counts (comma-separated) that also get the training columns",
    )
    parser.add_argument(
        "--inductor",
        default="20,100",
        help="feature counts compiled by Inductor on this CPU: kernel counts, measured step",
    )
    parser.add_argument(
        "--no-inductor-optimus",
        action="store_true",
        help="skip Inductor's Optimus pre-grad passes (minutes at 2,000 features)",
    )
    parser.add_argument("--no-floor", action="store_true", help="skip the ragged generator's floor programs")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", default=None, help="default: benchmarks/results/extreme/GENERATOR")
    args = parser.parse_args(argv)
    generators = ["ragged", "uniform"] if args.generator == "both" else [args.generator]
    args.out = args.out or f"benchmarks/results/extreme/{args.generator}"
    training, inductor = set(_sizes(args.training)), set(_sizes(args.inductor))
    rows = []
    for generator in generators:
        for features in _sizes(args.features):
            start = time.perf_counter()
            options = StudyOptions(
                batch=args.batch,
                training=features in training,
                inductor=features in inductor,
                inductor_optimus=not args.no_inductor_optimus,
                floor=not args.no_floor,
            )
            rows.append(study_row(generator, features, options))
            print(f"{generator} {features}: {time.perf_counter() - start:.0f} s", flush=True)
            write_study(rows, args, args.out)  # after every row: a long run leaves what it has
    return 0


if __name__ == "__main__":
    sys.exit(main())
