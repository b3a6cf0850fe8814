"""Members' narrows of one tensor become one split: same values and gradients, one backward."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
import torch.fx as fx
from torch.fx.passes.shape_prop import ShapeProp

from optimus_eqsat import optimize_graph
from optimus_eqsat.fxvocab import canonical_name
from optimus_eqsat.member_splits import narrows_as_splits


def _traced(fn, *inputs: torch.Tensor) -> fx.GraphModule:
    """``fn`` traced, with shapes recorded (what the pass reads sizes from)."""
    gm = fx.symbolic_trace(fn)
    ShapeProp(gm).propagate(*inputs)
    return gm


def _names(gm: fx.GraphModule) -> list[str]:
    return [canonical_name(n) or str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _values_and_grads(gm: torch.nn.Module, *inputs: torch.Tensor) -> list[torch.Tensor]:
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out = gm(*leaves)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    sum(o.float().pow(2).sum() for o in outs).backward()
    return [o.detach() for o in outs] + [x.grad for x in leaves if x.grad is not None]


def _assert_same(a: torch.nn.Module, b: torch.nn.Module, *inputs: torch.Tensor) -> None:
    for x, y in zip(_values_and_grads(a, *inputs), _values_and_grads(b, *inputs), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def members(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batched product read by three members, columns 2-3 read by none (a gap)."""
    y = x @ w
    a = torch.narrow(y, 1, 0, 2).relu()
    b = torch.narrow(y, 1, 4, 3).sigmoid()
    c = torch.narrow(y, -1, 7, 1) * 2
    return a, b, c


def test_narrows_of_one_tensor_become_one_split_with_the_same_values_and_gradients() -> None:
    x, w = torch.randn(5, 4), torch.randn(4, 8)
    gm = _traced(members, x, w)
    before = copy.deepcopy(gm)
    replaced = narrows_as_splits(gm)
    assert len(replaced) == 3
    names = _names(gm)
    assert names.count("split") == 1 and "narrow" not in names
    split = next(n for n in gm.graph.nodes if canonical_name(n) == "split")
    assert split.args[1:] == ([2, 2, 3, 1], 1)  # (the gap is a piece of its own)
    _assert_same(before, gm, x, w)


def test_the_backward_builds_one_gradient_for_the_sliced_tensor() -> None:
    """Without the split, each narrow's backward is a zero tensor the whole product's size."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    def backward_ops(gm: fx.GraphModule, *inputs: torch.Tensor) -> list[str]:
        seen: list[str] = []

        def record(graph: fx.GraphModule, _: object) -> object:
            seen.extend(str(n.target) for n in graph.graph.nodes if n.op == "call_function")
            return make_boxed_func(graph.forward)

        compiled = aot_module_simplified(
            gm, list(inputs), fw_compiler=lambda g, _: make_boxed_func(g.forward), bw_compiler=record
        )
        sum(o.sum() for o in compiled(*inputs)).backward()
        return seen

    x, w = torch.randn(5, 4, requires_grad=True), torch.randn(4, 8, requires_grad=True)
    gm = _traced(members, x, w)
    assert sum("slice_backward" in op for op in backward_ops(gm, x, w)) == 3
    narrows_as_splits(gm)
    ops = backward_ops(gm, x, w)
    assert not any("slice_backward" in op for op in ops)
    assert sum("cat" in op for op in ops) == 1


def overlapping(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.narrow(x, 0, 0, 3), torch.narrow(x, 0, 2, 2)


def one_narrow_per_dim(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.narrow(x, 0, 0, 2), torch.narrow(x, 1, 1, 2)


def read_besides(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Its gradient would be a cat plus the other reader's: Inductor writes the cat out."""
    y = x * 2
    return torch.narrow(y, 0, 0, 2), torch.narrow(y, 0, 2, 2), y.sum(0)


