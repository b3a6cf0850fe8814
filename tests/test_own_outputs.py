"""Training outputs that slice a batched result are copied out; views the user wrote stay views."""

from __future__ import annotations

import torch
import torch.fx as fx

from optimus_eqsat import optimize_graph
from optimus_eqsat.own_outputs import input_views_as_written, own_sliced_outputs


def _trace(fn) -> fx.GraphModule:
    return fx.symbolic_trace(fn)


def test_slices_of_a_computed_tensor_are_copied_where_the_original_had_no_view():
    original = _trace(lambda x: (x.sigmoid() * 2, x.tanh(), x[1:]))
    optimized = _trace(lambda x: (torch.narrow(x.sigmoid() * 2, 0, 0, 4), x.tanh().split(2)[0], x[1:]))
    x = torch.randn(4, 3)
    want = optimized(x)
    copied = own_sliced_outputs(original, optimized)
    assert len(copied) == 2  # narrow and the split piece; x[1:] is a view of the input
    outputs = optimized.graph.output_node().args[0]
    assert [o.target is torch.clone for o in outputs] == [True, True, False]
    for got, expected in zip(optimized(x), want):
        torch.testing.assert_close(got, expected)
    assert optimized(x)[0]._base is None  # owns its memory


def test_a_view_the_original_returned_stays_a_view():
    original = _trace(lambda x: x.sigmoid()[1:])
    optimized = _trace(lambda x: torch.narrow(x.sigmoid(), 0, 1, 3))
    assert own_sliced_outputs(original, optimized) == []


class TaskTowers(torch.nn.Module):
    """One output per task from parallel towers on one input (batched into one program)."""

    def __init__(self, tasks: int = 4, width: int = 16):
        super().__init__()
        self.towers = torch.nn.ModuleList(torch.nn.Linear(width, 1) for _ in range(tasks))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.sigmoid(tower(torch.relu(x))) for tower in self.towers)


def test_training_graph_of_batched_towers_returns_copies_with_eager_gradients():
    model = TaskTowers()
    x = torch.randn(6, 16)
    gm = fx.symbolic_trace(model)
    optimized = optimize_graph(gm, (x,), mode="training", profile="h100", raise_on_error=True)
    report = optimized.meta["optimus_eqsat"]
    assert report.changed and report.mode == "training"
    out = optimized(x)
    outs = out if isinstance(out, (tuple, list)) else [out]
    assert all(o._base is None for o in outs)
    sum(o.sum() for o in outs).backward()
    got = {name: p.grad.clone() for name, p in optimized.named_parameters()}
    model.zero_grad()
    ref = model(x)
    sum(o.sum() for o in (ref if isinstance(ref, (tuple, list)) else [ref])).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(got[name], p.grad, rtol=1e-4, atol=1e-5)


def test_an_output_the_original_returned_contiguous_stays_contiguous():
    """A column of a batched result has the right values in another layout: the optimized
    program hands it back contiguous, as the original did (a caller's ``view`` or
    ``randn_like`` reads the layout); where meta and example inputs are missing nothing changes."""
    from optimus_eqsat.inductor_count import capture_dynamo_graph
    from optimus_eqsat.own_outputs import contiguous_outputs

    x = torch.randn(4, 3)
    original, _ = capture_dynamo_graph(lambda t: (t * 2.0, t.t()), (x,))
    optimized, _ = capture_dynamo_graph(lambda t: (torch.stack([t * 2.0, t], -1)[..., 0], t.t()), (x,))
    assert not optimized(x)[0].is_contiguous()
    assert len(contiguous_outputs(original, optimized)) == 1
    out = optimized(x)
    assert out[0].is_contiguous() and not out[1].is_contiguous()  # (the original's view stays one)
    torch.testing.assert_close(out[0], x * 2.0)
    assert contiguous_outputs(_trace(lambda t: t * 2.0), _trace(lambda t: torch.stack([t * 2.0, t], -1)[..., 0])) == []


