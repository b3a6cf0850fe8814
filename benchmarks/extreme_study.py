"""The extreme-graph study: kernel launches against feature count, ours vs Inductor's passes.

For each feature count of the dynamic-schema generator (benchmarks/zoo/dynamic_schema.py),
on the Dynamo graph of the inference forward:

- predicted GPU launches (cost model, ``--profile``, default h100) of the graph as
  Dynamo gives it (what Inductor compiles by default);
- the same after Inductor's own Optimus pre-grad passes (the batch and split/cat
  passes of benchmarks/methods.py: OPTIMUS_PRE_GRAD), and their time;
- the same after optimus_eqsat.optimize_graph, and its time;
- ``frozen_*``: the three graphs with parameter-only work (weight stacking of
  batched programs) folded into constants, as Inductor's ``freezing=True`` does
  for inference (extract/freezing.py);
- ``train_*`` (feature counts given to ``--training``): one training step, the
  AOTAutograd forward plus backward graphs of each (Inductor's partitioner).

    python -m benchmarks.extreme_study --features 20,100,500,2000 [--training 20,100] \
        [--profile h100] [--out DIR]

Writes a Markdown table (and CSV) to --out. Predicted counts, not measured ones;
Inductor's CPU kernel counts for the same model are in the harness table
(python -m benchmarks --models dynamic_schema ...), GPU ones in results/gpu/.
"""

from __future__ import annotations

import argparse
import copy
import csv
import sys
import time
from pathlib import Path

import torch

from benchmarks.methods import OPTIMUS_PRE_GRAD
from benchmarks.zoo.dynamic_schema import DynamicSchema
from benchmarks.zoo import MODELS
from optimus_eqsat import optimize_graph
from optimus_eqsat.extract.freezing import fold_parameters
from optimus_eqsat.extract.fx_cost import predicted_launches
from optimus_eqsat.inductor_count import capture_dynamo_graph

COLUMNS = ("features", "fx_nodes", "launches_default", "launches_inductor_optimus", "launches_optimus_eqsat",
           "reduction_inductor_optimus", "reduction_optimus_eqsat", "frozen_default", "frozen_inductor_optimus",
           "frozen_optimus_eqsat", "frozen_reduction_optimus_eqsat", "inductor_passes_s", "optimus_eqsat_s",
           "eqsat_stop", "eqsat_fell_back")
TRAIN_COLUMNS = ("train_default", "train_inductor_optimus", "train_optimus_eqsat", "train_reduction_optimus_eqsat")


def inductor_optimus(gm: torch.fx.GraphModule, example_inputs: list) -> tuple[torch.fx.GraphModule, float]:
    """Inductor's pre-grad passes with its Optimus passes switched on."""
    from torch._inductor import config
    from torch._inductor.fx_passes.pre_grad import pre_grad_passes

    graph = copy.deepcopy(gm)
    start = time.perf_counter()
    with config.patch(pre_grad_fusion_options=OPTIMUS_PRE_GRAD, fx_graph_cache=False):
        out = pre_grad_passes(graph, example_inputs)
    return out, time.perf_counter() - start


def training_launches(gm: torch.fx.GraphModule, example_inputs: list, profile: str) -> int:
    """Predicted launches of one training step: AOTAutograd's forward plus backward graph
    (Inductor's partitioner), parameters requiring gradients as in training."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    graphs: list[torch.fx.GraphModule] = []

    def capture(g: torch.fx.GraphModule, _inputs: list):
        graphs.append(g)
        return make_boxed_func(g.forward)

    compiled = aot_module_simplified(gm, example_inputs, fw_compiler=capture, bw_compiler=capture,
                                     partition_fn=min_cut_rematerialization_partition)
    out = compiled(*example_inputs)
    sum(o.sum() for o in out if isinstance(o, torch.Tensor) and o.requires_grad).backward()
    return sum(predicted_launches(g, profile=profile) for g in graphs)


def study(features: int, profile: str, training: bool = False) -> dict[str, object]:
    spec = MODELS["dynamic_schema"]
    torch.manual_seed(0)
    model = DynamicSchema(num_features=features).eval()
    scale = max(1, -(-features // 20))
    inputs = spec.inputs(8, 0, scale=scale)
    if inputs[0].shape[1] != sum(model.widths):  # inputs follow the feature count
        inputs = (torch.randn(8, sum(model.widths)), *inputs[1:])
    gm, example_inputs = capture_dynamo_graph(model, inputs)
    default = predicted_launches(gm, profile=profile)
    theirs, their_s = inductor_optimus(gm, example_inputs)
    start = time.perf_counter()
    ours = optimize_graph(gm, profile=profile)
    our_s = time.perf_counter() - start
    report = ours.meta["optimus_eqsat"]
    launches_theirs = predicted_launches(theirs, profile=profile)
    launches_ours = predicted_launches(ours, profile=profile)
    frozen = [predicted_launches(fold_parameters(g, example_inputs), profile=profile) for g in (gm, theirs, ours)]
    row: dict[str, object] = {
        "frozen_default": frozen[0], "frozen_inductor_optimus": frozen[1], "frozen_optimus_eqsat": frozen[2],
        "frozen_reduction_optimus_eqsat": round(frozen[0] / max(frozen[2], 1), 1),
    }
    if training:
        train = [training_launches(g, example_inputs, profile) for g in (gm, theirs, ours)]
        row.update(train_default=train[0], train_inductor_optimus=train[1], train_optimus_eqsat=train[2],
                   train_reduction_optimus_eqsat=round(train[0] / max(train[2], 1), 1))
    return row | {
        "features": features, "fx_nodes": len(gm.graph.nodes), "launches_default": default,
        "launches_inductor_optimus": launches_theirs, "launches_optimus_eqsat": launches_ours,
        "reduction_inductor_optimus": round(default / max(launches_theirs, 1), 1),
        "reduction_optimus_eqsat": round(default / max(launches_ours, 1), 1),
        "inductor_passes_s": round(their_s, 2), "optimus_eqsat_s": round(our_s, 2),
        "eqsat_stop": report.stop_reason, "eqsat_fell_back": report.fell_back,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--features", default="20,100,500")
    parser.add_argument("--profile", default="h100")
    parser.add_argument("--training", default="",
                        help="feature counts (comma-separated) that also get the training-step columns")
    parser.add_argument("--out", default="benchmarks/results/extreme")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    training = {int(f) for f in args.training.split(",") if f}
    columns = COLUMNS + (TRAIN_COLUMNS if training else ())
    rows = []
    print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns), flush=True)
    for features in (int(f) for f in args.features.split(",")):
        rows.append(study(features, args.profile, training=features in training))
        print("| " + " | ".join(str(rows[-1].get(c, "")) for c in columns) + " |", flush=True)
    with open(out / "extreme_study.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)
    table = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    table += ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]
    command = f"python -m benchmarks.extreme_study --features {args.features} --profile {args.profile}"
    if training:
        command += f" --training {args.training}"
    (out / "extreme_study.md").write_text(
        f"# Extreme-graph study (predicted {args.profile} launches)\n\n"
        f"Command: `{command}`\n\n"
        "Columns: `launches_*` inference forward as compiled; `frozen_*` the same with parameters "
        "frozen (parameter-only work such as weight stacking constant-folded, as Inductor's "
        "`freezing=True` does); `train_*` one training step (AOTAutograd forward + backward graphs).\n\n"
        + "\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
