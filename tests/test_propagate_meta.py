"""propagate_meta: the fast path gives what FakeTensorProp gives, or falls back to it."""

from __future__ import annotations

import pytest
import torch
import torch.fx
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from optimus_eqsat import optimize_graph
from optimus_eqsat import rebuild as rebuild_module
from optimus_eqsat.rebuild import propagate_meta


def _describe(v):
    if isinstance(v, torch.Tensor):
        return (
            "tensor",
            tuple(v.shape),
            v.stride(),
            v.storage_offset(),
            v.dtype,
            v.device,
            v.requires_grad,
            type(v).__name__,
        )
    if isinstance(v, (tuple, list)):
        return tuple(_describe(x) for x in v)
    return v


def _snapshot(gm, placeholder_grad=True):
    """Each node's value, described. ``placeholder_grad=False``: leave out placeholders'
    requires_grad (a Dynamo graph's placeholders keep their own values, parameters
    requiring grad; FakeTensorProp's fresh inputs do not)."""
    out = {}
    for n in gm.graph.nodes:
        d = _describe(n.meta.get("val"))
        if n.op == "placeholder" and not placeholder_grad and isinstance(d, tuple) and d[0] == "tensor":
            d = d[:6] + d[7:]
        out[n.name] = d
    return out


def _save(gm):
    return {n: dict(n.meta) for n in gm.graph.nodes}


def _restore(gm, saved):
    for n in gm.graph.nodes:
        n.meta.clear()
        n.meta.update(saved[n])


def _reference(gm, inputs):
    """FakeTensorProp's meta (a fresh mode, inputs as fresh fakes), meta restored after."""
    saved = _save(gm)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        fakes = [
            torch.empty_strided(tuple(x.shape), x.stride(), dtype=x.dtype, device=x.device)
            if isinstance(x, torch.Tensor)
            else x
            for x in inputs
        ]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    ref = _snapshot(gm), _snapshot(gm, placeholder_grad=False)
    _restore(gm, saved)
    return ref