def test_a_traced_graph_without_meta_keeps_its_outputs_contiguous():
    """``stack(x.unbind(0), dim=2)`` is ``x.permute(1, 2, 0)`` in values, a view in another
    layout: a ``symbolic_trace`` graph carries no meta, so the layouts are read from the
    example inputs (the optimized program returned the permuted layout, and ``view`` failed)."""
    gm = _trace(lambda x: torch.stack(x.unbind(0), dim=2) * 2.0)
    x = torch.randn(4, 3, 5)
    optimized = optimize_graph(gm, (x,), raise_on_error=True, never_worse=False)
    assert any(n.target is torch.permute for n in optimized.graph.nodes)  # the rewrite happened
    out = optimized(x)
    assert out.is_contiguous()
    torch.testing.assert_close(out.view(-1), gm(x).view(-1))


def test_an_output_under_a_dynamic_batch_keeps_its_contiguous_layout():
    """With a symbolic batch the layouts hold symbolic strides: the original's output is
    surely contiguous (row-major whatever the batch), the optimized permute surely not, and
    it is made contiguous (it was not: ``is_contiguous`` of symbolic meta was taken for
    unknown)."""
    from optimus_eqsat.backend import make_backend

    class StackOfRows(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(5, 5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.stack(self.linear(x).unbind(0), dim=2) * 2.0

    torch._dynamo.reset()
    model = StackOfRows()
    backend = make_backend(measure=False, inductor=False, raise_on_error=True, never_worse=False)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    for batch in (4, 6):
        x = torch.randn(batch, 3, 5)
        out = compiled(x)
        assert out.is_contiguous(), out.stride()
        torch.testing.assert_close(out.view(-1), model(x).view(-1))
    assert backend.reports[0].changed


def test_shape_prop_meta_copied_onto_a_rewritten_output_is_not_read_for_its_layout():
    """A graph with ShapeProp's ``tensor_meta``: its layouts are the original's truth, but the
    rebuild gives a new output node the meta of the original node of its value, strides
    included, though it computes them in another layout (seen: a permute of a batched result,
    fuzz meta-613). Only meta propagated over the optimized graph, or a run of it, tells."""
    from torch.fx.passes.shape_prop import ShapeProp

    from optimus_eqsat.own_outputs import contiguous_outputs

    x = torch.randn(4, 3)
    for example_inputs in ((x,), None):
        original = _trace(lambda t: (t * 2.0).t().contiguous())
        ShapeProp(original).propagate(x)
        optimized = _trace(lambda t: (t * 2.0).t())
        optimized.graph.output_node().args[0].meta = dict(original.graph.output_node().args[0].meta)
        assert len(contiguous_outputs(original, optimized, example_inputs)) == 1
        assert optimized(x).is_contiguous()
        torch.testing.assert_close(optimized(x), original(x))


def test_an_output_the_original_returned_as_a_view_of_an_input_stays_one():
    # The original hands on a piece of a transposed input (a graph cut by a graph break passes
    # it to the next piece); a rewrite computing the same values as a reshape of a permute
    # copies, so the output no longer aliases the input. The original's views come back.
    def original(x):
        piece = x.transpose(-2, 1).unbind(0)[1].split(2, dim=2)[0]
        return piece.abs().sum(), piece, piece[:, :, 1:2]

    def optimized(x):
        rows = torch.reshape(torch.permute(x, [0, 2, 1, 3]), [6, 3, 4])
        piece = torch.narrow(torch.narrow(rows, 0, 3, 3), 2, 0, 2)
        return piece.abs().sum(), piece, torch.narrow(piece, 2, 1, 1)

    before, after = _trace(original), _trace(optimized)
    x = torch.randn(2, 3, 3, 4)
    for got, want in zip(after(x), before(x)):
        torch.testing.assert_close(got, want)
    assert not any(o.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for o in after(x)[1:])
    assert len(input_views_as_written(before, after)) == 2
    outs = after(x)
    for got, want in zip(outs, before(x)):
        torch.testing.assert_close(got, want)
    assert all(o.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for o in outs[1:])
    assert input_views_as_written(before, after) == []  # views of that input already: left alone
