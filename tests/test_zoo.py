"""The benchmark zoo: every model builds deterministically, runs forward and
backward, and traces with torch.fx.symbolic_trace and Dynamo (no graph breaks)
to the same outputs. Fast: scale 1, batch 4, no Inductor (see the slow test)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.zoo import ALL_MODELS, BIG_MODELS, BIG_ROWS, MODELS

BATCH = 4


def _flat(out: object) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _assert_same(got: object, want: object) -> None:
    for g, w in zip(_flat(got), _flat(want), strict=True):
        torch.testing.assert_close(g, w)


@pytest.fixture(params=sorted(MODELS), ids=str)
def spec(request):
    return MODELS[request.param]


def test_build_and_inputs_are_deterministic(spec):
    a, b = spec.build(seed=0), spec.build(seed=0)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), spec.build(seed=1).parameters()))
    for x, y in zip(spec.inputs(BATCH, 0), spec.inputs(BATCH, 0), strict=True):
        assert torch.equal(x, y)


def test_build_leaves_global_rng_alone(spec):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    spec.build()
    spec.inputs(BATCH, 0)
    assert torch.equal(torch.rand(3), expected)


def test_forward_backward(spec):
    model = spec.build()
    outs = _flat(model(*spec.inputs(BATCH, 0)))
    assert all(o.shape[0] == BATCH and torch.isfinite(o).all() for o in outs)
    assert spec.has_training
    sum(o.sum() for o in outs).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def test_symbolic_trace_matches_eager(spec):
    model = spec.build()
    inputs = spec.inputs(BATCH, 0)
    gm = torch.fx.symbolic_trace(model)
    _assert_same(gm(*inputs), model(*inputs))


def test_dynamo_traces_one_graph(spec):
    model = spec.build()
    inputs = spec.inputs(BATCH, 0)
    graphs: list[torch.fx.GraphModule] = []

    def capture(gm, _example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(model, backend=capture, fullgraph=True)(*inputs)
    torch._dynamo.reset()
    assert len(graphs) == 1
    _assert_same(out, model(*inputs))


def test_scale_grows_the_model(spec):
    small, big = spec.build(scale=1), spec.build(scale=2)
    assert sum(p.numel() for p in big.parameters()) > sum(p.numel() for p in small.parameters())
    big(*spec.inputs(2, 0, scale=2))  # inputs follow the scale


def test_dynamic_schema_feature_count():
    from benchmarks.zoo.dynamic_schema import DynamicSchema

    assert len(DynamicSchema(num_features=37).features) == 37
    assert len(MODELS["dynamic_schema"].build(scale=3).features) == 60


@pytest.mark.slow
def test_inductor_compiles_forward_backward(spec, request):
    """torch.compile (Inductor, CPU) matches eager in training; minutes in total,
    so it runs only when selected with ``-m slow``."""
    if "slow" not in (request.config.option.markexpr or ""):
        pytest.skip("Inductor compile of every model: run with -m slow")
    model = spec.build()
    inputs = spec.inputs(BATCH, 0)
    torch._dynamo.reset()
    compiled = torch.compile(model)
    _assert_same(compiled(*inputs), model(*inputs))
    sum(o.sum() for o in _flat(compiled(*inputs))).backward()
    torch._dynamo.reset()


# --- the big-table variants: built on the meta device (no memory), or with few rows ---


def test_big_variants_have_big_tables_reached_by_the_rows_parameter():
    assert set(BIG_MODELS) == {"dlrm_big", "dcnv2_big", "deepfm_big", "mmoe_big"}
    assert not set(BIG_MODELS) & set(MODELS)  # out of the default test paths
    for name, spec in BIG_MODELS.items():
        assert spec.rows == BIG_ROWS >= 100_000 and ALL_MODELS[name] is spec
        with torch.device("meta"):
            model = spec.build()
        tables = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
        assert tables and all(t.num_embeddings == BIG_ROWS for t in tables), name


def test_big_variant_inputs_index_the_whole_table_range():
    for spec in BIG_MODELS.values():
        sparse = [x for x in spec.inputs(batch=2048, seed=0) if not x.is_floating_point()][0]
        assert 0 <= int(sparse.min()) < BIG_ROWS // 100 and BIG_ROWS * 0.99 < int(sparse.max()) < BIG_ROWS


def test_with_rows_builds_runnable_models_of_any_table_size():
    for name in ("dlrm", "dcnv2", "deepfm", "mmoe", "ple"):
        spec = MODELS[name].with_rows(37)
        model = spec.build()
        assert {m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)} == {37}
        inputs = spec.inputs(BATCH, 0)
        assert max(int(x.max()) for x in inputs if not x.is_floating_point()) < 37
        _flat(model(*inputs))
    with pytest.raises(ValueError):
        MODELS["transformer"].with_rows(10)
