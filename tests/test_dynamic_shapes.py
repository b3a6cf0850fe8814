"""Symbolic sizes: graphs compiled with a dynamic dim are optimized as with static shapes,
never specialized to the example's size, and match eager at other sizes.

Most graphs run eagerly through ``make_backend(inductor=False)``. Dynamo is asked to
specialize floats: under ``dynamic=True`` it first lifts float attributes (a layer
norm's eps) to tensor inputs, and Inductor restarts the trace with them specialized,
so that second graph is what our backend optimizes on the Inductor path
(``test_inductor_path_optimizes_the_restarted_graph`` checks it).
"""

from __future__ import annotations

import pytest
import sympy
import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch._dynamo.utils import counters
from torch.fx.experimental.symbolic_shapes import free_symbols

from optimus_eqsat import optimize_graph
from optimus_eqsat.backend import make_backend
from optimus_eqsat.extract.fx_cost import predict_kernels
from optimus_eqsat.fxvocab.symbolic import SYMBOL_BASE, SymbolicSizes, is_symbolic
from optimus_eqsat.kernels.batched_ops import shift_rows
from optimus_eqsat.objective import Objective, predict
from tests.helpers import assert_same_numerics
from tests.models import SplitTowers

BATCHES = (1, 7, 256)


def _compile(model, *inputs, dynamic=True, mark=(), **options):
    """Compile through our eager backend and run once on ``inputs`` (``mark``: (input, dim) pairs to
    mark dynamic); returns the compiled callable and the backend (its reports)."""
    backend = make_backend(inductor=False, **options)
    # as assert_same_numerics calls it (float inputs require grad): no recompile for that
    inputs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    for k, d in mark:
        torch._dynamo.mark_dynamic(inputs[k], d)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    compiled(*inputs)
    return compiled, backend


def _capture(model, *inputs, dynamic=True, mark=()):
    """Dynamo's graph and example inputs, unoptimized."""
    captured = []

    def capture(gm, example_inputs):
        captured.append((gm, example_inputs))
        return gm

    for k, d in mark:
        torch._dynamo.mark_dynamic(inputs[k], d)
    torch._dynamo.reset()
    torch.compile(model, backend=capture, dynamic=dynamic, fullgraph=True)(*inputs)
    return captured[0]


def _shape_env(gm):
    for n in gm.graph.nodes:
        value = n.meta.get("example_value")
        if isinstance(value, torch.Tensor) and value.fake_mode.shape_env is not None:
            return value.fake_mode.shape_env
    raise AssertionError("no shape environment")


@pytest.fixture(autouse=True)
def _specialized_floats():
    with torch._dynamo.config.patch(specialize_float=True):
        yield
    torch._dynamo.reset()


# ---------------------------------------------------------------- the six-tower model


def test_six_towers_shrink_under_dynamic_true_as_under_static_shapes():
    model = SplitTowers(towers=6, width=8)
    x = torch.randn(16, 48)
    _, static = _compile(model, x, dynamic=False)
    _, dynamic = _compile(model, x, dynamic=True)
    s, d = static.reports[0], dynamic.reports[0]
    assert not d.fell_back and d.nodes_before == s.nodes_before == 27
    assert d.nodes_after == s.nodes_after < 20
    assert (d.launches_before, d.launches_after) == (s.launches_before, s.launches_after)
    assert d.batched == s.batched and "batch-linear" in d.batched
    assert not any("symbolic" in why for why in d.opaque_nodes.values())


def test_six_towers_match_eager_at_other_batch_sizes_without_recompiling():
    model = SplitTowers(towers=6, width=8)
    compiled, backend = _compile(model, torch.randn(16, 48))
    for batch in (7, 256, 300):
        assert_same_numerics(model, compiled, (torch.randn(batch, 48),))
    assert len(backend.reports) == 1  # one compile for every batch size >= 2
    assert_same_numerics(model, compiled, (torch.randn(1, 48),))  # Dynamo's 0/1 specialization: one more


def test_automatic_dynamic_shapes_after_a_second_batch_size():
    """Dynamo's default: static at the first size, a symbolic batch from the second on."""
    model = SplitTowers(towers=6, width=8)
    compiled, backend = _compile(model, torch.randn(16, 48), dynamic=None)
    for batch in (7, 300, 64):
        assert_same_numerics(model, compiled, (torch.randn(batch, 48),))
    static, dynamic = backend.reports  # one recompile, at 7; none after it
    assert not dynamic.fell_back and dynamic.nodes_after == static.nodes_after < 20
    assert (dynamic.launches_before, dynamic.launches_after) == (static.launches_before, static.launches_after)


