"""The DDPOptimizer hook that hands our backend Dynamo's whole graph (optimus_eqsat/ddp_whole_graph.py).

These run DDPOptimizer's ``compile_fn`` in one process without a process group; the two-rank
runs under DDP (buckets cut, training equal to eager) are in test_distributed.py.
"""

from __future__ import annotations

import torch
from torch._dynamo.backends.distributed import DDPOptimizer
from torch._dynamo.repro.after_dynamo import WrapBackendDebug

import optimus_eqsat.backend  # noqa: F401  (installs the hook)
from optimus_eqsat.ddp_whole_graph import Piece, current_piece, install, piece_count, piece_mode, sink_input_work


def _graph() -> torch.fx.GraphModule:
    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1)
    for node in gm.graph.find_nodes(op="placeholder"):
        node.meta["example_value"] = torch.randn(2)  # (DDPOptimizer reads Dynamo's meta)
    return gm


def _ddp_optimizer(backend) -> DDPOptimizer:
    return DDPOptimizer(bucket_bytes_cap=25 * 2**20, backend_compile_fn=backend, first_bucket_cap=2**20)


def test_hook_is_installed_once_and_other_backends_go_through_untouched():
    assert install() and install()  # idempotent
    assert getattr(DDPOptimizer.compile_fn, "_optimus_eqsat_wrapped", False)
    seen = []

    def theirs(gm, example_inputs):
        seen.append(gm)
        return gm

    gm = _graph()
    assert _ddp_optimizer(theirs).compile_fn(gm, [torch.randn(2)]) is gm and seen == [gm]


def test_our_backend_gets_the_whole_graph_through_dynamos_wrappers_with_its_mode_and_options():
    calls = []

    def ours(gm, example_inputs, **kwargs):
        return gm

    def whole(split, gm, example_inputs, **kwargs):
        calls.append(kwargs)
        with piece_mode(Piece.OPTIMIZED):
            return split(gm)  # one bucket: DDPOptimizer hands the graph to the backend as it is

    ours.whole_ddp_graph = whole
    wrapper = torch._TorchCompileWrapper("inductor", None, {"measure": False}, None)
    wrapper.compiler_fn = ours  # as torch.compile(backend="optimus_eqsat", options=...) makes it
    gm = _graph()
    assert _ddp_optimizer(WrapBackendDebug(wrapper, "optimus_eqsat")).compile_fn(gm, [torch.randn(2)]) is gm
    assert calls == [{"buckets": (2**20, 25 * 2**20), "options": {"measure": False}}]


def test_piece_mode_is_scoped_and_pieces_are_counted():
    assert current_piece() is None
    with piece_mode(Piece.ORIGINAL):
        assert current_piece() is Piece.ORIGINAL
    assert current_piece() is None
    assert piece_count(lambda *args: args) == 1  # one bucket: the backend's own program
    split = torch.fx.passes.split_module.split_module(_graph(), None, lambda node: 0 if node.name == "relu" else 1)
    assert piece_count(split) == 2


def test_weight_stacks_move_next_to_their_layers_so_buckets_can_close_between_them():
    """A batched program stacks its weights at the top; DDPOptimizer counts a parameter at the
    node that reads it, so each stack moves to just before its first user (and the program is
    the same)."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    weights = [graph.placeholder(f"w{i}") for i in range(4)]
    for w in weights:
        w.meta["example_value"] = torch.nn.Parameter(torch.randn(3, 3))
    x.meta["example_value"] = torch.randn(2, 3)
    first = graph.call_function(torch.cat, ([weights[0], weights[1]],))
    second = graph.call_function(torch.cat, ([weights[2], weights[3]],))
    second_t = graph.call_function(torch.neg, (second,))  # a chain of parameter work moves whole
    x_only = graph.call_function(torch.relu, (x,))  # reads a non-parameter input: stays
    h = graph.call_function(torch.matmul, (x_only, torch.fx.Proxy(first).t().node))
    out = graph.call_function(torch.matmul, (h, second_t))
    graph.output(out)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    args = [torch.randn(2, 3), *(w.meta["example_value"].detach() for w in weights)]
    want = gm(*args)
    order = [n.name for n in sink_input_work(gm).graph.nodes if n.op == "call_function" or n.op == "call_method"]
    assert order == ["relu", "cat", "t", "matmul", "cat_1", "neg", "matmul_1"], order
    assert torch.equal(gm(*args), want)


def _experts_graph() -> tuple[torch.fx.GraphModule, list]:
    from optimus_eqsat.inductor_count import capture_dynamo_graph

    experts = torch.nn.ModuleList(torch.nn.Linear(16, 32) for _ in range(4))
    return capture_dynamo_graph(lambda x: torch.cat([e(x).relu() for e in experts], 1), (torch.randn(8, 16),))


def test_the_backend_cuts_its_optimized_program_and_falls_back_to_the_original_when_the_cut_fails():
    from optimus_eqsat.backend import make_backend

    backend = make_backend(measure=False, persistent_cache=False)
    gm, example_inputs = _experts_graph()
    cuts = []

    def split(graph):
        cuts.append((current_piece(), len(graph.graph.find_nodes(op="call_function", target=torch._C._nn.linear))))
        return lambda *args: graph(*args)  # (one bucket: the backend's own program)

    backend.whole_ddp_graph(split, gm, example_inputs)
    assert cuts == [(Piece.OPTIMIZED, 1)], cuts  # four linears batched into one, then cut
    assert backend.reports[-1].ddp_pieces == (None, 1)

    def failing_split(graph):
        if not cuts:
            cuts.append("failed")
            raise RuntimeError("cannot cut")
        return split(graph)

    cuts.clear()
    backend.whole_ddp_graph(failing_split, gm, example_inputs)
    assert cuts == ["failed", (Piece.UNCHANGED, 4)], cuts  # the original, each piece with our post-grad passes
    assert backend.reports[-1].fell_back and "cannot cut" in backend.reports[-1].fallback_reason


def test_a_backend_made_by_hand_takes_the_mode_of_torch_compile_under_ddp():
    """``torch.compile(DDP(model), backend=make_backend(...), mode=...)``: the whole-graph hook
    passes the mode as the string backend's wrapper does; the backend compiles with a variant
    holding its options and the mode's (a TypeError inside the user's compile before)."""
    from optimus_eqsat.backend import make_backend

    made = make_backend(measure=False, pre_grad=False)  # (pre_grad off: DDPOptimizer cuts as it is)
    wrapper = torch._TorchCompileWrapper(made, "max-autotune-no-cudagraphs", None, None)
    gm = _graph()
    compiled = _ddp_optimizer(WrapBackendDebug(wrapper, "optimus_eqsat")).compile_fn(gm, [torch.randn(2)])
    assert compiled is not None
    (variant,) = made._variants.values()
    assert variant.own.inductor_config.get("max_autotune") is True and not variant.own.pre_grad