def _no_fallback(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the fast path fell back to FakeTensorProp")

    monkeypatch.setattr(rebuild_module, "_fake_tensor_prop", fail)


def _check_one_mode(gm):
    modes = {n.meta["val"].fake_mode for n in gm.graph.nodes if isinstance(n.meta.get("val"), FakeTensor)}
    assert len(modes) == 1


def _dynamo_graph(model, *inputs, grad=False):
    captured = []

    def capture(gm, example_inputs):
        captured.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.set_grad_enabled(grad):
        torch.compile(model, backend=capture, fullgraph=True)(*inputs)
    torch._dynamo.reset()
    return captured[0]


class Views(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6)
        self.register_buffer("table", torch.randn(4, 6))

    def forward(self, x, y):
        a = torch.narrow(x, 1, 2, 6)  # offset view
        b = torch.reshape(a, (2, 4, 6))
        c = torch.permute(b, (2, 0, 1))  # non-contiguous
        d = torch.reshape(c, (6, 8))  # copies
        e = c.expand(3, 6, 2, 4)
        parts = torch.split(x, [3, 5], dim=1)
        f = parts[1][:, None, 1:4]
        g = x.t().contiguous().view(-1)
        h = torch.cat([parts[0], a, y], dim=1)
        i, j = torch.chunk(h, 2, dim=0)
        k = torch.unbind(y, dim=1)
        n = x.size(0) * x.shape[1]
        m = self.proj(b) + self.table[1:3].unsqueeze(1).flatten(0, 1)[0]
        return d.sum() + e.mean() + f.sum() + g.sum() + i.sum() + j.sum() + k[1].sum() + n, m, c


def test_views_match_fake_tensor_prop(monkeypatch):
    gm = torch.fx.symbolic_trace(Views())
    inputs = (torch.randn(8, 8), torch.randn(6, 8).t())  # a transposed (strided) input
    ref = _reference(gm, inputs)
    _no_fallback(monkeypatch)
    assert propagate_meta(gm, inputs)
    assert _snapshot(gm) == ref[0]
    _check_one_mode(gm)
    assert not any("example_value" in n.meta for n in gm.graph.nodes)  # not a Dynamo graph


@pytest.mark.parametrize("grad", [False, True])
def test_dynamo_graph_matches_and_gets_example_value(monkeypatch, grad):
    model = Views().eval()
    inputs = (torch.randn(8, 8), torch.randn(8, 6))
    gm, example_inputs = _dynamo_graph(model, *inputs, grad=grad)
    with torch.set_grad_enabled(grad):
        ref = _reference(gm, example_inputs)
    original = _save(gm)
    _no_fallback(monkeypatch)
    for given in (None, example_inputs):  # the placeholders' meta, or the real inputs
        _restore(gm, original)
        with torch.set_grad_enabled(grad):
            assert propagate_meta(gm, given)
        assert _snapshot(gm, placeholder_grad=False) == ref[1]
        _check_one_mode(gm)
        for n in gm.graph.nodes:
            if "val" in n.meta:
                assert n.meta["example_value"] is n.meta["val"]
            if n.op == "placeholder":  # Dynamo's own fake values, in Dynamo's mode
                assert n.meta["val"] is original[n]["example_value"]


def test_optimized_dynamo_graph_matches():
    from benchmarks.zoo.dynamic_schema import DynamicSchema

    model = DynamicSchema(num_features=6).eval()
    inputs = (torch.randn(8, sum(model.widths)), torch.randn(8, 8, 8))
    gm, example_inputs = _dynamo_graph(model, *inputs)
    out = optimize_graph(gm, profile="h100", never_worse=False)  # a rebuilt graph, not a fallback copy
    ref = _reference(out, example_inputs)
    assert _snapshot(out, placeholder_grad=False) == ref[1]  # optimize_graph ran propagate_meta already
    _check_one_mode(out)
    assert all("example_value" in n.meta for n in out.graph.nodes if n.op != "output")
    assert all(n.meta["example_value"] is n.meta["val"] for n in out.graph.nodes if "val" in n.meta)


def test_fallback_when_fast_path_fails(monkeypatch):
    gm = torch.fx.symbolic_trace(Views())
    inputs = (torch.randn(8, 8), torch.randn(8, 6))
    ref = _reference(gm, inputs)

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(rebuild_module, "_fast_meta", broken)
    assert propagate_meta(gm, inputs)
    assert _snapshot(gm) == ref[0]


def test_in_place_metadata_change_uses_fake_tensor_prop():
    def f(x):
        y = x.clone()
        y.unsqueeze_(0)
        return y.narrow(1, 0, 2)

    gm = torch.fx.symbolic_trace(f)
    inputs = (torch.randn(4, 3),)
    ref = _reference(gm, inputs)
    assert propagate_meta(gm, inputs)
    assert _snapshot(gm) == ref[0]


@pytest.mark.parametrize("fast", [True, False])
def test_unpropagatable_graph_returns_false_and_leaves_meta(monkeypatch, fast):
    def f(x, w):
        y = x.reshape(2, 6)
        return torch.matmul(y, w)  # (2, 6) @ (5, 3): shapes do not fit

    gm = torch.fx.symbolic_trace(f)
    marker = object()
    for n in gm.graph.nodes:
        n.meta["val"] = marker
    if not fast:
        monkeypatch.setattr(rebuild_module, "_fast_meta", lambda *a: None)
    assert not propagate_meta(gm, (torch.randn(3, 4), torch.randn(5, 3)))
    assert all(n.meta["val"] is marker and set(n.meta) == {"val"} for n in gm.graph.nodes)


def test_missing_or_symbolic_inputs_return_false():
    gm = torch.fx.symbolic_trace(lambda x: x.reshape(-1))
    assert not propagate_meta(gm)  # no example inputs, no placeholder meta
    assert not propagate_meta(gm, ())  # wrong count


class Params(nn.Module):
    """Views of a parameter (get_attr) and of an op on it: values need no grad."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 6))

    def forward(self, x):
        a = self.w.narrow(0, 1, 2)
        b = (self.w * 2).reshape(6, 4).permute(1, 0)
        c, d = torch.split(self.w + x, [2, 2])
        return a, b, c.t(), d[None]


@pytest.mark.parametrize("grad", [True, False])
def test_parameter_views_match(monkeypatch, grad):
    gm = torch.fx.symbolic_trace(Params())
    inputs = (torch.randn(4, 6),)
    with torch.set_grad_enabled(grad):
        ref = _reference(gm, inputs)
        _no_fallback(monkeypatch)
        assert propagate_meta(gm, inputs)
    assert _snapshot(gm) == ref[0]
    _check_one_mode(gm)