def test_optimizing_adds_no_guard_and_writes_no_example_size():
    model = SplitTowers(towers=6, width=8)
    gm, example_inputs = _capture(model, torch.randn(16, 48))
    env = _shape_env(gm)
    guards, replacements = len(env.guards), dict(env.replacements)
    optimized = optimize_graph(gm, example_inputs, raise_on_error=True)
    assert len(env.guards) == guards and env.replacements == replacements
    assert optimized.meta["optimus_eqsat"].nodes_after < 20
    for node in optimized.graph.nodes:  # the example's batch (16) is written nowhere: -1 or read at run time
        constants = [a for a in pytree.tree_leaves((node.args, node.kwargs)) if type(a) is int]
        assert 16 not in constants, node.format_node()
    # new nodes carry fake values as Dynamo's own do (Inductor's passes read them), symbolic where x is
    old = {n.name for n in gm.graph.nodes}
    new = [n for n in optimized.graph.nodes if n.op == "call_function" and n.name not in old]
    assert new and all(isinstance(n.meta.get("example_value"), torch.Tensor) for n in new)
    assert any(free_symbols(n.meta["example_value"]) for n in new)


def test_padded_linear_batches_add_no_guard():
    """dynamic_schema's ragged linears batch through F.pad, whose C++ kernel reads concrete
    sizes: the meta of the rebuilt graph is propagated as Dynamo traces (Python dispatcher),
    so no guard specializes the batch."""
    from benchmarks.zoo import MODELS

    spec = MODELS["dynamic_schema"]
    gm, example_inputs = _capture(spec.build(), *spec.inputs(16, 0), dynamic=None, mark=[(0, 0), (1, 0)])
    env = _shape_env(gm)
    guards, replacements = len(env.guards), dict(env.replacements)
    optimized = optimize_graph(gm, example_inputs, raise_on_error=True, profile="h100")
    assert optimized.meta["optimus_eqsat"].batched.get("batch-linear_padk")
    assert any(n.target is torch.nn.functional.pad for n in optimized.graph.nodes)
    assert len(env.guards) == guards and env.replacements == replacements


def test_cost_model_prices_symbolic_sizes_at_their_hint():
    """The same kernels at the same prices; the step differs only by the SymInt input Dynamo passes."""
    model = SplitTowers(towers=6, width=8)
    x = torch.randn(16, 48)
    static = _capture(model, x, dynamic=False)
    dynamic = _capture(model, x, dynamic=True)
    kernels_s, kernels_d = (predict_kernels(*g, "h100") for g in (static, dynamic))
    assert [(k.kind, k.bytes_moved, k.flops) for k in kernels_d] == [
        (k.kind, k.bytes_moved, k.flops) for k in kernels_s
    ]
    assert [k.seconds for k in kernels_d] == pytest.approx([k.seconds for k in kernels_s], rel=1e-9)
    objective = Objective.resolve("h100", "inference", *static)
    (launches_s, cost_s), (launches_d, cost_d) = (predict(*g, objective) for g in (static, dynamic))
    symints = sum(isinstance(v, torch.SymInt) for v in dynamic[1])
    assert launches_d == launches_s and cost_d == pytest.approx(cost_s + symints * objective.profile.input_s)
    s, d = (optimize_graph(*g, raise_on_error=True, profile="h100").meta["optimus_eqsat"] for g in (static, dynamic))
    assert (d.launches_before, d.launches_after) == (s.launches_before, s.launches_after)
    assert d.cost_after - d.cost_before == pytest.approx(s.cost_after - s.cost_before)


@pytest.mark.slow
def test_inductor_path_optimizes_the_restarted_graph(request):
    """Inductor (CPU) under dynamic=True with Dynamo's default floats: the first graph (eps as
    tensors) restarts, the second is optimized like the static one; no recompile at 7 or 300."""
    if "slow" not in (request.config.option.markexpr or ""):
        pytest.skip("Inductor compiles forward and backward: run with -m slow")
    model = SplitTowers(towers=6, width=8)
    backend = make_backend(measure=False)
    with torch._dynamo.config.patch(specialize_float=False):
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(model, backend=backend, dynamic=True)
        for batch in (16, 7, 300):
            assert_same_numerics(model, compiled, (torch.randn(batch, 48),))
    assert counters["stats"]["unique_graphs"] == 1
    last = backend.reports[-1]
    assert not last.fell_back and last.nodes_after < 20


