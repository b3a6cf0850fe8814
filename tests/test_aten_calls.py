"""Batch norms, dropouts and in-place ops of ``torch.export`` graphs (``optimus_eqsat/aten_calls.py``):
written as the torch calls Dynamo traces, they run as the aten calls do, and an exported
multi-task model batches its experts in training and inference with eager's numerics."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from optimus_eqsat import optimize_graph
from optimus_eqsat.aten_calls import torch_calls
from tests.library_style import set_dropout
from tests.test_library_training import (
    _double,
    assert_same_steps,
    small_deepctr_mmoe,
    small_deepctr_ple,
    step_inputs,
    train,
)

ATEN = torch.ops.aten


def _exported(model: nn.Module, example: tuple[Any, ...]) -> torch.fx.GraphModule:
    return torch.export.export(model, example).module()


@pytest.mark.parametrize("training", [True, False])
def test_exported_norms_dropouts_and_inplace_ops_run_as_the_aten_calls(training: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4), nn.ReLU(inplace=True), nn.Dropout(0.0)).train(training)
    x = torch.randn(8, 6)
    exported = _exported(model, (x,))
    targets = {n.target for n in exported.graph.nodes}
    assert {ATEN.batch_norm.default, ATEN.relu_.default, ATEN.dropout.default} <= targets
    rewritten = torch_calls(copy.deepcopy(exported))
    targets = {n.target for n in rewritten.graph.nodes}
    assert {F.batch_norm, F.dropout, "relu_"} <= targets
    assert not {ATEN.batch_norm.default, ATEN.relu_.default, ATEN.dropout.default, ATEN.add_.Tensor} & targets
    assert ("add_" in targets) == training  # the count's increment, as Dynamo writes it
    torch.testing.assert_close(rewritten(x), exported(x), rtol=0, atol=0)
    for (name, theirs), (_, ours) in zip(exported.named_buffers(), rewritten.named_buffers()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0, msg=name)


def test_a_graph_without_those_calls_is_returned_as_it_is() -> None:
    exported = _exported(nn.Sequential(nn.Linear(3, 2), nn.ReLU()), (torch.randn(2, 3),))
    assert torch_calls(exported) is exported

    # a functional aten graph (what our post-grad pass sees): a mutated input written back by
    # copy_ stays as AOTAutograd wrote it
    def step(x: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        count.add_(1)
        return x.relu()

    functional = make_fx(torch.func.functionalize(step, remove="mutations_and_views"))(torch.randn(2), torch.zeros(()))
    assert ATEN.copy_.default in {n.target for n in functional.graph.nodes}
    assert torch_calls(functional) is functional


def _optimized(gm: torch.fx.GraphModule, example: tuple[Any, ...], mode: str) -> torch.fx.GraphModule:
    """The optimizer's program (GPU profile, kept even where not predicted faster)."""
    optimized = optimize_graph(gm, example, mode=mode, profile="h200", never_worse=False)
    report = optimized.meta["optimus_eqsat"]
    assert not report.fell_back, report.fallback_reason
    # the experts' norms and activations batch too (in-place ReLUs after the norms walled
    # them off: only some linears batched, 52 ops opaque as readers of mutated memory)
    assert {"batch-linear", "batch-elementwise"} <= set(report.batched), report.summary()
    assert report.launches_after < report.launches_before, report.summary()
    return optimized


MODELS = pytest.mark.parametrize("build", [small_deepctr_mmoe, small_deepctr_ple], ids=["deepctr.MMOE", "deepctr.PLE"])


@MODELS
def test_exported_experts_batch_and_train_as_eager(build: Any) -> None:
    """Linear -> BatchNorm1d -> ReLU(inplace) -> Dropout(0) experts, exported in training mode:
    two SGD steps through the optimized program equal the exported module's own."""
    model, _ = build(16)
    set_dropout(model, 0.0)
    inputs = step_inputs(build, 16)
    exported = _exported(model, inputs[0])
    want = train(copy.deepcopy(exported), inputs)
    ours = copy.deepcopy(exported)
    got = train(ours, inputs, _optimized(ours, inputs[0], "training"))
    exact = train(copy.deepcopy(model).double(), [_double(x) for x in inputs])  # (export asserts float32)
    assert_same_steps(got, want, exact=exact)


@MODELS
def test_exported_experts_batch_in_inference(build: Any) -> None:
    model, (x,) = build(16)
    exported = _exported(model.eval(), (x,))
    with torch.no_grad():
        want = exported(x)
        got = _optimized(exported, (x,), "inference")(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_exported_with_a_dynamic_batch_serves_every_batch_as_eager() -> None:
    """The serving path (docs/serving.md) on a model with batch norms and in-place ReLUs: export
    with a dynamic batch, optimize, export again; the re-exported program equals eager at batch
    sizes other than the example's."""
    model, (x,) = small_deepctr_mmoe(16)
    model.eval()
    batch = torch.export.Dim("batch", min=2, max=1024)
    exported = torch.export.export(model, (x,), dynamic_shapes=({0: batch},))
    optimized = _optimized(exported.module(), (x,), "inference")
    reexported = torch.export.export(optimized, (x,), dynamic_shapes=({0: batch},))
    for size in (5, 64):
        _, (other,) = small_deepctr_mmoe(size, seed=3)
        with torch.no_grad():
            torch.testing.assert_close(reexported.module()(other), model(other), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("never_worse", [True, False])  # the original kept, and our program
def test_the_optimized_exported_module_refuses_a_mode_switch_as_the_exported_one_does(never_worse: bool) -> None:
    # ep.module() raises on .train() / .eval() (its graph is one mode's); a GraphModule built
    # from its graph did not, and then silently ran the exported mode.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Dropout(0.0)).train()
    x = torch.randn(8, 6)
    exported = torch.export.export(copy.deepcopy(model), (x,)).module()
    optimized = optimize_graph(exported, (x,), never_worse=never_worse, raise_on_error=True)
    for switch in (optimized.eval, optimized.train):  # (a deepcopy of either allows it: torch's)
        with pytest.raises(NotImplementedError):
            switch()
    torch.testing.assert_close(optimized(x), model(x))
