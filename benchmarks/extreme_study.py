"""The extreme-graph study: kernel launches against feature count, ours vs Inductor's passes.

For each feature count of the dynamic-schema generator (benchmarks/zoo/dynamic_schema.py),
on the Dynamo graph of the inference forward:

- predicted GPU launches (cost model, ``--profile``, default h100) of the graph as
  Dynamo gives it (what Inductor compiles by default);
- the same after Inductor's own Optimus pre-grad passes (the batch and split/cat
  passes of benchmarks/methods.py: OPTIMUS_PRE_GRAD), and their time;
- the same after optimus_eqsat.optimize_graph, and its time.

    python -m benchmarks.extreme_study --features 20,100,500,2000 [--profile h100] [--out DIR]

Writes a Markdown table (and CSV) to --out. Predicted counts, not measured
ones: no GPU here. Inductor's CPU kernel counts for the same model are in the
harness table (python -m benchmarks --models dynamic_schema --scales ...), where
C++ codegen merges all generated code between extern calls.
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
from optimus_eqsat.extract.fx_cost import predicted_launches

COLUMNS = ("features", "fx_nodes", "launches_default", "launches_inductor_optimus", "launches_optimus_eqsat",
           "reduction_inductor_optimus", "reduction_optimus_eqsat", "inductor_passes_s", "optimus_eqsat_s",
           "eqsat_stop", "eqsat_fell_back")


def dynamo_graph(model: torch.nn.Module, inputs: tuple) -> tuple[torch.fx.GraphModule, list]:
    """Dynamo's graph of the inference forward, and the example inputs it was given."""
    captured = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list):
        captured.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=capture, fullgraph=True)(*inputs)
    torch._dynamo.reset()
    return captured[0]


def inductor_optimus(gm: torch.fx.GraphModule, example_inputs: list) -> tuple[torch.fx.GraphModule, float]:
    """Inductor's pre-grad passes with its Optimus passes switched on."""
    from torch._inductor import config
    from torch._inductor.fx_passes.pre_grad import pre_grad_passes

    graph = copy.deepcopy(gm)
    start = time.perf_counter()
    with config.patch(pre_grad_fusion_options=OPTIMUS_PRE_GRAD, fx_graph_cache=False):
        out = pre_grad_passes(graph, example_inputs)
    return out, time.perf_counter() - start


def study(features: int, profile: str) -> dict[str, object]:
    spec = MODELS["dynamic_schema"]
    torch.manual_seed(0)
    model = DynamicSchema(num_features=features).eval()
    scale = max(1, -(-features // 20))
    inputs = spec.inputs(8, 0, scale=scale)
    if inputs[0].shape[1] != sum(model.widths):  # inputs follow the feature count
        inputs = (torch.randn(8, sum(model.widths)), *inputs[1:])
    gm, example_inputs = dynamo_graph(model, inputs)
    default = predicted_launches(gm, profile=profile)
    theirs, their_s = inductor_optimus(gm, example_inputs)
    start = time.perf_counter()
    ours = optimize_graph(gm, profile=profile)
    our_s = time.perf_counter() - start
    report = ours.meta["optimus_eqsat"]
    launches_theirs = predicted_launches(theirs, profile=profile)
    launches_ours = predicted_launches(ours, profile=profile)
    return {
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
    parser.add_argument("--out", default="benchmarks/results/extreme")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS), flush=True)
    for features in (int(f) for f in args.features.split(",")):
        rows.append(study(features, args.profile))
        print("| " + " | ".join(str(rows[-1][c]) for c in COLUMNS) + " |", flush=True)
    with open(out / "extreme_study.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    table = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    table += ["| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in rows]
    (out / "extreme_study.md").write_text(
        f"# Extreme-graph study (predicted {args.profile} launches, inference forward)\n\n"
        f"Command: `python -m benchmarks.extreme_study --features {args.features} --profile {args.profile}`\n\n"
        + "\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