# ---------------------------------------------------------------- graphs that use the symbolic dim itself


def _slices_the_batch(x, y):
    both = torch.cat([x, y], dim=0)  # (2*s0, 16): a cat along the symbolic dim
    rows = both.view(-1, 2, 8)  # a reshape that keeps the symbolic dim whole
    head = x[:3]  # a slice of the symbolic dim: stays opaque
    middle = x.narrow(0, 1, 2)
    parts = torch.split(x, 4, dim=1)  # splits of a concrete dim still rewrite
    scaled = torch.cat([torch.relu(p) for p in parts], dim=1)
    flat = rows.transpose(0, 1).reshape(2, -1)  # merges the symbolic dim with another
    return scaled * 2 + both[: x.shape[0]], head.sum() + middle.sum() + flat.sum(1).sum()


@pytest.mark.parametrize("every_dim", [False, True], ids=["batch_dim", "dynamic_true"])
def test_a_graph_that_slices_and_reshapes_the_symbolic_dim_keeps_working(every_dim):
    """Marked batch dims: slices of them stay opaque, the split of the static dim rewrites.
    dynamic=True: every dim is symbolic (the split too stays opaque), and the reshape's
    sizes (2*s0, s1//2) are computed from the inputs."""
    x, y = torch.randn(12, 16), torch.randn(12, 16)  # (not 16 rows: Dynamo would duck-size both dims as one)
    compiled, backend = _compile(
        _slices_the_batch, x, y, dynamic=True if every_dim else None, mark=[] if every_dim else [(0, 0), (1, 0)]
    )
    report = backend.reports[0]
    assert not report.fell_back
    assert {"head", "middle", "getitem_7"} <= {name for name, why in report.opaque_nodes.items() if "symbolic" in why}
    assert every_dim == ("split" in report.opaque_nodes)
    for batch in (7, 256):
        assert_same_numerics(_slices_the_batch, compiled, (torch.randn(batch, 16), torch.randn(batch, 16)))
    assert len(backend.reports) == 1


class SeqTowers(nn.Module):
    """Towers over the last dim of a (batch, seq, 48) input: the seq dim is the dynamic one."""

    def __init__(self, towers: int = 6, width: int = 8):
        super().__init__()
        self.width = width
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(towers))
        self.linears = nn.ModuleList(nn.Linear(width, width) for _ in range(towers))

    def forward(self, x):
        parts = torch.split(x, self.width, dim=-1)
        outs = [torch.tanh(self.linears[k](self.norms[k](parts[k]))) for k in range(len(self.norms))]
        return torch.cat(outs, dim=-1).view(x.shape[0], x.shape[1], 6, 8).sum(2)


def test_mark_dynamic_on_a_non_batch_dim():
    model = SeqTowers()
    x = torch.randn(4, 10, 48)
    _, static = _compile(model, x, dynamic=None)
    compiled, dynamic = _compile(model, x.clone(), dynamic=None, mark=[(0, 1)])
    s, d = static.reports[0], dynamic.reports[0]
    assert not d.fell_back and (d.launches_before, d.launches_after) == (s.launches_before, s.launches_after)
    assert d.batched == s.batched and d.batched.get("batch-linear") == 6
    for seq in (3, 33):
        assert_same_numerics(model, compiled, (torch.randn(4, seq, 48),))
    assert len(dynamic.reports) == 1


def _two_inputs(x, y):
    return torch.relu(x) * 2, torch.relu(y) * 2


def test_batching_keys_compare_symbols():
    # two different symbols (s0, 16) and (s1, 16): never one batch
    gm, example_inputs = _capture(
        _two_inputs, torch.randn(16, 16), torch.randn(12, 16), dynamic=None, mark=[(0, 0), (1, 0)]
    )
    report = optimize_graph(gm, example_inputs, raise_on_error=True, profile="cpu").meta["optimus_eqsat"]
    assert not report.batched
    # one symbol (Dynamo duck-sizes equal sizes under dynamic=True): batched
    gm, example_inputs = _capture(_two_inputs, torch.randn(16, 16), torch.randn(16, 16))
    report = optimize_graph(gm, example_inputs, raise_on_error=True, profile="cpu").meta["optimus_eqsat"]
    assert report.batched.get("batch-elementwise") == 4


