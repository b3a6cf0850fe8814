"""Recomputing bool masks in the backward (optimus_eqsat/postgrad/bool_masks.py): which masks
qualify on hand-built joint graphs, and gradients through the backend against eager."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy

from optimus_eqsat.postgrad.bool_masks import RecomputeMasks, recomputable_masks

aten = torch.ops.aten


def _node(graph: torch.fx.Graph, target, args, value: torch.Tensor) -> torch.fx.Node:
    node = graph.call_function(target, args)
    node.meta["val"] = value
    return node


def _placeholder(graph: torch.fx.Graph, name: str, value: torch.Tensor) -> torch.fx.Node:
    node = graph.placeholder(name)
    node.meta["val"] = value
    return node


def _joint_relu_graph(mask_source: str) -> tuple[torch.fx.Graph, torch.fx.Node]:
    """Joint graph of ``out = relu(x) @ w`` with the ReLU's mask computed in the forward from
    ``relu`` (which the weight gradient reads) or from a random tensor (a dropout's)."""
    x, w, g = torch.randn(4, 3), torch.randn(3, 2), torch.randn(4, 2)
    graph = torch.fx.Graph()
    px, pw, tangent = (
        _placeholder(graph, "primals_1", x),
        _placeholder(graph, "primals_2", w),
        _placeholder(graph, "tangents_1", g),
    )
    relu = _node(graph, aten.relu.default, (px,), x.relu())
    out = _node(graph, aten.mm.default, (relu, pw), x.relu() @ w)
    source = relu if mask_source == "relu" else _node(graph, aten.rand_like.default, (px,), torch.rand(4, 3))
    mask = _node(graph, aten.le.Scalar, (source, 0), x <= 0)
    relu_t = _node(graph, aten.t.default, (relu,), x.relu().t())
    grad_w = _node(graph, aten.mm.default, (relu_t, tangent), x.relu().t() @ g)
    grad_relu = _node(graph, aten.mm.default, (tangent, _node(graph, aten.t.default, (pw,), w.t())), g @ w.t())
    grad_x = _node(graph, aten.where.self, (mask, 0.0, grad_relu), grad_relu.meta["val"])
    graph.output((out, grad_x, grad_w))
    return graph, mask


def test_mask_of_a_tensor_the_backward_reads_is_recomputed():
    graph, mask = _joint_relu_graph("relu")
    sliced: list[torch.fx.Node] = []
    assert recomputable_masks(graph, sliced) == [mask] and sliced == []
    counts, sliced_counts = [], []
    masks = RecomputeMasks()
    masks.sinks, masks.sliced_sinks = [counts], [sliced_counts]
    masks(graph)
    assert mask.meta["recompute"] == CheckpointPolicy.MUST_RECOMPUTE
    assert counts == [1] and sliced_counts == [0]


def test_mask_of_random_numbers_stays_saved():
    graph, _ = _joint_relu_graph("random")
    assert recomputable_masks(graph) == []


def test_mask_of_a_piece_of_a_saved_cat_reads_the_cat():
    """Experts concatenated for a gate: the piece's mask is recomputed from the cat's slice."""
    a, b, g = torch.randn(4, 3), torch.randn(4, 2), torch.randn(4, 5)
    graph = torch.fx.Graph()
    pa, pb, tangent = (
        _placeholder(graph, "primals_1", a),
        _placeholder(graph, "primals_2", b),
        _placeholder(graph, "tangents_1", g),
    )
    ra = _node(graph, aten.relu.default, (pa,), a.relu())
    rb = _node(graph, aten.relu.default, (pb,), b.relu())
    cat = _node(graph, aten.cat.default, ([ra, rb], 1), torch.cat([a.relu(), b.relu()], 1))
    out = _node(graph, aten.mul.Tensor, (cat, cat), cat.meta["val"] ** 2)
    grad_cat = _node(graph, aten.mul.Tensor, (tangent, cat), g * cat.meta["val"])  # reads the cat
    grad_b = _node(graph, aten.slice.Tensor, (grad_cat, 1, 3, 5), g[:, 3:])
    mask = _node(graph, aten.le.Scalar, (rb, 0), b <= 0)
    grad_pb = _node(graph, aten.where.self, (mask, 0.0, grad_b), grad_b.meta["val"])
    graph.output((out, grad_pb))
    sliced: list[torch.fx.Node] = []
    assert recomputable_masks(graph, sliced) == [mask] and sliced == [mask]  # (the one kind that is timed)
    piece = mask.args[0]
    assert piece.target is aten.slice.Tensor and piece.args == (cat, 1, 3, 5)
    graph.lint()


def test_graph_without_tangents_is_left_alone():
    x = torch.randn(4)
    graph = torch.fx.Graph()
    px = _placeholder(graph, "primals_1", x)
    graph.output((_node(graph, aten.le.Scalar, (px, 0), x <= 0),))
    assert recomputable_masks(graph) == []


class _Experts(nn.Module):
    """ReLU experts concatenated and gated (the masks of mmoe's experts)."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.ReLU()) for _ in range(3)
        )
        self.gate = nn.Linear(8, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stacked = torch.cat([e(x) for e in self.experts], 1)
        return (stacked * torch.sigmoid(self.gate(x))).sum(1)


def test_backend_gradients_match_eager_withmasks_recomputed():
    from optimus_eqsat.backend import make_backend

    torch.manual_seed(0)
    model = _Experts()
    reference = copy.deepcopy(model)
    backend = make_backend(pre_grad=False, post_grad=False, measure=False)
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(32, 8)
    with torch._inductor.config.patch(force_disable_caches=True):  # a cached program skips the pass
        compiled(x).sum().backward()
    reference(x).sum().backward()
    assert backend.reports[0].recomputed_masks >= 6  # both ReLUs of every expert
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_unseen_joint_graph_counts_as_recomputed():
    from optimus_eqsat.compile_plan import masks_recomputed

    assert masks_recomputed([], training=True)  # a cache served it: may hold recomputed masks
    assert not masks_recomputed([0], training=True)
    assert masks_recomputed([0, 3], training=True)
    assert not masks_recomputed([], training=False)  # inference has no joint graph


def test_dynamic_batch_and_symbolic_cat_are_safe():
    """A cat along a symbolic dimension is never sliced; gradients stay exact."""
    from optimus_eqsat.backend import make_backend

    class CatOnBatch(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            both = torch.cat([self.a(x).relu(), self.b(y).relu()], 0)
            return (both * both).sum()

    torch.manual_seed(0)
    model = CatOnBatch()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend=make_backend(pre_grad=False, post_grad=False, measure=False), dynamic=True)
    for rows in (5, 9):
        x, y = torch.randn(rows, 8), torch.randn(rows + 1, 8)
        model.zero_grad(), reference.zero_grad()
        with torch._inductor.config.patch(force_disable_caches=True):
            compiled(x, y).backward()
        reference(x, y).backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad)


def test_rewritten_training_graph_is_measured_against_the_original_with_masks_alone():
    """Pre-grad rewrites and recomputed masks: the original graph with only the masks is the
    baseline the rewritten one is timed against (the rewrites can cost memory the masks do
    not), and the original itself is never compiled; whichever is kept, the gradients are
    eager's."""
    from optimus_eqsat.backend import make_backend

    torch._dynamo.reset()  # (another batch size of the same code would make it dynamic: no third candidate)
    torch.manual_seed(0)
    model = _Experts().train()
    reference = copy.deepcopy(model)
    backend = make_backend(measure_budget_s=0.05)
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(64, 8)
    with torch._inductor.config.patch(force_disable_caches=True):
        compiled(x).sum().backward()
    reference(x).sum().backward()
    report = backend.reports[0]
    # (changed is False when the measurement keeps another candidate: the pre-grad rewrite shows
    # in the launches)
    assert report.launches_after < report.launches_before and report.recomputed_masks > 0
    assert report.measured is not None
    # ours against the masks alone, and no compile of the original
    measured = report.measured
    assert set(measured.step_s) == {"masked", "optimized"}
    assert set(measured.compile_s) == {"masked"}, measured.compile_s
    assert measured.kept in ("masked", "optimized")
    assert report.fell_back == (measured.kept == "masked")
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_a_random_bool_op_is_never_recomputed():
    """A mask drawn at random (here bernoulli writing bool) must keep its draw."""
    x, g = torch.rand(4, 3), torch.randn(4, 3)
    graph = torch.fx.Graph()
    px, tangent = _placeholder(graph, "primals_1", x), _placeholder(graph, "tangents_1", g)
    drawn = _node(graph, aten.bernoulli.default, (px,), x > 0.5)  # bool-valued meta: the op is random
    out = _node(graph, aten.mul.Tensor, (px, drawn), x)
    grad = _node(graph, aten.mul.Tensor, (tangent, drawn), g)
    graph.output((out, grad))
    assert recomputable_masks(graph) == []


def test_mask_of_a_piece_of_a_cat_built_from_the_mask_keeps_its_source():
    """A cat computed from the mask itself cannot be read to compute the mask (a cycle): the
    mask keeps reading its piece (experts with batch norm and dropout made one)."""
    a, b, g = torch.randn(4, 3), torch.randn(4, 3), torch.randn(4, 6)
    graph = torch.fx.Graph()
    pa, pb, tangent = (
        _placeholder(graph, "primals_1", a),
        _placeholder(graph, "primals_2", b),
        _placeholder(graph, "tangents_1", g),
    )
    ra = _node(graph, aten.relu.default, (pa,), a.relu())
    mask = _node(graph, aten.le.Scalar, (ra, 0), a <= 0)
    masked = _node(graph, aten.where.self, (mask, 0.0, pb), torch.where(a <= 0, 0.0, b))
    cat = _node(graph, aten.cat.default, ([ra, masked], 1), torch.cat([a.relu(), masked.meta["val"]], 1))
    out = _node(graph, aten.mul.Tensor, (cat, cat), cat.meta["val"] ** 2)
    grad_cat = _node(graph, aten.mul.Tensor, (tangent, cat), g * cat.meta["val"])
    grad_a = _node(graph, aten.slice.Tensor, (grad_cat, 1, 0, 3), g[:, :3])
    grad_pa = _node(graph, aten.where.self, (mask, 0.0, grad_a), grad_a.meta["val"])
    graph.output((out, grad_pa))
    assert recomputable_masks(graph) == []
    assert mask.args[0] is ra
    graph.lint()


def test_a_cat_holding_a_piece_twice_is_never_sliced_for_a_mask():
    """A mask of a piece a cat holds twice is left saved: recomputed from a slice of that
    cat, Inductor (torch 2.13) wrote the forward's stack wrongly (3.6 off in one slot; found by
    the compiled fuzzer, gated-19). Compiled with the pass against eager."""

    def f(x: torch.Tensor) -> torch.Tensor:
        v = x.view(1, 4)
        b = torch.cat([v, torch.cat([v, v], 1)], 1)
        t = torch.tanh(b)
        return torch.stack([b, t, torch.minimum(t, b), t])

    x0 = torch.randn(4, generator=torch.Generator().manual_seed(0))
    upstream = torch.randn(4, 1, 12, generator=torch.Generator().manual_seed(1))

    def run(fn):
        x = x0.clone().requires_grad_()
        out = fn(x)
        out.backward(upstream)
        return out.detach(), x.grad

    torch._dynamo.reset()
    recompute = RecomputeMasks()
    with torch._inductor.config.patch(joint_custom_post_pass=recompute, force_disable_caches=True):
        got = run(torch.compile(f, backend="inductor"))
    for a, e in zip(got, run(f)):
        torch.testing.assert_close(a, e)
