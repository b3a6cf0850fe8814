"""Extraction time and cost per extractor on synthetic e-graphs.

Run ``python benchmarks/bench_extractors.py [--sizes 1000 10000 100000]
[--time-limit 10] [--models] [--out table.md]``. ``--models`` instead extracts the real
e-graphs our pipeline saturates (OptimizationRun.saturate) for DemoRecModel,
split_cat_chain(1000 / 10000) and every model of ``benchmarks.zoo.MODELS``
that ``torch.fx.symbolic_trace`` accepts. The generators are also used by
``tests/test_extractors.py``.

E-graph families (sizes are e-node counts, approximately):

* ``splitcat``: a chain of levels ``A_i = {pw(A_{i-1}) 1, cat(P_i, Q_i) 1}``,
  ``P_i = {slice0(A_i) 0, pw(P_{i-1}) 1}``, ``Q_i`` alike: every level is a
  3-class cycle through slice/cat (x = cat(slice0(x), slice1(x))).
* ``batching``: F features x L layers; ``X[f,l] = {op(X[f,l-1]) 1,
  slice_f(B_l) 0}``, ``B_l = {batched(X[0..F-1, l-1]) 1.5}``; optimum 1.5 L.
* ``wide``: W roots-of-a-cat ``Y_i = {own 1, f(S) 0.5}`` sharing ``S = {1}``.
* ``chain``: ``X_i = {op(X_{i-1}) 1, op2(X_{i-1}, X_{i-2}) 0.5}``, deep.
"""

from __future__ import annotations

import argparse
import sys
import time

from optimus_eqsat.extract.egraph import ENode, ExtractionError, ExtractionGraph
from optimus_eqsat.extract.extractors import get_extractor