class Lookups(nn.Module):
    """Per-table pooled lookups of a (batch, tables, bag) index block, concatenated."""

    def __init__(self, tables: int = 5, rows: int = 50, dim: int = 4):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(tables))

    def forward(self, idx):
        per_table = torch.unbind(idx, dim=1)
        return torch.cat([t(per_table[k]).sum(1) for k, t in enumerate(self.tables)], dim=1)


def test_embedding_lookups_batch_with_a_symbolic_batch():
    """Frozen inference (the embedding kind's case): index sizes are symbolic, so the lookups
    stack their indices (shift_rows). The same kernels as the static (flat) batch; the stack
    is one view of the index block where the flat cat reads a view per table, so refine
    keeps it where it drops the static one."""
    model = Lookups().eval()
    idx = torch.randint(0, 50, (16, 5, 3))
    with torch._inductor.config.patch(freezing=True), torch.no_grad():
        static, dynamic = (
            optimize_graph(*_capture(model, idx, dynamic=d), raise_on_error=True, profile="cpu") for d in (False, True)
        )
        s, d = static.meta["optimus_eqsat"], dynamic.meta["optimus_eqsat"]
        assert d.batched == s.batched and d.batched.get("batch-embedding") == 5 and not d.dropped_batches
        assert (d.launches_before, d.launches_after) == (s.launches_before, s.launches_after)
        assert any(n.target is shift_rows for n in dynamic.graph.nodes)
        backend = make_backend(inductor=False, profile="cpu", refine_batches=False, never_worse=False)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=backend, dynamic=True)
        for batch in (16, 7, 256):
            x = torch.randint(0, 50, (batch, 5, 3))
            torch.testing.assert_close(compiled(x), model(x))
    assert len(backend.reports) == 1 and backend.reports[0].batched.get("batch-embedding") == 5


# ---------------------------------------------------------------- codes and size expressions


def test_symbolic_sizes_share_codes_for_provably_equal_expressions():
    gm, _ = _capture(SplitTowers(), torch.randn(16, 48))
    x = next(n.meta["example_value"] for n in gm.graph.nodes if n.name == "l_x_")
    batch = x.shape[0]
    sizes = SymbolicSizes()
    code = sizes.encode(batch)
    assert is_symbolic(code) and code == SYMBOL_BASE and sizes.hint(code) == 16
    assert sizes.encode(8) == 8 and sizes.encode_shape(x.shape) == (code, 48)
    s0 = batch.node.expr
    assert sizes.code(sympy.floor(s0**2 / s0), 16) == code  # Dynamo proves it equal: one code
    product = sizes.product((code, 6, 8))
    assert is_symbolic(product) and sizes.hint(product) == 16 * 48 and sizes.expr(product) == 48 * s0
    assert sizes.product((2, 3)) == 6
    assert sizes.hinted((code, 5)) == (16, 5)


def test_two_symbolic_sizes_in_one_reshape_are_read_from_the_inputs():
    def f(x):
        return torch.relu(x.view(x.shape[0], x.shape[1], 2, 8)) * 3

    x = torch.randn(5, 9, 16)
    gm, example_inputs = _capture(f, x.clone(), dynamic=None, mark=[(0, 0), (0, 1)])
    optimized = optimize_graph(gm, example_inputs, raise_on_error=True)
    reshapes = [n for n in optimized.graph.nodes if n.target in (torch.reshape, "view", "reshape")]
    assert reshapes and all(
        any(isinstance(a, torch.fx.Node) for a in n.args[1]) for n in reshapes if isinstance(n.args[1], (list, tuple))
    )
    compiled, backend = _compile(f, x, dynamic=None, mark=[(0, 0), (0, 1)])
    for shape in ((3, 4, 16), (11, 7, 16)):
        assert_same_numerics(f, compiled, (torch.randn(*shape),))
    assert len(backend.reports) == 1 and not backend.reports[0].fell_back


# ---------------------------------------------------------------- the zoo


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dlrm", "mmoe", "ple", "deepfm", "dcnv2", "transformer", "dynamic_schema"])
def test_zoo_with_a_dynamic_batch_matches_static_shapes(name, request):
    """Every zoo model with its batch dim marked dynamic: the same predicted launches and
    batches as with static shapes, no recompile at batch 7 and 256, and eager's outputs and
    gradients at 1, 7 and 256. About two minutes for all seven: run with -m slow."""
    if "slow" not in (request.config.option.markexpr or ""):
        pytest.skip("seven models, static and dynamic, three batch sizes: run with -m slow")
    from benchmarks.dynamic_sweep import sweep_model

    row = sweep_model(name, profile="cpu")
    assert row.fell_back is None
    assert row.dynamic_launches == row.static_launches and row.same_batches
    assert row.recompiles == 0
    assert set(row.max_diff) == set(BATCHES) and row.close, row.max_diff


