"""Batching embedding lookups into tables of one width: one lookup into the tables
concatenated along rows, with shifted indices; forward and gradients (inputs and every
table) against eager. The tables' concatenation is a per-step copy of every table unless
parameters are frozen, so the kind is built only for frozen inference (the fixture below);
the last test checks that it is not built otherwise."""

from __future__ import annotations

import pytest
import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

from optimus_eqsat import optimize_graph
from optimus_eqsat.api import OptimizationRun, OptimizeOptions
from tests.helpers import assert_same_numerics

ROWS = (10, 7, 13, 5)


class Lookups(nn.Module):
    """Per-field lookups (separate index inputs, as features arrive), concatenated."""

    def __init__(self, dim: int = 4, **flags):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(r, dim, **flags) for r in ROWS)

    def forward(self, i0, i1, i2, i3):
        idx = (i0, i1, i2, i3)
        return torch.cat([self.tables[t](idx[t]) for t in range(len(ROWS))], dim=1)


MANY = 12  # more than 8 cat inputs: Inductor's GPU cat is a ConcatKernel, each lookup its own kernel


class ManyLookups(nn.Module):
    """Twelve tables of one width read by columns of one index tensor, then concatenated."""

    def __init__(self):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(5 + t, 4) for t in range(MANY))

    def forward(self, idx):
        cols = torch.unbind(idx, dim=1)
        return torch.cat([self.tables[t](cols[t]) for t in range(MANY)], dim=1)


class Pooled(nn.Module):
    """DeepFM's first-order term: width-1 tables, sum-pooled over bags of one index block."""

    def __init__(self):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(r, 1) for r in ROWS)

    def forward(self, sparse, dense):
        per_table = torch.unbind(sparse, dim=1)
        pooled = [self.tables[t](per_table[t]).sum(dim=1) for t in range(len(ROWS))]
        return torch.cat(pooled, dim=1) * dense


FROZEN = {"mode": "inference"}  # with Inductor's freezing on (the fixture): parameters are constants


@pytest.fixture(autouse=True)
def _frozen_parameters(request):
    if request.node.get_closest_marker("unfrozen"):
        yield
        return
    with torch._inductor.config.patch(freezing=True):
        yield