def splitcat_chain(n_nodes: int) -> ExtractionGraph:
    """Chain of slice/cat cycles, about ``n_nodes`` e-nodes (6 per level)."""
    levels = max(1, n_nodes // 6)
    classes: list[list[ENode]] = [[ENode(f"input{k}", (), 0.0)] for k in range(3)]
    for i in range(1, levels + 1):
        a, p, q = 3 * i, 3 * i + 1, 3 * i + 2
        pa, pp, pq = a - 3, p - 3, q - 3
        classes.append([ENode("pw", (pa,), 1.0), ENode("cat", (p, q), 1.0)])
        classes.append([ENode("slice0", (a,), 0.0), ENode("pw", (pp,), 1.0)])
        classes.append([ENode("slice1", (a,), 0.0), ENode("pw", (pq,), 1.0)])
    return ExtractionGraph(classes, [3 * levels])


def batching(features: int, layers: int, batched_cost: float = 1.5) -> ExtractionGraph:
    """F x L batching e-graph; roots are all last-layer features."""
    classes: list[list[ENode]] = [[ENode(f"x{f}", (), 0.0)] for f in range(features)]
    prev = list(range(features))
    for _ in range(layers):
        b = len(classes)
        classes.append([ENode("batched", tuple(prev), batched_cost)])
        cur = []
        for f in range(features):
            cur.append(len(classes))
            classes.append([ENode("op", (prev[f],), 1.0), ENode(f"slice{f}", (b,), 0.0)])
        prev = cur
    return ExtractionGraph(classes, prev)


def batching_for(n_nodes: int, layers: int = 4) -> ExtractionGraph:
    """Batching e-graph with about ``n_nodes`` e-nodes (1 + 2L per feature)."""
    return batching(max(2, n_nodes // (1 + 2 * layers)), layers)


def wide(n_nodes: int) -> ExtractionGraph:
    """One root concatenating ~n/2 classes that may share one node."""
    w = max(1, n_nodes // 2)
    classes: list[list[ENode]] = [[ENode("shared", (), 1.0)]]
    classes += [[ENode("own", (), 1.0), ENode("f", (0,), 0.5)] for _ in range(w)]
    classes.append([ENode("cat", tuple(range(1, w + 1)), 0.0)])
    return ExtractionGraph(classes, [w + 1])


def chain(n_nodes: int) -> ExtractionGraph:
    """A deep chain, 2 e-nodes per class, each class depending on the previous two."""
    classes: list[list[ENode]] = [[ENode("input", (), 0.0)], [ENode("op", (0,), 1.0)]]
    for i in range(2, max(3, n_nodes // 2)):
        classes.append([ENode("op", (i - 1,), 1.0), ENode("op2", (i - 1, i - 2), 0.5)])
    return ExtractionGraph(classes, [len(classes) - 1])


FAMILIES = {"splitcat": splitcat_chain, "batching": batching_for, "wide": wide, "chain": chain}


def measure(family: str, graph: ExtractionGraph, name: str, time_limit: float) -> dict[str, object]:
    """One extractor on one e-graph: a table row (errors become rows too)."""
    opts = {"time_limit": time_limit} if name in ("ilp", "auto") else {}
    t0 = time.perf_counter()
    try:
        ext = get_extractor(name, **opts).extract(graph)
        cost, by, opt, gap = ext.cost, ext.extractor, ext.optimal, ext.gap
    except ExtractionError as err:  # pragma: no cover - reported in table
        cost, by, opt, gap = float("nan"), f"error: {err}", False, None
    return dict(
        family=family,
        nodes=graph.num_nodes,
        extractor=name,
        seconds=time.perf_counter() - t0,
        cost=cost,
        result_by=by,
        optimal=opt,
        gap=gap,
    )


def run(sizes: list[int], time_limit: float, extractors: list[str]) -> list[dict[str, object]]:
    """Extract every family x size with every extractor; returns table rows."""
    rows = []
    for family, make in FAMILIES.items():
        for size in sizes:
            graph = make(size)
            for name in extractors:
                rows.append(measure(family, graph, name, time_limit))
                print(_fmt(rows[-1]), flush=True)
    return rows


HEADER = (
    f"{'family':<9} {'e-nodes':>8} {'extractor':<7} {'seconds':>8} {'cost':>10} {'result by':<8} {'optimal':<7} gap"
)


def _fmt(r: dict[str, object]) -> str:
    gap = "" if r["gap"] is None else f"{r['gap']:.3g}"
    return (
        f"{r['family']:<9} {r['nodes']:>8} {r['extractor']:<7} {r['seconds']:>8.2f} "
        f"{r['cost']:>10.1f} {r['result_by']:<8} {str(r['optimal']):<7} {gap}"
    )


def real_egraphs(chains: tuple[int, ...] = (1_000, 10_000)):
    """Yield (name, ExtractionGraph) for the real pipeline e-graphs (see module doc)."""
    import torch

    from benchmarks.synthetic import split_cat_chain
    from optimus_eqsat.api import OptimizationRun, OptimizeOptions
    from optimus_eqsat.demo import DemoRecModel

    def saturated(gm, inputs) -> ExtractionGraph:
        run = OptimizationRun(gm, inputs, OptimizeOptions())
        run.saturate()
        return run.egraph.extraction_graph(run.roots, run.cost)

    model = DemoRecModel().eval()
    yield "demo", saturated(torch.fx.symbolic_trace(model), model.example_inputs())
    for n in chains:
        yield f"split_cat_chain({n})", saturated(*split_cat_chain(n))
    try:
        from benchmarks.zoo import MODELS
    except Exception as err:  # pragma: no cover - the zoo is optional
        print(f"# zoo not importable: {err}")
        return
    for name, spec in MODELS.items():
        try:
            model = spec.build(scale=1, seed=0).eval()
            gm = torch.fx.symbolic_trace(model)
        except Exception as err:  # noqa: BLE001 - untraceable models are skipped
            print(f"# {name}: skipped ({type(err).__name__}: {str(err)[:80]})")
            continue
        yield name, saturated(gm, spec.inputs(batch=8, seed=0))


def run_models(time_limit: float, extractors: list[str]) -> list[dict[str, object]]:
    """Every extractor on every real e-graph; returns table rows."""
    rows = []
    for family, graph in real_egraphs():
        for name in extractors:
            rows.append(r := measure(family, graph, name, time_limit))
            g = "" if r["gap"] is None else f"{r['gap']:.3g}"
            print(
                f"{family:<22} {r['nodes']:>8} {name:<7} {r['seconds']:>8.2f} {r['cost']:>12.6e} "
                f"{r['result_by']:<8} {str(r['optimal']):<7} {g}",
                flush=True,
            )
    return rows


def to_markdown(rows: list[dict[str, object]], command: str) -> str:
    """The rows as a markdown table, with the command that made them."""
    lines = [
        f"Made by `{command}`.",
        "",
        "| graph | e-nodes | extractor | seconds | cost | result by | optimal | gap |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        gap = "" if r["gap"] is None else f"{r['gap']:.3g}"
        lines.append(
            f"| {r['family']} | {r['nodes']} | {r['extractor']} | {r['seconds']:.2f} | {r['cost']:.6g} "
            f"| {r['result_by']} | {r['optimal']} | {gap} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    ap.add_argument("--time-limit", type=float, default=10.0, help="ILP time limit (s)")
    ap.add_argument("--extractors", nargs="+", default=["greedy", "ilp", "auto"])
    ap.add_argument("--models", action="store_true", help="real pipeline e-graphs instead of synthetic ones")
    ap.add_argument("--out", default="", help="also write the table (markdown) to this file")
    args = ap.parse_args()
    if args.models:
        print(
            f"{'graph':<22} {'e-nodes':>8} {'extractor':<7} {'seconds':>8} {'cost':>12} {'result by':<8} {'optimal':<7} gap"
        )
        rows = run_models(args.time_limit, args.extractors)
    else:
        print(HEADER)
        rows = run(args.sizes, args.time_limit, args.extractors)
    if args.out:
        with open(args.out, "w") as f:
            f.write(to_markdown(rows, "python benchmarks/bench_extractors.py " + " ".join(sys.argv[1:])))


if __name__ == "__main__":
    main()