def test_an_exported_program_with_a_dynamic_batch():
    """torch.export with a Dim: sizes come from the placeholders' meta["val"], and symbolic
    sizes are read back as x.size(0) (export graphs have no SymInt inputs)."""
    model = SplitTowers(towers=6, width=8).eval()
    x = torch.randn(16, 48)
    gm = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},)).module()
    optimized = optimize_graph(gm, raise_on_error=True)
    report = optimized.meta["optimus_eqsat"]
    assert report.nodes_after < report.nodes_before and report.launches_after < report.launches_before
    for batch in (3, 7, 256):
        y = torch.randn(batch, 48)
        torch.testing.assert_close(optimized(y), model(y))


class ChunkedTowers(nn.Module):
    """Linears on chunks of a dynamic dim: Dynamo's guards pin the chunk size ((s0 + 3)//4 == 1
    at width 3), and the optimizer would batch the linears along the pinned dim."""

    def __init__(self):
        super().__init__()
        self.towers = nn.ModuleList(nn.Linear(1, 2) for _ in range(4))

    def forward(self, x):
        pieces = torch.chunk(x, 4, -1)[1].narrow(1, 0, 1)
        return [t(-pieces[k : k + 1]) for k, t in enumerate(self.towers)]


def test_a_size_pinned_by_guards_declines_the_graph():
    """Such graphs are compiled as they are, also with raise_on_error (a decline, not a
    failure): their meta is inconsistent, and Inductor miscompiles a broadcast along a pinned
    dim, which batching along it would create."""
    model = ChunkedTowers()
    x = torch.randn(4, 2, 3)
    backend = make_backend(measure=False, profile="h100", raise_on_error=True)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for got, want in zip(compiled(x), model(x)):
            torch.testing.assert_close(got, want)
    reasons = [r.fallback_reason or "" for r in backend.reports]
    assert any("pinned" in r for r in reasons), reasons


def test_a_squared_symbolic_size_is_written_as_a_product():
    """Random graph 50 under dynamic=True flattens a square (its size is s0**2): the rebuild
    once failed to write a Pow and the whole graph fell back."""
    from tests.graphgen import random_graph

    generated = random_graph(50, opaque=False, inplace=False)
    backend = make_backend(measure=False, profile="h100", raise_on_error=True)
    torch._dynamo.reset()
    compiled = torch.compile(generated.gm, backend=backend, dynamic=True)
    with torch.no_grad():
        got, want = compiled(*generated.example_inputs), generated.gm(*generated.example_inputs)
    for g, w in zip(pytree.tree_leaves(got), pytree.tree_leaves(want)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * max(1.0, w.abs().max().item()))
    assert not any(r.fell_back for r in backend.reports), [r.fallback_reason for r in backend.reports]


