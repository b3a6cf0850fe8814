"""Batch norms and dropouts that ``torch.fx.symbolic_trace`` keeps module calls
(``optimus_eqsat/module_calls.py``): written as the functional calls Dynamo traces, they run
as the modules do, and a traced multi-task model batches its experts in training and in
inference as its Dynamo graph does, with eager's numerics."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.fx import symbolic_trace

from optimus_eqsat import optimize_graph
from optimus_eqsat.module_calls import functional_module_calls
from tests.library_style import set_dropout
from tests.test_library_training import (
    Step,
    _double,
    assert_same_steps,
    small_deepctr_mmoe,
    small_deepctr_ple,
    step_inputs,
    train,
)


def _module_calls(gm: torch.fx.GraphModule) -> list[type]:
    return [type(gm.get_submodule(str(n.target))) for n in gm.graph.nodes if n.op == "call_module"]


def _layer(norm: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 4), norm, nn.ReLU(), nn.Dropout(0.0))


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize(
    "norm, shape",
    [
        (nn.BatchNorm1d(4), (8, 6)),
        (nn.BatchNorm1d(4, momentum=0.3, eps=1e-3), (8, 6)),
        (nn.BatchNorm1d(4, affine=False), (8, 6)),
        (nn.BatchNorm1d(4, track_running_stats=False), (8, 6)),
        (nn.BatchNorm1d(5), (8, 5, 6)),  # (batch, channels, length)
    ],
)
def test_traced_norms_and_dropouts_run_as_their_modules(norm: nn.Module, shape: tuple, training: bool) -> None:
    model = _layer(norm).train(training)
    x = torch.randn(shape)
    with torch.no_grad():  # running statistics that are not the initial ones
        model[1].train()(model[0](x))
    model.train(training)
    rewritten = functional_module_calls(symbolic_trace(copy.deepcopy(model)), (x,))
    assert _module_calls(rewritten) == [nn.Linear, nn.ReLU]
    targets = {n.target for n in rewritten.graph.nodes}
    assert F.batch_norm in targets and F.dropout in targets
    assert all("val" in n.meta for n in rewritten.graph.nodes if n.op != "output")
    want = model(x)
    got = rewritten(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for (name, theirs), (_, ours) in zip(model.named_buffers(), rewritten.named_buffers()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0, msg=name)


def test_calls_the_functional_form_would_change_stay_module_calls() -> None:
    class OwnNorm(nn.BatchNorm1d):  # a subclass may do anything in its forward
        pass

    class LeafNorms(torch.fx.Tracer):  # (symbolic_trace would trace into the subclass)
        def is_leaf_module(self, m: nn.Module, qualified_name: str) -> bool:
            return isinstance(m, nn.BatchNorm1d) or super().is_leaf_module(m, qualified_name)

    x = torch.randn(8, 6)
    model = _layer(OwnNorm(4)).train()
    rewritten = functional_module_calls(torch.fx.GraphModule(model, LeafNorms().trace(model)), (x,))
    assert _module_calls(rewritten) == [nn.Linear, OwnNorm, nn.ReLU]  # (the dropout rewritten)
    # momentum=None: the factor is 1 / count, read at run time, which no fake run can read
    # either: the graph is left whole, and the run for its meta leaves the count alone
    model = _layer(nn.BatchNorm1d(4, momentum=None)).train()
    gm = torch.fx.GraphModule(model, LeafNorms().trace(model))
    assert functional_module_calls(gm, (x,)) is gm
    assert model[1].num_batches_tracked.item() == 0 and not model[1].running_mean.any()
    # a norm the module's own check would reject (rank 4 for BatchNorm1d): eager raises there
    gm = symbolic_trace(nn.Sequential(nn.BatchNorm1d(3)).train())
    assert functional_module_calls(gm, (torch.randn(2, 3, 4, 4),)) is gm
    # no example inputs and no meta: no shapes to rewrite by
    gm = symbolic_trace(_layer(nn.BatchNorm1d(4)))
    assert functional_module_calls(gm, None) is gm


# (torch-rechub's models branch on their inputs' ranks in Python: symbolic_trace cannot trace them)
MODELS = pytest.mark.parametrize("build", [small_deepctr_mmoe, small_deepctr_ple], ids=["deepctr.MMOE", "deepctr.PLE"])


def _optimized_trace(model: nn.Module, example: tuple[Any, ...], mode: str) -> torch.fx.GraphModule:
    """The optimizer's program for ``model`` traced by ``symbolic_trace`` (GPU profile, kept even
    where not predicted faster, so its rewrites are what runs)."""
    optimized = optimize_graph(symbolic_trace(model), example, mode=mode, profile="h200", never_worse=False)
    report = optimized.meta["optimus_eqsat"]
    assert not report.fell_back, report.fallback_reason
    assert any(kind == "batch-linear" for kind in report.batched), report.summary()
    assert report.launches_after < report.launches_before, report.summary()
    return optimized


@MODELS
def test_traced_experts_batch_and_train_as_eager(build: Any) -> None:
    """Every expert layer Linear -> BatchNorm1d -> ReLU -> Dropout(0): two SGD steps through the
    optimized trace equal eager's (outputs, gradients, running statistics and counts)."""
    model, _ = build(16)
    set_dropout(model, 0.0)
    inputs = step_inputs(build, 16)
    want = train(copy.deepcopy(model), inputs)
    ours = copy.deepcopy(model)
    got: list[Step] = train(ours, inputs, _optimized_trace(ours, inputs[0], "training"))
    exact = train(copy.deepcopy(model).double(), [_double(x) for x in inputs])
    assert_same_steps(got, want, exact=exact)


