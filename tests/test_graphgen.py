"""Tests of the random FX-graph generator itself (tests/graphgen/).

The fuzzer is only as good as its generator: graphs must be valid, runnable,
differentiable, deterministic per seed, and must actually contain the op
families and spellings the optimizer has to handle.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Iterator

import pytest
import torch
import torch.fx as fx

try:  # rootdir-relative import works whether or not tests/ is a package
    from graphgen import ALL_FAMILIES, GeneratedGraph, opaque_mix, random_graph, random_module, single_thread
except ImportError:  # pragma: no cover
    from tests.graphgen import ALL_FAMILIES, GeneratedGraph, opaque_mix, random_graph, random_module, single_thread

N_SEEDS = 300


def _options(seed: int) -> dict:
    """Flags cycle with the seed so the 300 graphs cover every flavour."""
    return dict(opaque=seed % 2 == 0, inplace=seed % 3 == 0, params=seed % 4 != 3, n_ops=10 + seed % 21)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with single_thread():
        yield


@pytest.fixture(scope="module")
def graphs() -> list[GeneratedGraph]:
    return [random_graph(s, **_options(s)) for s in range(N_SEEDS)]


def _fresh_inputs(g: GeneratedGraph) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_(t.is_floating_point()) for t in g.example_inputs]


def test_graphs_lint_run_and_backward(graphs: list[GeneratedGraph]) -> None:
    for seed, g in enumerate(graphs):
        g.gm.graph.lint()
        before = [t.clone() for t in g.example_inputs]
        ins = _fresh_inputs(g)
        outs = g.gm(*ins)
        assert isinstance(outs, tuple) and 1 <= len(outs) <= 3, g.description
        for o in outs:
            assert o.dtype == torch.float32 and torch.isfinite(o).all(), g.description
        torch.autograd.backward(
            [o for o in outs if o.requires_grad], [torch.ones_like(o) for o in outs if o.requires_grad]
        )
        for t in ins:
            if t.is_floating_point():
                assert t.grad is not None and torch.isfinite(t.grad).all(), g.description
        for name, p in g.gm.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), f"{name}: {g.description}"
            p.grad = None
        # the generated program never mutates its inputs
        for a, b in zip(before, g.example_inputs):
            assert torch.equal(a, b), g.description


def test_graph_structure(graphs: list[GeneratedGraph]) -> None:
    for seed, g in enumerate(graphs):
        phs = [n for n in g.gm.graph.nodes if n.op == "placeholder"]
        assert len(phs) == len(g.example_inputs)
        data = [n for n in phs if not n.name.startswith("w")]  # weights are w<k>
        assert 1 <= len(data) <= 3, g.description
        nodes = list(g.gm.graph.nodes)
        assert nodes[: len(phs)] == phs, "placeholders come first"
        if _options(seed)["params"]:
            assert all(not n.name.startswith("w") for n in phs)
        else:
            assert not list(g.gm.parameters()), g.description
        for n, t in zip(phs, g.example_inputs):
            assert t.dtype == (torch.int64 if n.name == "idx" else torch.float32)
            assert 1 <= t.dim() <= 4
            if n in data:  # weights follow their layer's shapes; data is small
                assert max(t.shape) <= 8, g.description


def test_deterministic_per_seed(graphs: list[GeneratedGraph]) -> None:
    for seed in range(0, N_SEEDS, 10):
        again = random_graph(seed, **_options(seed))
        g = graphs[seed]
        assert again.gm.code == g.gm.code
        assert again.description == g.description
        assert len(again.example_inputs) == len(g.example_inputs)
        for a, b in zip(again.example_inputs, g.example_inputs):
            assert torch.equal(a, b)
        pa, pb = dict(again.gm.named_parameters()), dict(g.gm.named_parameters())
        assert pa.keys() == pb.keys()
        assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert random_graph(1).gm.code != random_graph(2).gm.code


def test_family_coverage(graphs: list[GeneratedGraph]) -> None:
    total: Counter = Counter()
    for g in graphs:
        total.update(g.families)
    missing = [f for f in ALL_FAMILIES if total[f] == 0]
    assert not missing, f"families never generated in {N_SEEDS} seeds: {missing}"
    # the tangles are the point of the fuzzer: each must show up repeatedly
    thin = {f: total[f] for f in ALL_FAMILIES if f.startswith("tangle:") and total[f] < 5}
    assert not thin, thin
    assert set(total) <= set(ALL_FAMILIES), set(total) - set(ALL_FAMILIES)


def _node_kinds(gm: fx.GraphModule) -> set[tuple[str, str]]:
    out = set()
    for n in gm.graph.nodes:
        if n.op == "call_function":
            out.add(("function", getattr(n.target, "__name__", str(n.target))))
        elif n.op == "call_method":
            out.add(("method", n.target))
        else:
            out.add((n.op, ""))
    return out


def test_spelling_coverage(graphs: list[GeneratedGraph]) -> None:
    """Both spellings (and negative dims / dim=) actually reach the FX graph."""
    kinds: set = set()
    neg_dim = dim_kw = axis_kw = slice_obj = False
    for g in graphs:
        kinds |= _node_kinds(g.gm)
        for n in g.gm.graph.nodes:
            d = n.kwargs.get("dim")
            dim_kw |= d is not None
            axis_kw |= "axis" in n.kwargs
            neg_dim |= isinstance(d, int) and d < 0
            if n.target is operator.getitem and isinstance(n.args[1], (slice, tuple)):
                slice_obj = True
    want = {
        ("function", "split"),
        ("method", "split"),
        ("function", "split_with_sizes"),
        ("method", "split_with_sizes"),
        ("function", "chunk"),
        ("method", "chunk"),
        ("function", "unbind"),
        ("method", "unbind"),
        ("function", "getitem"),
        ("function", "cat"),
        ("function", "concat"),
        ("function", "concatenate"),
        ("function", "stack"),
        ("method", "view"),
        ("method", "reshape"),
        ("function", "reshape"),
        ("method", "permute"),
        ("function", "permute"),
        ("method", "transpose"),
        ("function", "transpose"),
        ("method", "flatten"),
        ("function", "flatten"),
        ("method", "unflatten"),
        ("method", "expand"),
        ("method", "squeeze"),
        ("function", "squeeze"),
        ("method", "unsqueeze"),
        ("function", "unsqueeze"),
        ("function", "movedim"),
        ("method", "movedim"),
        ("function", "narrow"),
        ("method", "narrow"),
        ("function", "linear"),
        ("function", "matmul"),
        ("method", "matmul"),
        ("function", "mm"),
        ("function", "bmm"),
        ("function", "addmm"),
        ("function", "embedding"),
        ("function", "layer_norm"),
        ("function", "softmax"),
        ("method", "softmax"),
        ("function", "sum"),
        ("method", "mean"),
        ("function", "relu"),
        ("method", "relu"),
        ("function", "where"),
        ("function", "add"),
        ("method", "add"),
        ("function", "mul"),
        ("function", "truediv"),
        ("function", "cumsum"),
        ("function", "flip"),
        ("function", "roll"),
        ("function", "sort"),
        ("function", "topk"),
        ("function", "max"),
        ("method", "max"),
        ("function", "opaque_mix"),
        ("function", "getattr"),
        ("method", "add_"),
        ("method", "mul_"),
        ("method", "copy_"),
        ("method", "relu_"),
        ("function", "relu_"),
        ("method", "clone"),
        ("get_attr", ""),
    }
    assert not want - kinds, sorted(want - kinds)
    assert neg_dim and dim_kw and axis_kw and slice_obj


def test_flags_respected(graphs: list[GeneratedGraph]) -> None:
    opaque_targets = {torch.cumsum, torch.flip, torch.roll, torch.sort, torch.topk, torch.max, opaque_mix}
    opaque_methods = {"cumsum", "flip", "roll", "sort", "topk", "max"}
    for seed, g in enumerate(graphs):
        opts = _options(seed)
        nodes = list(g.gm.graph.nodes)
        has_opaque = any(
            (n.op == "call_function" and n.target in opaque_targets)
            or (n.op == "call_method" and n.target in opaque_methods)
            for n in nodes
        )
        has_inplace = any((n.op == "call_method" and n.target.endswith("_")) or n.target is torch.relu_ for n in nodes)
        if not opts["opaque"]:
            assert not has_opaque, g.description
        if not opts["inplace"]:
            assert not has_inplace, g.description
    assert any(g.families["inplace:add_"] for g in graphs)


def test_with_meta_sets_tensor_meta() -> None:
    for seed in range(8):
        g = random_graph(seed, with_meta=True, inplace=True, n_ops=30)
        missing = [n.format_node() for n in g.gm.graph.nodes if n.op != "output" and "tensor_meta" not in n.meta]
        assert not missing, (missing, g.description)
    assert all("tensor_meta" not in n.meta for n in random_graph(0).gm.graph.nodes)


def test_dynamo_flavour() -> None:
    """Dynamo re-captures the generated program as a torch-level graph."""
    for seed in (0, 3):
        g = random_graph(seed, dynamo=True, inplace=True, n_ops=12)
        plain = random_graph(seed, inplace=True, n_ops=12)
        g.gm.graph.lint()
        assert any("example_value" in n.meta for n in g.gm.graph.nodes)
        assert len(g.example_inputs) == len([n for n in g.gm.graph.nodes if n.op == "placeholder"])
        # same program: Dynamo orders inputs by first use, so match by name
        by_name = dict(zip([n.name for n in plain.gm.graph.nodes if n.op == "placeholder"], plain.example_inputs))
        by_name.update(
            {f"w{i}": p for i, (_, p) in enumerate(sorted(plain.gm.named_parameters(), key=lambda kv: int(kv[0][1:])))}
        )
        ins = []
        for n in g.gm.graph.nodes:
            if n.op == "placeholder":
                key = n.name.replace("l_self_parameters_", "").removeprefix("l_").rstrip("_")
                ins.append(by_name[key])
        for a, b in zip(g.gm(*ins), plain.gm(*plain.example_inputs)):
            torch.testing.assert_close(a, b)


def test_random_module() -> None:
    mod, ins = random_module(7, inplace=True)
    assert isinstance(mod, torch.nn.Module)
    out = mod(*ins)
    assert isinstance(out, tuple) and all(isinstance(o, torch.Tensor) for o in out)
    # symbolic_trace keeps the wrapped python function as one leaf call
    g = random_graph(next(s for s in range(100) if random_graph(s, n_ops=30).families["opaque:wrapped"]), n_ops=30)
    traced = fx.GraphModule(g.gm, fx.Tracer(autowrap_functions=(opaque_mix,)).trace(g.gm))
    assert any(n.target is opaque_mix for n in traced.graph.nodes)