class EmbeddedMLP(nn.Module):
    """Embeddings in a ModuleDict, then Linear -> BatchNorm1d -> ReLU: under dynamic=True with
    Dynamo's default floats, the embeddings' norm_type and the norm's momentum and eps reach
    the graph as 0-d float64 inputs read with ``.item()``."""

    def __init__(self):
        super().__init__()
        self.embed = nn.ModuleDict({f"f{i}": nn.Embedding(50, 8) for i in range(3)})
        self.mlp = nn.Sequential(nn.Linear(24, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, ids):
        return self.mlp(torch.cat([table(ids[:, k]) for k, table in enumerate(self.embed.values())], 1))


def test_floats_dynamo_lifted_to_tensors_run_through_the_shape_run():
    """Inside a compile (fake inputs) the run for shapes used to fail at their ``.item()`` (a
    data-dependent value of a fake tensor), and a graph with any node short of meta fell back;
    the value is the symbolic scalar Dynamo traced."""
    from optimus_eqsat.fxvocab.meta import record_shapes
    from optimus_eqsat.inductor_compat import lifted_float_inputs

    recorded = []

    def shape_run(gm, example_inputs):
        assert len(lifted_float_inputs(gm)) == 5  # three norm_types, the norm's momentum and eps
        recorded.append(record_shapes(gm, example_inputs))
        return gm

    with torch._dynamo.config.patch(specialize_float=False):
        torch._dynamo.reset()
        torch.compile(EmbeddedMLP(), backend=shape_run, dynamic=True)(torch.randint(0, 50, (32, 3)))
    (seen,) = recorded
    assert any(tuple(v.shape[1:]) == (16,) for v in seen.values() if isinstance(v, torch.Tensor))


def test_the_backend_leaves_a_graph_with_lifted_floats_to_inductors_restart():
    """On the Inductor path such a graph is re-traced with the floats specialized: the backend
    declines it at once (optimizing it would be wasted) and says why."""
    from optimus_eqsat.backend import OptimusBackend

    ids = torch.randint(0, 50, (32, 3))
    with torch._dynamo.config.patch(specialize_float=False):
        gm, inputs = _capture(EmbeddedMLP(), ids)
    backend = make_backend(measure=False, post_grad=False, recompute_masks=False)
    assert isinstance(backend, OptimusBackend)
    calls = []
    backend._compile_fx = lambda: lambda g, x, **kw: calls.append(g) or g  # no Inductor: the decision alone
    backend(gm, inputs)
    (report,) = backend.reports
    assert report.fell_back and "re-traces" in report.fallback_reason and report.phase_seconds == {}
    assert len(calls) == 1


class RoutedExperts(nn.Module):
    """Top-1 routed experts written as Mixtral's block writes them: each expert reads the rows
    ``torch.where`` routes to it (a data-dependent count) and adds its output back with
    ``index_add_``."""

    def __init__(self, dim: int = 8, n_experts: int = 3):
        super().__init__()
        self.gate = nn.Linear(dim, n_experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 16), nn.SiLU(), nn.Linear(16, dim)) for _ in range(n_experts)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, chosen = self.gate(x).softmax(-1).max(-1)
        out = torch.zeros_like(x)
        for k, expert in enumerate(self.experts):
            (rows,) = torch.where(chosen == k)
            out = out.index_add(0, rows, expert(x[rows]) * weight[rows, None])
        return out


def test_a_graph_with_data_dependent_sizes_is_declined():
    """Sizes Dynamo captured from data (``torch.where`` under ``capture_dynamic_output_shape_ops``)
    are unbacked symbols: a rebuilt graph's fake run would mint new ones the graph never binds
    (Inductor refuses it), so such a graph is declined, with the reason in the report."""
    torch.manual_seed(0)
    model = RoutedExperts()
    x = torch.randn(12, 8)
    backend = make_backend(measure=False, profile="h100", raise_on_error=True)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled = torch.compile(model, backend=backend, fullgraph=True)
        got = compiled(x)
    torch.testing.assert_close(got, model(x))
    reasons = [r.fallback_reason or "" for r in backend.reports]
    assert reasons and all("data-dependent" in r for r in reasons), reasons


def test_a_negated_size_stays_a_number():
    """``bias[:, -x.size(1):]`` (T5's and SwitchTransformers' position bias) negates a SymInt with
    ``operator.neg``; it was translated as the tensor op and rebuilt as ``torch.neg(s)``, which
    refuses a SymInt: the optimized graph failed to compile and the original was kept."""

    class PositionBias(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x, bias):
            b = bias[:, -x.size(1) :, :]
            return (self.q(x) + b).relu() + (self.k(x) * b).tanh()

    model = PositionBias()
    x, bias = torch.randn(4, 6, 16), torch.randn(1, 9, 16)
    gm, example_inputs = _capture(model, x, bias)
    optimized = optimize_graph(gm, example_inputs, raise_on_error=True)
    assert not optimized.meta["optimus_eqsat"].fell_back
    assert not any(n.target is torch.neg for n in optimized.graph.nodes)
    torch.testing.assert_close(optimized(*example_inputs)[0], model(x, bias))


def test_a_float_read_only_by_arithmetic_is_not_left_to_a_restart():
    """T5's RMS norm adds its epsilon to a tensor: Inductor turns that float into tensor
    arithmetic and restarts nothing, so skipping the graph for a restart optimized nothing."""
    from optimus_eqsat.inductor_compat import lifted_float_inputs

    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            self.eps = 1e-6
            self.experts = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))

        def forward(self, x):
            h = sum(torch.relu(e(x)) for e in self.experts)
            return h / (h.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()

    with torch._dynamo.config.patch(specialize_float=False):
        gm, _ = _capture(Experts(), torch.randn(8, 16))
    assert any(n.op == "placeholder" and "eps" in n.name for n in gm.graph.nodes)
    assert lifted_float_inputs(gm) == []