def indices(batch: int = 3, bag: int | None = None, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    shape = (batch,) if bag is None else (batch, bag)
    return tuple(torch.randint(0, r, shape, generator=g) for r in ROWS)


def assert_same_table_grads(model: nn.Module, optimized: torch.nn.Module, inputs: tuple) -> None:
    """Gradients reaching every parameter (the tables) agree with eager."""
    params = list(model.parameters())

    def outputs(fn):
        out = fn(*inputs)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    seeds = [torch.randn_like(o) for o in outputs(model)]
    expected = torch.autograd.grad(outputs(model), params, seeds)
    got = torch.autograd.grad(outputs(optimized), params, seeds, allow_unused=True)
    for e, g in zip(expected, got):
        assert g is not None
        torch.testing.assert_close(g, e)


def optimize(model: nn.Module, inputs: tuple, **options) -> torch.fx.GraphModule:
    gm = torch.fx.symbolic_trace(model)
    optimized = optimize_graph(gm, inputs, raise_on_error=True, **FROZEN, **options)
    assert_same_numerics(model, optimized, inputs)
    assert_same_table_grads(model, optimized, inputs)
    return optimized


def lookups(gm: torch.fx.GraphModule) -> int:
    return sum(
        1
        for n in gm.graph.nodes
        if n.target is F.embedding or (n.op == "call_module" and isinstance(gm.get_submodule(n.target), nn.Embedding))
    )


def launch_count_cost(c, node):
    """Every lookup one launch; index shifts ride along in fused kernels; views, cats free."""
    if node.ctor in ("Leaf", "Slice", "Reshape", "Permute", "Expand", "TNil", "TCons", "Cat"):
        return 0.0 if node.ctor == "Leaf" else 1e-6
    elementwise = node.ctor in ("Unary", "Binary", "Scalar") or str(node.args[0]).startswith("shift_segments")
    return 0.1 if elementwise else 1.0


@pytest.mark.parametrize("bag", [None, 2])
def test_batched_lookup_is_correct(bag):
    """The batched alternative itself (forced by a launch-count cost): one lookup, same values
    and the same gradient for every table."""
    model, inputs = Lookups(), indices(bag=bag)
    run = OptimizationRun(torch.fx.symbolic_trace(model), inputs, OptimizeOptions(raise_on_error=True, **FROZEN))
    run.saturate()
    run.extract(cost=launch_count_cost)
    program = run.build()
    assert run.report.batched.get("batch-embedding") == len(ROWS)
    assert lookups(program) == 1, program.code
    assert_same_numerics(model, program, inputs)
    assert_same_table_grads(model, program, inputs)


def test_lookups_are_batched_on_gpu():
    """Four lookups feeding one cat are already one GPU kernel (a pointwise cat absorbs
    them), so nothing is batched; twelve are twelve kernels (a ConcatKernel), and the
    batched lookup (tables' cat, index cat + shift, one gather) is fewer."""
    few = optimize(Lookups(), indices(bag=3), profile="h100")
    assert lookups(few) == len(ROWS) and few.meta["optimus_eqsat"].launches_before == 1
    idx = torch.stack(
        [torch.randint(0, 5 + t, (3,), generator=torch.Generator().manual_seed(t)) for t in range(MANY)], dim=1
    )
    many = optimize(ManyLookups(), (idx,), profile="h100")
    report = many.meta["optimus_eqsat"]
    assert report.batched.get("batch-embedding") == MANY
    assert lookups(many) == 1, many.code
    assert report.launches_after < report.launches_before


def test_pooled_lookups_batch_with_their_pooling():
    """Sum-pooled lookups whose indices are slices of one block (frozen tables): the batched
    lookup pays only with its pooling batched too (one gather and one sum of the stack, which
    Inductor fuses with the index shift: one kernel); a lookup batched alone, its sums apart,
    would not."""
    model = Pooled()
    inputs = (torch.stack(indices(bag=3), dim=1), torch.randn(3, len(ROWS)))
    optimized = optimize(model, inputs, profile="h100")
    report = optimized.meta["optimus_eqsat"]
    assert report.batched.get("batch-embedding") == len(ROWS)
    assert report.batched.get("batch-reduction") == len(ROWS)
    assert lookups(optimized) == 1, optimized.code
    sums = [n for n in optimized.graph.nodes if n.op == "call_method" and n.target == "sum"]
    assert len(sums) == 1, optimized.code
    assert report.launches_after < report.launches_before


@pytest.mark.parametrize("flags", [{"padding_idx": 0}, {"scale_grad_by_freq": True}, {"max_norm": 1.0}])
def test_tables_with_flags_keep_their_own_lookup(flags):
    model, inputs = Lookups(**flags), indices()
    gm = torch.fx.symbolic_trace(model)
    optimized = optimize_graph(gm, inputs, raise_on_error=True, profile="h100", **FROZEN)
    assert not optimized.meta["optimus_eqsat"].batched.get("batch-embedding")
    assert lookups(optimized) == len(ROWS)
    if "max_norm" not in flags:  # max_norm renormalizes the tables in place: not replayable
        assert_same_numerics(model, optimized, inputs)
        assert_same_table_grads(model, optimized, inputs)


def test_tables_of_other_widths_are_separate_groups():
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.tables = nn.ModuleList(nn.Embedding(r, 4 if t % 2 else 3) for t, r in enumerate(ROWS))

        def forward(self, i0, i1, i2, i3):
            idx = (i0, i1, i2, i3)
            return tuple(self.tables[t](idx[t]) for t in range(len(ROWS)))

    model, inputs = Mixed(), indices()
    run = OptimizationRun(torch.fx.symbolic_trace(model), inputs, OptimizeOptions(raise_on_error=True, **FROZEN))
    run.saturate()
    assert run.report.batched.get("batch-embedding") == len(ROWS)
    assert len(run.batches.outputs["batch-embedding"]) == 2
    run.extract(cost=launch_count_cost)
    program = run.build()
    assert lookups(program) == 2
    assert_same_numerics(model, program, inputs)
    assert_same_table_grads(model, program, inputs)


def test_dynamo_graph_functional_embedding():
    model = ManyLookups()
    inputs = (
        torch.stack(
            [torch.randint(0, 5 + t, (3,), generator=torch.Generator().manual_seed(t)) for t in range(MANY)], dim=1
        ),
    )
    captured = []

    def backend(gm, example_inputs):
        captured.append((gm, list(example_inputs)))
        return gm

    torch._dynamo.reset()
    torch.compile(model, backend=backend, fullgraph=True)(*inputs)
    gm, example = captured[0]
    assert sum(1 for n in gm.graph.nodes if n.target is F.embedding) == MANY
    optimized = optimize_graph(gm, example, profile="h100", raise_on_error=True, **FROZEN)
    assert optimized.meta["optimus_eqsat"].batched.get("batch-embedding") == MANY
    assert sum(1 for n in optimized.graph.nodes if n.target is F.embedding) == 1
    # the tables are graph inputs here: their gradients are compared too
    assert_same_numerics(gm, optimized, tuple(t.detach() for t in example))


@pytest.mark.unfrozen
@pytest.mark.parametrize("mode", ["training", "inference"])
def test_tables_are_never_copied_per_step_when_parameters_are_not_frozen(mode):
    """Without freezing the tables' concatenation would copy every table on every step:
    the lookups stay apart (Inductor fuses them into its generated code anyway)."""
    idx = torch.stack(
        [torch.randint(0, 5 + t, (3,), generator=torch.Generator().manual_seed(t)) for t in range(MANY)], dim=1
    )
    gm = torch.fx.symbolic_trace(ManyLookups())
    optimized = optimize_graph(gm, (idx,), raise_on_error=True, profile="h100", mode=mode)
    assert not optimized.meta["optimus_eqsat"].batched.get("batch-embedding")
    assert lookups(optimized) == MANY
    assert not any(
        n.target is torch.cat and any(a.op == "get_attr" for a in n.args[0])
        for n in optimized.graph.nodes
        if n.op == "call_function"
    )
