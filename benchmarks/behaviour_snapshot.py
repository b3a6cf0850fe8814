"""What the optimizer does on the zoo, as a JSON snapshot to diff across refactors.

For every zoo model (scale 1, batch 8) the Dynamo graph and the
``symbolic_trace`` graph are optimized under each profile, with the exact
extractor and time limits far beyond what the zoo needs (so the result does
not depend on how loaded the machine is); the snapshot holds
the predicted launches and cost before and after, the batches formed, the
rules fired, and the optimized graph's op counts and code. Two snapshots of the
same inputs are equal when a change kept the behaviour::

    python -m benchmarks.behaviour_snapshot --out /tmp/before.json
    ... change ...
    python -m benchmarks.behaviour_snapshot --out /tmp/after.json --compare /tmp/before.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any

import torch

from benchmarks.zoo import MODELS
from optimus_eqsat import optimize_graph
from optimus_eqsat.inductor_count import capture_dynamo_graph

_FIELDS = (
    "launches_before",
    "launches_after",
    "cost_before",
    "cost_after",
    "batched",
    "dropped_batches",
    "rules_fired",
    "fell_back",
    "nodes_after",
    "extractor",
    "optimal",
)


def _op_counts(gm: torch.fx.GraphModule) -> dict[str, int]:
    counts = Counter(
        f"{n.op}:{getattr(n.target, '__name__', n.target)}"
        for n in gm.graph.nodes
        if n.op not in ("placeholder", "output")
    )
    return dict(sorted(counts.items()))


# Every zoo e-graph is proven optimal within seconds; these limits only make sure that a
# loaded machine does not stop the ILP, refine or saturation early (results by time).
DETERMINISTIC = {"extractor": "ilp", "ilp_time_limit_s": 600.0, "refine_time_limit_s": 1e6, "time_limit_s": 600.0}


def snapshot_case(gm: torch.fx.GraphModule, inputs: Any, profile: str) -> dict[str, Any]:
    """The optimizer's result on one graph under one profile."""
    optimized = optimize_graph(gm, inputs, profile=profile, **DETERMINISTIC)
    report = optimized.meta["optimus_eqsat"]
    row = {f: getattr(report, f) for f in _FIELDS}
    for f in ("cost_before", "cost_after"):
        row[f] = None if row[f] is None else float(f"{row[f]:.6e}")
    row["ops"] = _op_counts(optimized)
    row["code"] = optimized.code
    return row


def snapshot(models: list[str], profiles: list[str]) -> dict[str, Any]:
    """Every model x {dynamo, symbolic_trace} x profile."""
    out: dict[str, Any] = {}
    for name in models:
        spec = MODELS[name]
        model = spec.build(scale=1, seed=0).eval()
        inputs = spec.inputs(batch=8, seed=0)
        with torch.no_grad():
            dynamo_gm, dynamo_inputs = capture_dynamo_graph(model, inputs)
        graphs = {"dynamo": (dynamo_gm, dynamo_inputs)}
        try:
            graphs["symbolic_trace"] = (torch.fx.symbolic_trace(model), inputs)
        except Exception as exc:  # a model symbolic_trace cannot trace
            out[f"{name}/symbolic_trace"] = {"error": type(exc).__name__}
        for kind, (gm, example) in graphs.items():
            for profile in profiles:
                out[f"{name}/{kind}/{profile}"] = snapshot_case(gm, example, profile)
                print(f"{name}/{kind}/{profile}: {out[f'{name}/{kind}/{profile}']['launches_after']}", file=sys.stderr)
    return out


def compare(now: dict[str, Any], before: dict[str, Any]) -> list[str]:
    """Differences, one line each (code differences are named, not printed)."""
    lines = []
    for key in sorted(set(now) | set(before)):
        a, b = before.get(key), now.get(key)
        if a is None or b is None:
            lines.append(f"{key}: only in {'before' if b is None else 'now'}")
            continue
        for field in sorted(set(a) | set(b)):
            if a.get(field) != b.get(field):
                lines.append(f"{key}: {field}" + ("" if field == "code" else f": {a.get(field)} -> {b.get(field)}"))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--profiles", default="h100,cpu")
    parser.add_argument("--out", required=True)
    parser.add_argument("--compare", help="an earlier snapshot: print the differences, exit 1 if any")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    now = snapshot(args.models.split(","), args.profiles.split(","))
    with open(args.out, "w") as f:
        json.dump(now, f, indent=1, sort_keys=True)
    if args.compare:
        with open(args.compare) as f:
            diffs = compare(now, json.load(f))
        print("\n".join(diffs) or "identical")
        return 1 if diffs else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