@MODELS
def test_traced_experts_batch_in_inference(build: Any) -> None:
    model, (x,) = build(16)
    model.eval()
    with torch.no_grad():
        want = model(x)
        got = _optimized_trace(model, (x,), "inference")(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


class _NormedColumns(nn.Module):
    """A batch norm's output returned as a stack of its length columns: eager returns a fresh
    contiguous tensor, the optimizer's program a permuted view of the norm's output."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        columns = (self.bn(x) * 2).split(1, dim=2)
        return torch.stack([columns[k].squeeze(2) for k in range(3)], 0)


@pytest.mark.parametrize("training", [True, False])
def test_outputs_keep_the_layout_eager_returns_after_the_calls_are_written_out(training: bool) -> None:
    # The written-out calls carry fake meta the traced graph lacked; the rebuild copied it onto
    # the new output, a view, which then passed for the contiguous stack it replaced.
    torch.manual_seed(0)
    model, x = _NormedColumns().train(training), torch.randn(8, 4, 3)
    optimized = optimize_graph(symbolic_trace(copy.deepcopy(model)), (x,), raise_on_error=True, never_worse=False)
    assert "stack" not in {getattr(n.target, "__name__", n.target) for n in optimized.graph.nodes}
    got, expected = optimized(x), model(x)
    assert expected.is_contiguous() and got.is_contiguous()
    torch.testing.assert_close(got, expected)


def test_the_optimized_module_keeps_the_state_dict_keys_of_the_traced_one() -> None:
    # An eval-mode norm written out as F.batch_norm no longer reads num_batches_tracked, and a
    # GraphModule keeps only what its graph reads: a checkpoint of the model must still load.
    model = _layer(nn.BatchNorm1d(4)).eval()
    x = torch.randn(8, 6)
    for traced in (symbolic_trace(copy.deepcopy(model)), torch.export.export(copy.deepcopy(model), (x,)).module()):
        optimized = optimize_graph(traced, (x,), raise_on_error=True, never_worse=False)
        assert "1.num_batches_tracked" not in {str(n.target) for n in optimized.graph.nodes}
        assert set(optimized.state_dict()) == set(model.state_dict())
        optimized.load_state_dict(model.state_dict())  # strict
        assert optimized.get_buffer("1.num_batches_tracked") is traced.get_buffer("1.num_batches_tracked")
        torch.testing.assert_close(optimized(x), model(x))


@pytest.mark.parametrize("training", [True, False])
def test_a_module_optimized_in_one_mode_refuses_the_other(training: bool) -> None:
    # Its norms and dropouts are written for the mode it was traced in; the traced module calls
    # followed .train() / .eval(), so switching must raise, not run the other mode's program.
    model = _layer(nn.BatchNorm1d(4)).train(training)
    x = torch.randn(8, 6)
    optimized = optimize_graph(symbolic_trace(copy.deepcopy(model)), (x,), raise_on_error=True, never_worse=False)
    assert not optimized.meta["optimus_eqsat"].fell_back
    torch.testing.assert_close(optimized(x), model(x))
    for switched in (copy.deepcopy(optimized).train(not training), optimized.train(not training)):
        with pytest.raises(RuntimeError, match=f"optimized with 1 in {'training' if training else 'eval'} mode"):
            switched(x)
    optimized.train(training).get_submodule("1").train(not training)  # the norm alone
    with pytest.raises(RuntimeError, match="optimized with 1 in"):
        optimized(x)
    optimized.train(training)
    torch.testing.assert_close(torch.compile(optimized, backend="eager")(x), model(x))


def test_module_calls_left_in_place_follow_the_mode() -> None:
    torch.manual_seed(0)  # the norm is left a module call (see above); no dropout is written out
    model = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4, momentum=None), nn.ReLU()).train()
    x = torch.randn(8, 6)
    optimized = optimize_graph(symbolic_trace(copy.deepcopy(model)), (x,), raise_on_error=True, never_worse=False)
    torch.testing.assert_close(optimized.eval()(x), model.eval()(x))


def test_optimizing_leaves_the_module_state_as_it_was() -> None:
    # A norm left a module call beside one written out: the rebuilt program, given fake meta,
    # runs that module's real forward on fake inputs, which counted a batch on the real model.
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(6, 4), nn.BatchNorm1d(4, momentum=None), nn.ReLU(), nn.Linear(4, 4), nn.BatchNorm1d(4)
    ).train()
    x = torch.randn(8, 6)
    traced = symbolic_trace(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    optimized = optimize_graph(traced, (x,), raise_on_error=True, never_worse=False)
    assert "1" in {str(n.target) for n in optimized.graph.nodes if n.op == "call_module"}
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), key