def read_besides_a_permute(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The same through a rearranging view: ``y`` has another reader."""
    y = x * 2
    z = y.t().reshape(4, 4)
    return torch.narrow(z, 0, 0, 2), torch.narrow(z, 0, 2, 2), y.exp()


def across_a_write(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.narrow(x, 0, 0, 2)
    y.add_(1)
    return a, torch.narrow(x, 0, 2, 2)


@pytest.mark.parametrize("fn", [overlapping, one_narrow_per_dim, read_besides, read_besides_a_permute])
def test_narrows_that_cannot_share_a_split_are_left_alone(fn) -> None:
    gm = _traced(fn, torch.randn(4, 4))
    code = gm.code
    assert narrows_as_splits(gm) == []
    assert gm.code == code


@pytest.mark.parametrize(
    "switch",
    [
        (torch._C._set_grad_enabled, (False,), torch._C._set_grad_enabled, (True,)),
        (torch.autograd.grad_mode._enter_inference_mode, (True,), torch.autograd.grad_mode._exit_inference_mode, ()),
        (
            torch.amp.autocast_mode._enter_autocast,
            ("cpu", torch.bfloat16, True, None),
            torch.amp.autocast_mode._exit_autocast,
            (),
        ),
    ],
    ids=["no_grad", "inference_mode", "autocast"],
)
def test_narrows_in_different_modes_are_left_alone(switch) -> None:
    """As Dynamo writes ``torch.no_grad()``, ``torch.inference_mode()`` and ``torch.autocast``:
    a split in grad mode would give the second narrow's reader a tensor that requires grad."""
    enter, enter_args, leave, leave_args = switch
    gm = _traced(one_narrow_per_dim, torch.randn(4, 4))
    second = [n for n in gm.graph.nodes if canonical_name(n) == "narrow"][1]
    second.args = (second.args[0], 0, 2, 2)
    assert len(narrows_as_splits(copy.deepcopy(gm))) == 2  # (without the switch: one split)
    with gm.graph.inserting_before(second):
        entered = gm.graph.call_function(enter, enter_args)
    with gm.graph.inserting_after(second):
        gm.graph.call_function(leave, leave_args or (entered,))
    gm.recompile()
    assert narrows_as_splits(gm) == []


def test_narrows_with_a_write_between_them_are_left_alone() -> None:
    gm = _traced(across_a_write, torch.randn(4, 4), torch.randn(3))
    assert narrows_as_splits(gm) == []


def test_narrows_without_shapes_are_left_alone() -> None:
    gm = fx.symbolic_trace(members)  # (no meta: the dim's size is unknown)
    assert narrows_as_splits(gm) == []


def nested(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    head, tail = torch.narrow(x, 1, 0, 6), torch.narrow(x, 1, 6, 2)
    return torch.narrow(head, 0, 0, 1), torch.narrow(head, 0, 1, 2), tail.exp()


def test_narrows_of_a_narrow_split_the_piece() -> None:
    x = torch.randn(3, 8)
    gm = _traced(nested, x)
    before = copy.deepcopy(gm)
    assert len(narrows_as_splits(gm)) == 4
    assert _names(gm).count("split") == 2 and "narrow" not in _names(gm)
    gm.graph.lint()
    _assert_same(before, gm, x)


class Experts(torch.nn.Module):
    """Four experts on one input, each Linear -> BatchNorm1d -> ReLU -> Linear, concatenated."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.BatchNorm1d(6), torch.nn.ReLU()) for _ in range(4)
        )
        self.heads = torch.nn.ModuleList(torch.nn.Linear(6, 1) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([head(layer(x)) for layer, head in zip(self.layers, self.heads)], 1)


def test_a_batched_training_program_reads_its_members_through_splits() -> None:
    torch.manual_seed(0)
    model, x = Experts(), torch.randn(16, 8)
    reference = copy.deepcopy(model)
    optimized = optimize_graph(fx.symbolic_trace(model), (x,), mode="training", profile="cpu")
    report = optimized.meta["optimus_eqsat"]
    assert report.batched.get("batch-linear") and not report.fell_back
    assert "split" in _names(optimized)
    assert narrows_as_splits(optimized) == []  # (nothing left that one split could read)
    assert sum(n.target is operator.getitem for n in optimized.graph.nodes) >= 4
    for a, b in zip(_values_and_grads(optimized, x), _values_and_grads(reference, x), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)
    for name, buffer in reference.named_buffers():  # (the running statistics, updated alike)
        torch.testing.assert_close(model.get_buffer(name), buffer, rtol=1e-5, atol=1e-6, msg=name)
